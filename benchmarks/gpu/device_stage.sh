#!/usr/bin/env bash
# Remote GPU machine, call 1 (carry .device/part1): stage the first model chunk and the wheels in
# /tmp, install the wheels into /tmp/site and run a ~10 s smoke check (imports, derived drafts on
# a tiny model on the GPU). Must be followed within the warm window (30 s) by device_run.sh.
# Usage: bash benchmarks/gpu/device_stage.sh [--device cuda] [--dtype bfloat16]
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/payload_lib.sh
[ -n "${OUT:-}" ] && mkdir -p "$OUT"
stage_carried
if install_wheels; then
  specdec_env
  python3 benchmarks/gpu/smoke.py "$@" 2>&1 | grep -v "_pytree.py" | tee ${OUT:+"$OUT/smoke.log"}
  rc=${PIPESTATUS[0]}
  echo "$(ts) stage done (smoke rc=$rc)"
else
  echo "$(ts) stage done (wheels not installed yet)"
fi
