#!/usr/bin/env bash
# moe_gpu.sh OUT: the quantized-MoE measurements of issue 11 on the GPU machine in one command. Every
# result lands in OUT (at most 8 files come back from a run: log.txt, lab.md, lab.jsonl, ceiling.md,
# ceiling.jsonl, torch.jsonl, bench_vllm.jsonl, check.log):
#   1. build with CUDA (cJSON/cmocka unpacked from .devdeb/ when missing, as scripts/cuda_check.sh) and,
#      on the CPU meanwhile, the 26B-A4B random checkpoint (dgemma mkrandom, 4-bit g64 experts)
#   2. the kernel lab dev/cuda/moe_quant.cu: the backend's kernel (version 3, qr_kernel) and the tile-
#      layout one (version 2, qe_kernel) for 4/3/2/8/6 bits, and the first backend's kernel (version 1)
#      at M = 1, 16, 64 and the 256-token canvas, 4-bit
#   3. dgemma bench --device cuda --protocol ceiling (the backend's expert path, GPU ceilings measured
#      in the same command), then scripts/torch_anchors.py at the same shapes with those ceilings
#   4. dgemma bench --device cuda --protocol vllm on the checkpoint
#   5. tests/test_cuda and the smoke (scripts/cuda_check.sh)
# Carry .devdeb and .devdata (the Gemma tokenizer gzipped: .devdata/gemma3/tokenizer.json.gz).
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/moe_gpu.sh OUT}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
. scripts/gpu_env.sh
mkdir -p .cache/gemma3
[ -f .cache/gemma3/tokenizer.json ] || gunzip -c .devdata/gemma3/tokenizer.json.gz > .cache/gemma3/tokenizer.json
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" all build/tests/test_cuda > /tmp/build.txt 2>&1 \
  || { tail -30 /tmp/build.txt; exit 1; }
(build/dgemma mkrandom /tmp/dg26b --source .cache/gemma3 -t 12 > /tmp/mkrandom.log 2>&1) &
mk=$!
lab_build || exit 1
echo "== built $(el)"
timeout 220 build/moe_quant --bits 4,3,2,8,6 --versions 2,3 --json "$OUT/lab.jsonl" > "$OUT/lab.md" 2>&1; echo "lab rc $? $(el)"
timeout 60 build/moe_quant --bits 4 --versions 1 --ms 1,16,64 --ts 256 --reps 5 --json /tmp/lab_v1.jsonl >> "$OUT/lab.md" 2>&1
echo "lab v1 rc $? $(el)"; cat /tmp/lab_v1.jsonl >> "$OUT/lab.jsonl"
grep -E "ceilings|check:" "$OUT/lab.md"
timeout 90 build/dgemma bench --device cuda --protocol ceiling --reps 20 -o "$OUT/ceiling.jsonl" > "$OUT/ceiling.md" 2>&1; echo "ceiling rc $? $(el)"
grep -E "moe_gathered|experts_all" "$OUT/ceiling.md" | grep -E "4-bit|3-bit|2-bit" | head -40
PYTHONUNBUFFERED=1 timeout 90 python3 scripts/torch_anchors.py --ceilings "$OUT/ceiling.jsonl" -o "$OUT/torch.jsonl" 2>&1 | grep -E "int4pack|GPU" ; echo "torch $(el)"
wait $mk; tail -1 /tmp/mkrandom.log
timeout 120 build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 2 -o "$OUT/bench_vllm.jsonl" 2>&1 | tail -5
echo "bench $(el)"
timeout 150 scripts/cuda_check.sh /tmp/check > "$OUT/check.log" 2>&1; echo "cuda_check rc $?"
grep -E "^\[  (FAILED|PASSED) |verdict|cuda_check:|# quantized gathered" "$OUT/check.log" | tail -12
echo "== done $(el)"
