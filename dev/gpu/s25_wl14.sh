#!/bin/bash
# Session 25's call for issues 12 and 14 (helper wl14, session 24), one command, carry .devdeb .devbin .devdata;
# about 6-8 minutes on an H100 (most of it the sm_90a build and the two batch benches):
#   1. the LAB_LEAN lab of .devbin/moe_quant.xz (rebuilt from branch wl14: versions 50, 120-124) at uniform
#      M 64/128/256 and gathered T 1,024/2,048: 50, 122 and the multi-slab 123 (3 slabs a block) and 124 (every slab
#      of the expert a block), --reps 10 (lab_wl.txt; the check and "vs 50" columns <= 1 first);
#   2. ncu (--set full, --clock-control none) on version 122's first wl_kernel launch at uniform M 128 (gate/up):
#      the tensor pipe's active %, L2 and DRAM throughput, the warps' stall reasons (ncu_122.txt: the details page;
#      ncu_122_key.txt: the metrics that decide between wg14_STATUS "Not done" 3a (A-tile L2 traffic), 3b (the
#      dequantization's issue slots) and 3c (the one-block-per-SM tail));
#   3. meanwhile, in the background: the library, the CLI and the CUDA plugin for sm_90a in build-a (wl_kernel needs
#      wgmma: the default compute_90 build ignores DGEMMA_WL), a CPU CLI in build-c and with it the 26B-A4B random
#      checkpoint /tmp/dg26b (mkrandom; the tokenizer from .devdata/gemma3, gzipped);
#   4. the batch bench (`--protocol batch --canvases 1,4,8 --reps 2`) with the sm_90a build, default (DGEMMA_WL
#      unset) and DGEMMA_WL=1 (the hybrid gate/up: experts of >= 128 rows through wl_kernel), bench.txt/bench.jsonl;
#      every canvas's tokens are compared with the smaller-B rows by the bench itself (with DGEMMA_WL=1 a canvas may
#      differ from its single run within the DQ bound: src/cuda/qmoe_wl.cu), and the device memory line shows the
#      wl layout's cost (~311 MB a layer);
#   5. test_quant_experts_wgmma on the sm_90a build (the lab's 120-124 and DGEMMA_WL=1's path on the hardware's wgmma).
# The carry limit (64 MiB with the tree, ~41 MB at session 24's end) does not hold .devbin (~23 MB) and .devdata/gemma3
# (5.4 MB) together, so the call is made in two parts, one after the other on the same machine:
#   PART=lab   bash dev/gpu/s25_wl14.sh $OUT   (carry .devdeb .devbin: items 1-2, ~2 min)
#   PART=bench bash dev/gpu/s25_wl14.sh $OUT   (carry .devdeb .devdata/gemma3: items 3-5, ~5-6 min)
# Usage: [PART=lab|bench] bash dev/gpu/s25_wl14.sh $OUT (default both, only where the carry fits)
O=$1; mkdir -p "$O"
PART=${PART:-all}
. scripts/gpu_env.sh
A="-gencode=arch=compute_90a,code=sm_90a"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee -a "$O/log.txt"
if [ "$PART" != bench ]; then
lab_unpack
timeout 240 /tmp/mq --bits 4 --versions 50,122,123,124 --ms 64,128,256 --ts 1024,2048 --reps 10 --json "$O/lab_wl.jsonl" \
  > "$O/lab_wl.txt" 2>&1
echo "lab_wl rc $? $(el): $(grep -c FAIL "$O/lab_wl.txt") FAIL" | tee -a "$O/log.txt"
timeout 150 ncu --set full --clock-control none --import-source no -k regex:wl_kernel -c 1 -f -o /tmp/rep122 \
  /tmp/mq --bits 4 --versions 122 --ms 128 --ts none --reps 1 > /tmp/ncu.log 2>&1
echo "ncu rc $? $(el)" | tee -a "$O/log.txt"; tail -3 /tmp/ncu.log >> "$O/log.txt"
ncu -i /tmp/rep122.ncu-rep --page details > "$O/ncu_122.txt" 2>&1
ncu -i /tmp/rep122.ncu-rep --page raw --csv > /tmp/raw122.csv 2>&1
python3 - /tmp/raw122.csv > "$O/ncu_122_key.txt" 2>&1 <<'PY'
import csv, sys, re
rows = list(csv.reader(open(sys.argv[1])))
if len(rows) < 3: sys.exit("no rows")
names, units, vals = rows[0], rows[1], rows[2]
pat = re.compile(r"(pipe_tensor|gmma|hmma|lts__t_(bytes|sectors)|lts__throughput|dram__throughput|dram__bytes|"
                 r"smsp__average_warp|warp_issue_stalled|smsp__pcsamp|issue_active|inst_executed_pipe|"
                 r"sm__throughput|gpu__time_duration|launch__(grid|block|occupancy|registers|shared)|achieved_occupancy)")
for n, u, v in zip(names, units, vals):
    if pat.search(n): print(f"{n} [{u}] = {v}")
PY
fi
[ "$PART" = lab ] && { echo "done $(el)" | tee -a "$O/log.txt"; exit 0; }
( make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" BUILD=build-a CUDA_ARCH="$A" all build-a/tests/test_cuda \
    > /tmp/build_a.txt 2>&1; echo "build_a rc $? $(el)" >> "$O/log.txt" ) &
bp=$!
gpu_mkrandom_cpu_bg "$O/log.txt"
wait $bp; tail -3 /tmp/build_a.txt > "$O/build_tail.txt"
DG_TEST_FILTER=test_quant_experts_wgmma timeout 240 build-a/tests/test_cuda > "$O/tests.txt" 2>&1 &
tp=$!
wait $mk; tail -2 /tmp/mkrandom.log >> "$O/log.txt"
wait $tp; echo "test_quant_experts_wgmma rc $? $(el)" | tee -a "$O/log.txt"
for wl in 0 1; do
  if [ $wl = 1 ]; then export DGEMMA_WL=1; else unset DGEMMA_WL; fi
  timeout 200 build-a/dgemma bench -m /tmp/dg26b --device cuda --protocol batch --canvases 1,4,8 --reps 2 \
    -o /tmp/batch.jsonl > /tmp/batch.txt 2>&1
  echo "batch DGEMMA_WL=$wl rc $? $(el)" | tee -a "$O/log.txt"; tail -12 /tmp/batch.txt
  { echo; echo "## DGEMMA_WL=$wl (build-a, sm_90a)"; cat /tmp/batch.txt; } >> "$O/bench.txt"; cat /tmp/batch.jsonl >> "$O/bench.jsonl"
done
unset DGEMMA_WL
echo "done $(el)" | tee -a "$O/log.txt"
