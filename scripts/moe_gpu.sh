#!/usr/bin/env bash
# moe_gpu.sh OUT [--quick]: the quantized-MoE session on the GPU machine (issue 11) in one command,
# every log under OUT:
#   1. build with CUDA (scripts/cuda_check.sh: the smoke and tests/test_cuda; cJSON/cmocka from .devdeb/)
#   2. the kernel lab dev/cuda/moe_quant.cu: every version checked and timed (OUT/lab.md, OUT/lab.jsonl)
#   3. the 26B-A4B random checkpoint (dgemma mkrandom, 4-bit g64 experts, written while 2 runs) and
#      dgemma bench --device cuda --protocol vllm on it (OUT/bench_vllm.jsonl)
# Carry .devdeb and .devdata (the Gemma tokenizer, gzipped: .devdata/gemma3/tokenizer.json.gz).
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/moe_gpu.sh OUT [--quick]}
QUICK=${2:-}
mkdir -p "$OUT" .cache/gemma3
[ -f .cache/gemma3/tokenizer.json ] || gunzip -c .devdata/gemma3/tokenizer.json.gz > .cache/gemma3/tokenizer.json
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
t0=$(date +%s)
timeout 300 scripts/cuda_check.sh "$OUT/check" > "$OUT/check.log" 2>&1; crc=$?
echo "== cuda_check rc $crc ($(( $(date +%s) - t0 )) s)"; grep -E "OK|FAILED|PASSED|passed|verdict|ERROR" "$OUT/check.log" | tail -40
# the checkpoint, on the CPU, while the GPU runs the lab
(build/dgemma mkrandom /tmp/dg26b --source .cache/gemma3 -t 12 > "$OUT/mkrandom.log" 2>&1; echo "mkrandom rc $?" >> "$OUT/mkrandom.log") &
mk=$!
P=/tmp/dgdeps/usr; XC=""; XL=""
[ -d $P/include/cjson ] && { XC="-I$P/include"; XL="-L$P/lib/x86_64-linux-gnu -Wl,-rpath,$P/lib/x86_64-linux-gnu"; }
CUL=$(dirname "$(readlink -f "$(command -v nvcc)")")/../lib64
nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iinclude -Isrc $XC dev/cuda/moe_quant.cu build/libdgemma.a \
  -L"$CUL" $XL -lcublas -lcudart -lcjson -lgomp -o build/moe_quant 2>&1 | tail -5
echo "== lab ($(( $(date +%s) - t0 )) s)"
build/moe_quant $QUICK --json "$OUT/lab.jsonl" > "$OUT/lab.md" 2>&1; echo "lab rc $?"
grep -E "ceilings|check:" "$OUT/lab.md"
wait $mk; tail -2 "$OUT/mkrandom.log"
echo "== bench ($(( $(date +%s) - t0 )) s)"
timeout 240 build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm -o "$OUT/bench_vllm.jsonl" > "$OUT/bench_vllm.txt" 2>&1
echo "bench rc $?"; tail -12 "$OUT/bench_vllm.txt"
echo "== done ($(( $(date +%s) - t0 )) s)"
