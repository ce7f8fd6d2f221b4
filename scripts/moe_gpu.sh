#!/usr/bin/env bash
# moe_gpu.sh OUT [LAB_ARGS...]: the quantized-MoE session on the GPU machine (issue 11) in one
# command, every log under OUT (the most important first: a run cut off at its limit keeps them):
#   1. build with CUDA (cJSON/cmocka unpacked from .devdeb/ when missing, as scripts/cuda_check.sh)
#      and, on the CPU meanwhile, the 26B-A4B random checkpoint (dgemma mkrandom, 4-bit g64 experts)
#   2. the kernel lab dev/cuda/moe_quant.cu: every version checked and timed (OUT/lab.md, lab.jsonl)
#   3. dgemma bench --device cuda --protocol ceiling, then scripts/torch_anchors.py at the same shapes
#   4. dgemma bench --device cuda --protocol vllm on the checkpoint
#   5. scripts/cuda_check.sh (the smoke and tests/test_cuda)
# Carry .devdeb and .devdata (the Gemma tokenizer gzipped: .devdata/gemma3/tokenizer.json.gz).
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/moe_gpu.sh OUT [LAB_ARGS...]}
shift
mkdir -p "$OUT" .cache/gemma3
[ -f .cache/gemma3/tokenizer.json ] || gunzip -c .devdata/gemma3/tokenizer.json.gz > .cache/gemma3/tokenizer.json
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
t0=$(date +%s)
el() { echo "($(( $(date +%s) - t0 )) s)"; }
XC=""; XL=""
if ! echo '#include <cjson/cJSON.h>' | cc -E -x c - >/dev/null 2>&1; then
  P=/tmp/dgdeps; for f in .devdeb/*.deb; do dpkg -x "$f" $P; done; L=$P/usr/lib/x86_64-linux-gnu
  XC="-I$P/usr/include"; XL="-L$L -Wl,-rpath,$L"
fi
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" all build/tests/test_cuda build/tests/test_bench > "$OUT/build.log" 2>&1 \
  || { echo "build failed"; tail -30 "$OUT/build.log"; exit 1; }
echo "== built $(el)"
(build/dgemma mkrandom /tmp/dg26b --source .cache/gemma3 -t 12 > "$OUT/mkrandom.log" 2>&1; echo "mkrandom rc $?" >> "$OUT/mkrandom.log") &
mk=$!
CUL=$(dirname "$(readlink -f "$(command -v nvcc)")")/../lib64
nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iinclude -Isrc $XC dev/cuda/moe_quant.cu build/libdgemma.a \
  -L"$CUL" $XL -lcublas -lcudart -lcjson -lgomp -o build/moe_quant 2>&1 | tail -5
nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iinclude -Isrc -Xptxas -v -c src/cuda/qmoe_b4.cu -o /tmp/q4.o > "$OUT/ptxas_b4.txt" 2>&1
echo "== lab $(el)"
timeout 200 build/moe_quant --json "$OUT/lab.jsonl" "$@" > "$OUT/lab.md" 2>&1; echo "lab rc $?"
grep -E "ceilings|check:" "$OUT/lab.md"
echo "== ceiling protocol $(el)"
timeout 120 build/dgemma bench --device cuda --protocol ceiling --reps 20 -o "$OUT/ceiling_cuda.jsonl" > "$OUT/ceiling_cuda.md" 2>&1; echo "ceiling rc $?"
echo "== torch anchors $(el)"
PYTHONUNBUFFERED=1 timeout 120 python3 scripts/torch_anchors.py --ceilings "$OUT/ceiling_cuda.jsonl" -o "$OUT/torch_anchors.jsonl" > "$OUT/torch_anchors.md" 2>&1; echo "torch rc $?"
wait $mk; tail -2 "$OUT/mkrandom.log"
echo "== bench vllm $(el)"
timeout 200 build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm -o "$OUT/bench_vllm.jsonl" > "$OUT/bench_vllm.txt" 2>&1
echo "bench rc $?"; tail -6 "$OUT/bench_vllm.txt"
echo "== cuda_check $(el)"
timeout 240 scripts/cuda_check.sh "$OUT/check" > "$OUT/check.log" 2>&1; echo "cuda_check rc $?"
grep -E "^\[  (FAILED|PASSED|  OK) |verdict|cuda_check:" "$OUT/check.log" | tail -30
echo "== done $(el)"
