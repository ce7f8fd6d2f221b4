#!/usr/bin/env bash
# moe_lab_gpu.sh OUT: the kernel lab of the quantized MoE on the GPU machine (issue 11): build, every
# version of dev/cuda/moe_quant.cu checked and timed, register/shared-memory use of the kernels, Nsight
# Compute on the gathered 256-token MoE, the CUDA tests, dgemma's ceiling protocol. At most 8 files come
# back from a run: OUT holds log.txt (with the tests' output), build.txt, lab.md, lab.jsonl, ncu.txt
# (NCU=1), res_usage.txt, ceiling.md, ceiling.jsonl.
#   LAB_BITS, LAB_VERSIONS   the main lab invocation (default 4-bit, versions 1-9)
#   LAB2_BITS, LAB2_VERSIONS a second one over other widths (default 3,2,8,6 with versions 2,3; LAB2_BITS=none: skip)
#   LAB_MS, LAB_TS           rows per expert and gathered token counts of the main invocation
#   NCU=1, NCU_CASES         Nsight Compute (--set full) on one 4-bit gate/up launch per 'version:lab,args' case
#   BENCH=1                  the 26B vllm protocol as well (carry .devdata: the tokenizer)
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/moe_lab_gpu.sh OUT}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
. scripts/gpu_env.sh
gpu_build "$OUT/build.txt" || exit 1
echo "== library built $(el)"
lab_build || exit 1
echo "== lab built $(el)"
{ for o in build/src/cuda/qmoe_r4.o build/src/cuda/qmoe_b4.o build/moe_quant; do echo "## $o"; cuobjdump -res-usage "$o" 2>&1 | grep -A1 -E "q[er]_kernelILi4ELi[01]ELi[123]ELi64" ; done; } > "$OUT/res_usage.txt"
grep -A1 "qr_kernelILi4ELi1ELi3ELi64ELi4ELi3ELi3ELi1E" "$OUT/res_usage.txt" | head -4
if [ -n "${BENCH:-}" ]; then  # the 26B checkpoint on the CPU while the lab runs
  gpu_mkrandom_bg 12
fi
timeout 200 build/moe_quant --bits ${LAB_BITS:-4} --versions ${LAB_VERSIONS:-1,2,3,4,5,6,7,8,9} --ms ${LAB_MS:-1,4,16,64} \
  --ts ${LAB_TS:-256,1024} --json "$OUT/lab.jsonl" > "$OUT/lab.md" 2>&1; echo "lab rc $? $(el)"
if [ "${LAB2_BITS:-3,2,8,6}" != none ]; then
  timeout 120 build/moe_quant --bits ${LAB2_BITS:-3,2,8,6} --versions ${LAB2_VERSIONS:-2,3} --ms 1,16 --ts 256 \
    --json /tmp/lab2.jsonl > /tmp/lab2.md 2>&1; echo "lab2 rc $? $(el)"
  cat /tmp/lab2.md >> "$OUT/lab.md"; cat /tmp/lab2.jsonl >> "$OUT/lab.jsonl"
fi
grep -E "ceilings|check:" "$OUT/lab.md"
grep -E "gathered T 256|uniform (1|16|64) " "$OUT/lab.md" | head -80
if [ -n "${NCU:-}" ]; then  # one gate/up launch per (version, case): the lab's check run
  : > "$OUT/ncu.txt"
  for vc in ${NCU_CASES:-4:--ms,1,--ts,none 7:--ms,none,--ts,256}; do
    v=${vc%%:*}; args=$(echo "${vc#*:}" | tr , ' ')
    echo "#### version $v $args" >> "$OUT/ncu.txt"
    timeout 100 ncu --set full -k regex:q[er]_kernel -c 1 build/moe_quant --bits 4 --versions "$v" $args --reps 1 >> "$OUT/ncu.txt" 2>&1
  done
  grep -E "####|q[er]_kernel<|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|L2 Hit|Stall|stall" "$OUT/ncu.txt" | head -80
  echo "ncu done $(el)"
fi
timeout 150 build/tests/test_cuda > /tmp/tests.txt 2>&1; echo "test_cuda rc $? $(el)"
grep -E "^\[|largest|ERROR" /tmp/tests.txt | tail -40
timeout 100 build/dgemma bench --device cuda --protocol ceiling --reps 20 -o "$OUT/ceiling.jsonl" > "$OUT/ceiling.md" 2>&1; echo "ceiling rc $? $(el)"
grep -E "experts_all|moe_gathered" "$OUT/ceiling.md" | grep -E "4-bit|3-bit|2-bit|bf16" | head -40
if [ -n "${BENCH:-}" ]; then
  wait $mk; tail -1 /tmp/mkrandom.log
  timeout 150 build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 2 -o /tmp/bench_vllm.jsonl > /tmp/bench.txt 2>&1
  echo "bench rc $? $(el)"; tail -5 /tmp/bench.txt; cat /tmp/bench_vllm.jsonl >> "$OUT/ceiling.jsonl"
fi
echo "== done $(el)"
