#!/bin/bash
# Session 32's check of helper wl31's change (session 31; docs/cuda.md "Measured on an H100 in session 31"): lab
# version 139's lean order moved into the backend as the down product's 8-tile kernel (qr_lean_kernel, the default
# DGEMMA_QR_LAUNCH=lean), session 30's qr_kernel kept behind DGEMMA_QR_LAUNCH=v50, and 134 / 136's registers for 3
# blocks per SM at 5 n-tiles behind DGEMMA_QR_LAUNCH=lean5 (off). One command, carry `.devdeb .devdata/gemma3`,
# default kind (H100), DG_CALL_S = the call's limit (600 if unset). Not ~150 s: ~250 s warm to item 3 (the library,
# test_cuda and the lab rebuild: src/cuda/qmoe_r.cuh changed), ~470 s with item 4's four vllm runs (~55 s each, the
# model's load most of it); items in order of importance, each under a guard of the time left and its own timeout:
#   1. `make ... build/libdgemma.a build/dgemma build/libdgemma_cuda.so build/tests/test_cuda` beside the lab's
#      compile (-DLAB_ONLY_FG: versions 1-3, 40, 50, 110, 114; sm_90a, -Xptxas -v), then its link; ptxas.txt: the
#      registers and spills of qr_lean_kernel's instances (expected: 255 and none for <4, 0, 64, 1>, as lab 139's);
#      beside them, in the background, /tmp/dg26b (gpu_mkrandom_cpu_bg; kept on a warm machine);
#   2. tests, under DGEMMA_QR_LAUNCH unset (lean), v50 and lean5: test_quant_experts_diet (the backend's launch
#      against the other stage loop word for word: at 8 n-tiles under lean the lean kernel against qr_kernel's DIET
#      loop, 4-bit g64 down of 2 and 7 weight stages; at 5 n-tiles under lean5 MINB 3 against DIET 0),
#      test_quant_expert_bodies (4, 5, 8 n-tiles against the CPU, exact fold and DQ), test_experts_dn_fuse (the
#      down product at 8 n-tiles after the fused copy), and test_quant_experts once (tests.txt);
#   3. the lab's backend rows: `moe_quant --bits 4 --versions 50 --ms 16,32,64,128 --ts 256,512,1024,2048 --reps 5`
#      under DGEMMA_QR_LAUNCH=lean, v50, lean5, then again in the same order (A B C A B C; lab.txt): version 50 is the
#      backend's qr_launch_bits, so these are the backend's kernels under each value;
#   4. with /tmp/dg26b there: `dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 2` under lean, v50,
#      lean, v50 (A B A B; step.txt, bench.jsonl); then, with >= 150 s left, `--protocol batch --canvases 4 --reps 1`
#      under lean and v50 (A B).
#
# The prediction (session 31's two lab runs of 139 and 134 / 136 against 50, docs/cuda.md "Measured on an H100 in
# session 31"; medians, us, lean / v50):
#   down at 8 n-tiles: uniform M 64 ~160 / ~170 (-5.6 %), M 128 ~303 / ~322 (-5.8 %), T 1024 ~218 / ~224 (-2.4 %),
#     T 2048 ~367 / ~380 (-3.4 %); every gate_up row, and the down rows at M 16, 32 and T 256, 512 the same kernels
#     under lean and v50: within 1.5 % (the drift control);
#   lean5 against lean at 5 n-tiles (uniform M 32, gathered T 512), both products: M 32 gate_up ~159 / ~173 (-7.7 %),
#     down ~100 / ~112.5 (-10.9 %); T 512 (the gathered spread: the 4-tile body for experts of <= 32 rows, a second
#     pass above 40) -5 to -10 %; the other rows the same kernels as lean (within 1.5 %);
#   vllm: the lean kernel runs only in the prompt's encoder pass (1,024 tokens, 64 rows per expert: 8 n-tiles), 30
#     down launches x ~5 us = ~0.15 ms of a ~878 ms generate (0.02 %): no change to see (within the runs' spread);
#     the batch protocol at B = 4 (passes of 2-1,024 rows, median ~566: about half of the 178 passes at 8 n-tiles,
#     ~35-64 rows per expert): ~89 passes x 30 layers x ~5 us = ~13 ms of ~6.9 s (0.2 %): within the spread too.
#
# The rule (written before any GPU run):
#  (a) a failed test under any value is a bug to fix before the branch is merged (the words are the same under every
#      value by construction: a word that differs names the launch that is wrong).
#  (b) lean stays the default if, in both lab passes, at uniform M 64 and M 128 and gathered T 1024 and T 2048 its
#      down median is under v50's with the min-max ranges apart; if in both passes a row's down median is over v50's
#      with ranges apart, the default goes back to v50 (one word: switches.c's default, README's row) and the rows
#      are named; otherwise (mixed) lean stays, the rows are named and the next call repeats them.
#  (c) lean5 becomes the default if, in both passes, at uniform M 32 and gathered T 512, for gate_up and for down, its
#      median is under lean's with ranges apart, and every other row is within 1.5 % of lean's (or under it);
#      otherwise it stays off, and the rows say why (a T 512 loss with an M 32 win: the gathered spread's second
#      passes or bodies, not the warps).
#  (d) the benches only guard against a regression: a vllm or batch row of lean more than max(2 x the A-A spread, 1 %)
#      under v50's tok/s in both pairs is one to explain before the merge (no kernel of a B = 1 step changed; the
#      prediction is no visible change); they cannot confirm (b) or (c).
# Files back (6): log.txt, ptxas.txt, tests.txt, lab.txt, step.txt, bench.jsonl.
# Usage: DG_CALL_S=600 bash dev/gpu/s32_wl31.sh $OUT
O=${1:?usage: dev/gpu/s32_wl31.sh OUT}; mkdir -p "$O"
. scripts/gpu_env.sh
T=$(call_budget 580)
TP=/tmp/wl_ # bench's files /tmp/wl_NAME.txt, .jsonl (scripts/gpu_env.sh)
A="-gencode=arch=compute_90a,code=sm_90a"
rm -f /tmp/wl_*.txt /tmp/wl_*.jsonl
: > "$O/tests.txt"; : > "$O/lab.txt"; : > "$O/step.txt"; : > "$O/bench.jsonl"; : > "$O/ptxas.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a "$O/log.txt"
git log -1 --format='%h %s' 2>/dev/null | cut -c1-100 >> "$O/log.txt"
gpu_mkrandom_cpu_bg "$O/log.txt"
mkdir -p build-wl
rm -f build-wl/moe_quant.o build-wl/moe_quant # never an earlier call's binary on a warm machine
timeout "$(lim 240)" nvcc -c -O2 -std=c++17 $A -DLAB_ONLY_FG -Xptxas -v -Iinclude -Isrc $XC dev/cuda/moe_quant.cu \
  -o build-wl/moe_quant.o > /tmp/wl_lab_build.txt 2>&1 &
lp=$!
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/libdgemma.a build/dgemma build/libdgemma_cuda.so \
  build/tests/test_cuda > /tmp/wl_build.txt 2>&1
echo "build rc $? $(el)" | tee -a "$O/log.txt"; tail -3 /tmp/wl_build.txt >> "$O/log.txt"
wait $lp; echo "lab compile rc $? $(el)" | tee -a "$O/log.txt"
grep -A3 -E "Compiling entry.*qr_lean_kernel" /tmp/wl_lab_build.txt | grep -E "Compiling|registers|spill" >> "$O/ptxas.txt"
nvcc $A build-wl/moe_quant.o build/libdgemma.a -L"$CUL" $NXL -lcublas -lcudart -lcjson -lgomp -o build-wl/moe_quant \
  >> /tmp/wl_lab_build.txt 2>&1
echo "lab link rc $? $(el)" | tee -a "$O/log.txt"
[ -x build-wl/moe_quant ] || grep -v "^ptxas info\|^    " /tmp/wl_lab_build.txt | tail -20 >> "$O/log.txt"
# 2. tests under each value
if [ -x build/tests/test_cuda ]; then
  for v in lean v50 lean5; do
    E="DGEMMA_QR_LAUNCH=$v"
    one "diet_$v" test_quant_experts_diet "$E"
    one "bodies_$v" test_quant_expert_bodies "$E"
    one "dn_fuse_$v" test_experts_dn_fuse "$E"
  done
  one quant_experts test_quant_experts
fi
echo "tests: $(grep -c PASSED "$O/tests.txt") passed lines, $(grep -c FAILED "$O/tests.txt") failed lines" | tee -a "$O/log.txt"
# 3. the lab's backend rows, A B C A B C
export LD_LIBRARY_PATH="$CUL:/tmp/dgdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -x build-wl/moe_quant ]; then
  for pass in 1 2; do
    for v in lean v50 lean5; do
      guard 30 "lab $v pass $pass" || break 2
      { echo; echo "## pass $pass: DGEMMA_QR_LAUNCH=$v build-wl/moe_quant --bits 4 --versions 50 --ms 16,32,64,128 --ts 256,512,1024,2048 --reps 5"; } >> "$O/lab.txt"
      DGEMMA_QR_LAUNCH=$v timeout "$(lim 45)" build-wl/moe_quant --bits 4 --versions 50 --ms 16,32,64,128 \
        --ts 256,512,1024,2048 --reps 5 >> "$O/lab.txt" 2>&1
      echo "lab $v pass $pass rc $? $(el)" | tee -a "$O/log.txt"
    done
  done
fi
# the lab's medians side by side (log.txt): per product and row, each pass's lean / v50 / lean5
python3 - "$O/lab.txt" >> "$O/log.txt" 2>&1 <<'PY'
import re, sys
runs, cur, rows = [], None, {}
for line in open(sys.argv[1]):
    m = re.match(r"## pass (\d): DGEMMA_QR_LAUNCH=(\w+)", line)
    if m:
        cur = m.group(2) + " p" + m.group(1)
        runs.append(cur)
        continue
    c = [x.strip() for x in line.split("|")]
    if cur and len(c) > 8 and c[1] == "4" and c[5] == "50":
        rows.setdefault((c[2], c[3]), {})[cur] = f"{c[6]} ({c[7]})"
print("lab medians (min-max), us: " + " | ".join(runs))
for (prod, row), v in rows.items():
    print(f"  {prod} {row}: " + " | ".join(v.get(r, "-") for r in runs))
PY
# 4. the benches (a regression guard)
while kill -0 "$mk" 2> /dev/null && [ "$(left)" -gt 150 ]; do sleep 5; done # (a fresh machine: ~300 s of mkrandom)
tail -1 /tmp/mkrandom.log >> "$O/log.txt" 2> /dev/null; [ -f /tmp/dg26b.ok ] || echo "no /tmp/dg26b yet: benches skipped $(el)" | tee -a "$O/log.txt"
if [ -x build/dgemma ] && [ -f /tmp/dg26b.ok ]; then
  for run in vllm_lean_1 vllm_v50_1 vllm_lean_2 vllm_v50_2; do
    v=${run#vllm_}; v=${v%_*}
    guard 70 "bench $run" || break
    ENVS="DGEMMA_QR_LAUNCH=$v" DGEMMA_QR_LAUNCH=$v bench "$run" "$(lim 100)" -m /tmp/dg26b --device cuda --protocol vllm --reps 2
  done
  for run in batch4_lean batch4_v50; do
    v=${run#batch4_}
    guard 100 "bench $run" || break
    ENVS="DGEMMA_QR_LAUNCH=$v" DGEMMA_QR_LAUNCH=$v bench "$run" "$(lim 120)" -m /tmp/dg26b --device cuda --protocol batch \
      --canvases 4 --reps 1
  done
fi
grep -h "tok/s\|^| vllm\|^| batch" "$O/step.txt" | head -20 >> "$O/log.txt"
echo "done $(el)" | tee -a "$O/log.txt"
