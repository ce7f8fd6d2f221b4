#!/bin/bash
# session 19, call 2 (right after call 1, the machine warm): Nsight Compute's memory sections on the backend's
# qr_kernel launches of a 26B decoder pass (2-layer cut; issue 11), then racecheck over the cases that ran past
# 440 s in session 12 (issue 16), and with INIT=1 initcheck over every test of test_cuda.
OUT=$1; set -u; . scripts/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader > $OUT/gpu.txt
[ -x build/dgemma ] && [ -x build/tests/test_cuda ] || gpu_build /tmp/build2.txt || exit 1
echo "build $(el)"; gpu_tokenizer
[ -f /tmp/dgL/config.json ] || build/dgemma mkrandom /tmp/dgL --config dev/cfg_26b_2layers.json --source .cache/gemma3 -t 16 > /tmp/mkL.log 2>&1
# the first decoder pass's four qr_kernel launches (gate/up, down of each layer) after the prefill's four
DGEMMA_GRAPHS=0 timeout 150 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Chart \
  --section MemoryWorkloadAnalysis_Tables --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
  -k regex:qr_kernel --launch-skip 4 --launch-count 4 -f -o /tmp/qr build/dgemma bench -m /tmp/dgL --device cuda --protocol vllm \
  --reps 1 --warmup 0 > /tmp/ncu.log 2>&1; echo "ncu rc $? $(el)"; tail -3 /tmp/ncu.log
ncu -i /tmp/qr.ncu-rep --page details > $OUT/ncu_qr_details.txt 2>&1
ncu -i /tmp/qr.ncu-rep --page raw --csv 2>/dev/null | gzip -c > $OUT/ncu_qr_raw.csv.gz
grep -E "qr_kernel|Duration|DRAM Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Block Limit Reg|Warp Cycles Per Issued|Issued Ipc" $OUT/ncu_qr_details.txt | cut -c1-150 | head -50
rm -rf /tmp/san
SAN_PAR=all SAN_T=$(( 560 - $(date +%s) + t0 )) SAN_TOOLS=racecheck SAN_FILTER="test_synth_logits@1 test_synth_logits@2 test_synth_logits@4 test_golden_logits@1 test_quant_synth_logits@0 test_quant_synth_logits@1 test_quant_synth_logits@2 test_turbo_generate test_quant_small_model" \
  scripts/sanitize_gpu.sh $OUT/race > $OUT/race_stdout.txt 2>&1 &
if [ -n "${INIT:-}" ]; then SAN_PAR=all SAN_T=$(( 560 - $(date +%s) + t0 )) SAN_TOOLS=initcheck scripts/sanitize_gpu.sh $OUT/init > $OUT/init_stdout.txt 2>&1 & fi
wait; cat $OUT/race/summary_*.txt; [ -n "${INIT:-}" ] && cat $OUT/init/summary_*.txt; echo "all $(el)"
