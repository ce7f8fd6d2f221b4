#!/usr/bin/env bash
# moe_lab_gpu.sh OUT: the kernel lab of the quantized MoE on the GPU machine (issue 11): build, every
# version of dev/cuda/moe_quant.cu checked and timed, Nsight Compute on the gathered 256-token MoE,
# dgemma's ceiling protocol. At most 8 files come back from a run: OUT holds log.txt, build.txt, lab.md,
# lab.jsonl, ncu.txt (NCU=1), sass_b4_gu_nt3.txt, ceiling.md, ceiling.jsonl. LAB_BITS, LAB_VERSIONS and
# NCU_VERSIONS choose what runs; BENCH=1 adds the 26B vllm protocol (carry .devdata).
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/moe_lab_gpu.sh OUT}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
. scripts/gpu_env.sh
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" all > "$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
lab_build || exit 1
echo "== built $(el)"
if [ -n "${BENCH:-}" ]; then  # the 26B checkpoint on the CPU while the lab runs (carry .devdata: the tokenizer)
  mkdir -p .cache/gemma3
  [ -f .cache/gemma3/tokenizer.json ] || gunzip -c .devdata/gemma3/tokenizer.json.gz > .cache/gemma3/tokenizer.json
  (build/dgemma mkrandom /tmp/dg26b --source .cache/gemma3 -t 12 > /tmp/mkrandom.log 2>&1) &
  mk=$!
fi
timeout 200 build/moe_quant --bits ${LAB_BITS:-4,3,2} --versions ${LAB_VERSIONS:-2,3,4,5,6,7} --json "$OUT/lab.jsonl" > "$OUT/lab.md" 2>&1; echo "lab rc $? $(el)"
grep -E "ceilings|check:" "$OUT/lab.md"
grep -E "gathered T 256|uniform (1|16|64) " "$OUT/lab.md" | head -60
cuobjdump -sass -fun '_Z9qe_kernelILi4ELi1ELi3ELi64ELi128ELi3ELi4ELi1EEv7qe_args' build/src/cuda/qmoe_b4.o > "$OUT/sass_b4_gu_nt3.txt" 2>&1
[ -n "${NCU:-}" ] && timeout 90 ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis -k regex:qe_kernel -c 4 build/moe_quant --bits 4 --versions ${NCU_VERSIONS:-2,7} --ms none --ts 256 --reps 1 \
  > "$OUT/ncu.txt" 2>&1 && grep -E "qe_kernel|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Dynamic Shared|Warp Cycles Per Issued" "$OUT/ncu.txt"
timeout 100 build/dgemma bench --device cuda --protocol ceiling --reps 20 -o "$OUT/ceiling.jsonl" > "$OUT/ceiling.md" 2>&1; echo "ceiling rc $? $(el)"
grep -E "experts_all|moe_gathered" "$OUT/ceiling.md" | grep -E "4-bit|3-bit|2-bit|bf16" | head -40
if [ -n "${BENCH:-}" ]; then
  wait $mk; tail -1 /tmp/mkrandom.log
  timeout 150 build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 2 -o "$OUT/bench_vllm.jsonl" > /tmp/bench.txt 2>&1
  echo "bench rc $? $(el)"; tail -5 /tmp/bench.txt; cat /tmp/bench.txt >> "$OUT/log.txt"
fi
echo "== done $(el)"
