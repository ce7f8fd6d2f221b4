#!/bin/bash
# session 20, call 2 (issue 11; right after call 1 on the warm machine: build/, build-def1/2, /tmp/dg26b, /tmp/dgL):
#   1. QR_PREWAIT (the down product's weight stages asked of L2 before griddepcontrol.wait) timed end to end against
#      the default in one qw_lab_gpu.sh run: vllm protocol --profile with build/ and build-def1 (64 stages: all), build-def2 (4),
#      and each build's test_quant_experts / test_experts_dn_fuse on the GPU;
#   2. Nsight Compute's source page (stall samples per SASS instruction) of the backend's qr_kernel on the prefill's
#      third 256-row chunk of layer 0 (gate/up and down, the canvas's shape).
OUT=$1; set -u
LAB_RUNS=none BENCH=1 BENCH_DEFS="QR_PREWAIT=64 QR_PREWAIT=4" DEFS_TESTS=1 TESTS_T=120 scripts/qw_lab_gpu.sh $OUT/q > /dev/null 2>&1
grep -E "^bench|^test_cuda|PASSED|FAILED|built|== built|tok/s|^\| (vllm|experts)" $OUT/q/log.txt | head -40
. scripts/gpu_env.sh
[ -f /tmp/dgL/config.json ] || { gpu_tokenizer; build/dgemma mkrandom /tmp/dgL --config dev/cfg_26b_2layers.json --source .cache/gemma3 -t 16 > /tmp/mkL.log 2>&1; }
DGEMMA_GRAPHS=0 timeout 200 ncu --set full --import-source no -k regex:qr_kernel --launch-skip 4 --launch-count 2 -f -o /tmp/qrf \
  build/dgemma bench -m /tmp/dgL --device cuda --protocol vllm --reps 1 --warmup 0 > /tmp/ncu.log 2>&1; echo "ncu rc $? $(el)"; tail -3 /tmp/ncu.log
ncu -i /tmp/qrf.ncu-rep --page source --csv --print-source sass 2>&1 | gzip -c > $OUT/qr_src.csv.gz
ncu -i /tmp/qrf.ncu-rep --page details 2>&1 | gzip -c > $OUT/qr_details.txt.gz
zcat $OUT/qr_src.csv.gz | head -3 | cut -c1-600; zcat $OUT/qr_src.csv.gz | wc -l
echo "all $(el)"
