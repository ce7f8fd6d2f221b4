#!/usr/bin/env bash
# qr_probe_gpu.sh OUT: one GPU-machine call that looks inside the quantized expert kernel (issue 11) and
# checks the whole step (issue 12):
#   1. build with CUDA; the 26B-A4B random checkpoint written meanwhile (dgemma mkrandom)
#   2. the SASS of qr_kernel<4, 1, 3, 64> (the 256-token canvas's gate/up) with its instruction mix
#      (sass_qr.txt: cuobjdump -sass, then opcode counts of the function)
#   3. the MoE lab over LAB_VERSIONS (lab.md, lab.jsonl)
#   4. Nsight Compute on version 3's gathered 256-token gate/up: warp states, instruction statistics,
#      source counters (ncu_qr.txt)
#   5. tests/test_cuda (tests.txt); dgemma bench --protocol vllm --profile on the checkpoint (bench_vllm.*)
# Carry .devdeb and .devdata.
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/qr_probe_gpu.sh OUT}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv
. scripts/gpu_env.sh
gpu_build /tmp/build.txt || exit 1
echo "== built $(el)"
gpu_mkrandom_bg 8
lab_build || exit 1
echo "== lab built $(el)"
F=_Z9qr_kernelILi4ELi1ELi3ELi64ELi4ELi2ELi3ELi4ELi2ELi0ELi0EEv7qe_args
cuobjdump -sass build/src/cuda/qmoe_r4.o 2>&1 | awk -v f="$F" '/Function :/ {on = index($0, f) > 0} on' > /tmp/sass.txt
{ echo "# opcode counts of $F (static, whole function)"
  grep -oE '^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P[0-9T] )?[A-Z][A-Z0-9_.]+' /tmp/sass.txt | awk '{print $NF}' | sed 's/\..*//' \
    | sort | uniq -c | sort -rn | head -40
  echo; cat /tmp/sass.txt; } > "$OUT/sass_qr.txt"
head -30 "$OUT/sass_qr.txt"
timeout 200 build/moe_quant --bits 4 --versions ${LAB_VERSIONS:-3,13,14,15,16} --ms ${LAB_MS:-1,16,64} --ts ${LAB_TS:-256} \
  --json "$OUT/lab.jsonl" > "$OUT/lab.md" 2>&1; echo "lab rc $? $(el)"
grep -E "ceilings|check:" "$OUT/lab.md"; grep -E "gathered T 256|uniform (1|16|64) " "$OUT/lab.md" | head -60
if [ "${NCU:-1}" = 1 ]; then
timeout 150 ncu --section SpeedOfLight --section WarpStateStats --section InstructionStats --section SchedulerStats \
  --section Occupancy --section LaunchStats --section SourceCounters --section MemoryWorkloadAnalysis \
  -k regex:qr_kernel -c 1 build/moe_quant --bits 4 --versions 3 --ms none --ts 256 --reps 1 > "$OUT/ncu_qr.txt" 2>&1
echo "ncu rc $? $(el)"
grep -E "Duration|DRAM Throughput|Issue Slots|Warp Cycles Per Issued|Issued Instructions|Eligible|Active Warps|Stall|stall|SM Frequency" "$OUT/ncu_qr.txt" | head -40
fi
timeout 200 build/tests/test_cuda > "$OUT/tests.txt" 2>&1; echo "test_cuda rc $? $(el)"
grep -E "^\[  (FAILED|PASSED|  ERROR) |FAIL" "$OUT/tests.txt" | head -20
wait $mk; tail -1 /tmp/mkrandom.log
timeout 150 build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 2 --profile -o "$OUT/bench_vllm.jsonl" \
  > "$OUT/bench_vllm.txt" 2>&1; echo "bench rc $?"; tail -22 "$OUT/bench_vllm.txt"
echo "== done $(el)"
