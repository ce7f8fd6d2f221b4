#!/bin/bash
# Session 29's call for issues 12 and 14's attention (helper at12; docs/cuda.md "Session 29 (helper at12): the
# decoder's attention near its floor, and one launch over a batch's canvases"): the attention lab's versions 15 (the
# backend's default on Hopper), 16 (15 with the key splits merged inside a thread block cluster through distributed
# shared memory: no fp32 partials in device memory, no combine launch), 17 (16's kernel over B canvases in one
# launch, each canvas its own q, K/V cache and output, one split count for the launch) and 18 (17 with each canvas's
# own split count: its words those of its single launch whatever the batch) at the 26B decoder's rows: a 256-query canvas over 1,280 and
# 2,304 keys (P 1024 and 2048), sliding layers (D 256, 16 over 8 heads, window 1,024) and full layers (D 512, 16 over
# 2), B = 1 and B = 4 canvases, each row against the floor measured in the same command (read bandwidth and bf16 rate:
# the lab's roofline column). One command, carry `.devdeb` where the machine lacks cJSON / cmocka headers. The library
# and test_cuda rebuild (this branch changes src/cuda/common.cuh, attention.cu, passes.cu): ~4-5 min on a warm machine,
# ~6-7 fresh (session 25's fresh library build: ~260 s); the items after the build take ~2 min (the lab ~25 s a run);
# give it DG_CALL_S (items are guarded by the time left).
#   0. build/libdgemma.a (the Makefile's default CUDA_ARCH: sm_90a + compute_90), then beside each other the lab
#      (nvcc sm_90a, -Xptxas -v: registers and spills of att_wqc_kernel in ptxas.txt) and build/tests/test_cuda;
#   1. the lab twice: `build/attention_lab --decoder --versions 15,16,17,18 --batch 4 --reps 30` (lab.md): rows
#      "decoder sliding/full P1024/P2048" (B = 1: one launch of 16-18, 15 as the backend runs it: flash kernel +
#      fp_combine_kernel) and the same rows "B4" (15 and 16: four launches in a row, the passes' way today; 17, 18: one
#      launch over the four canvases); every row checked against double precision (24 sampled rows per canvas), 16-18's
#      words compared with 15's ("= v15 word for word" / "0 words != v15" where their split count equals 15's), and
#      the last line the cluster slots per split count (how many 2..8-block clusters of 193 KiB blocks fit at once);
#   2. test_attention cases 15-18 (the derived per-element bound, 7 shapes, rings; 16-18 split them by the GPU's own
#      cluster occupancy; 16 and 18 through the backend's k_attention_any), test_attention_batch (k_attention_batch's
#      stacks of 3, 3 and 9 canvases equal each canvas alone word for word), test_attention_choice (DGEMMA_ATTN=16, 18,
#      "16,18" give those versions on sm_90a), test_turbo_batch under DGEMMA_ATTN=18 (a stack's canvases in one
#      launch, k_attention_batch: every canvas equals its own run, tokens and step traces) and test_graphs under
#      DGEMMA_ATTN=16 (cluster launches captured in CUDA graphs: graphs off / on bit-identical) (tests.txt);
#   3. only with AT12_BENCH=1 and /tmp/dg26b already made (/tmp/dg26b.ok, an earlier call's gpu_mkrandom_cpu_bg): the
#      vllm protocol with --profile, default (15) / DGEMMA_ATTN=16 / default / 16 (~40 s each; bench.txt): the
#      attention stage per pass and tok/s under the passes' own conditions (q hot in L2, graphs, PDL).
# Files back (4, 5 with item 3): log.txt, ptxas.txt, lab.md, tests.txt (, bench.txt).
#
# The rule, written before any GPU run:
#  - Correct: every lab row of both runs "ok", test_attention cases 16-18 and test_attention_batch pass; 16 "= v15 word for word" at every
#    B = 1 row whose split count equals 15's (4 at sliding, 2 at full, if the cluster slots line shows >= 128 slots at
#    4 and 2). A word difference at equal splits is a defect to fix before any timing counts (the merge's arithmetic
#    is fp_combine_kernel's by construction).
#  - Version 16 replaces 15 in the passes (next session: behind DGEMMA_ATTN=16 first, then the default after the vllm
#    A/B) only if, in both runs, at each of the four B = 1 decoder rows its median is below 15's by more than the
#    spread (the larger of the two rows' max - min) and it is correct as above. Predicted (docs/cuda.md): sliding
#    32.2 -> 23-25 us, full P1024 64.7 -> 53-56 us, full P2048 99.3 -> 88-91 us.
#  - Version 17 is the candidate for issue 14's stacked attention (one launch over the stack's canvases, wired behind
#    a switch next) only if, in both runs, at each of the four B4 rows its median is below 15's B4 median (four
#    launches) by more than the spread, and it is correct. Predicted: sliding ~129 -> ~55 us (one split, one wave),
#    full P1024 ~259 -> ~200 us, full P2048 ~397 -> ~350 us (one split, two waves).
#  - Version 18 is the candidate instead of 17 for the stack's default (the batch tests' "a canvas in a stack = its
#    single run, word for word" holds under it) if its B4 rows beat 15's four launches by more than the spread in both
#    runs with 0 words != v15 wherever 16's B = 1 row is "= v15". Predicted: sliding ~129 -> ~85 us (512 blocks in
#    4-block clusters: 4 waves of 5 tiles + merge), full P1024 ~259 -> ~225, full P2048 ~397 -> ~375.
#  - Refuted if 16 is not faster at the sliding rows: then the partials' store and the combine launch were not
#    ~12 us of 32 (session 25's --prof) under the pass's conditions, or the DSMEM merge costs more than the ~3-5 us
#    assumed (the B = 1 rows give the merge's cost directly: 16 - (15 - store - combine)).
#  - Item 2's tests must pass for the switch values to stay (DGEMMA_ATTN=16 / 18 behind the switch, default 15
#    unchanged); a failure of test_turbo_batch under 18 means a canvas's words depend on the stack (a defect of 18's
#    per-canvas split counts or of k_attention_batch's arguments), of test_graphs under 16 that cluster launches do not
#    replay as captured.
#  - Item 3 (if run): 16 becomes the default candidate for the next session only if both its runs' attention rows are
#    below both default runs' by more than the spread and tok/s is not lower; predicted attention 1.257 -> ~1.0 ms.
# Usage: DG_CALL_S=<the call's limit> bash dev/gpu/s29_at12.sh $OUT
O=${1:?usage: dev/gpu/s29_at12.sh OUT}; mkdir -p "$O"
. scripts/gpu_env.sh
T=${AT12_T:-$(call_budget 540)}
left() { echo $((T - ($(date +%s) - t0))); }
guard() {
  local l; l=$(left)
  if [ "$l" -lt "$1" ]; then echo "skip $2: $l s left, it needs $1 $(el)" | tee -a "$O/log.txt"; return 1; fi
}
lim() { local l; l=$(($(left) - 10)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
: > "$O/lab.md"; : > "$O/tests.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv | tee -a "$O/log.txt"
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/libdgemma.a > /tmp/at12_build.txt 2>&1
echo "library rc $? $(el)" | tee -a "$O/log.txt"
nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc $XC -Xptxas -v dev/cuda/attention.cu \
  build/libdgemma.a -L"$CUL" $NXL -lcublas -lcudart -o build/attention_lab > /tmp/at12_ptxas.txt 2>&1 &
lb=$!
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/tests/test_cuda > /tmp/at12_build_t.txt 2>&1 &
tb=$!
wait $lb; r=$?
echo "lab rc $r $(el)" | tee -a "$O/log.txt"
grep -A3 "Compiling entry.*att_wq" /tmp/at12_ptxas.txt | grep -E "entry|Used|spill" > "$O/ptxas.txt"
[ $r = 0 ] || tail -20 /tmp/at12_ptxas.txt >> "$O/ptxas.txt"
echo "att_wq*_kernel entries without spills: $(grep -c '0 bytes spill stores' "$O/ptxas.txt") of $(grep -c entry "$O/ptxas.txt")" | tee -a "$O/log.txt"
# 1. the lab, twice (each run ~20-30 s: ceilings, 4 rows x (4 versions at B 1 + 4 at B 4) x 32 launches, checks)
for run in 1 2; do
  [ $r = 0 ] || break
  guard 45 "lab run $run" || break
  timeout "$(lim 90)" build/attention_lab --decoder --versions 15,16,17,18 --batch 4 --reps 30 > /tmp/at12_lab.md 2>&1
  echo "lab run $run rc $? $(el)" | tee -a "$O/log.txt"
  { echo "## run $run (--decoder --versions 15,16,17,18 --batch 4 --reps 30)"; cat /tmp/at12_lab.md; } >> "$O/lab.md"
  grep -E "^\| decoder|^# " /tmp/at12_lab.md | cut -c1-200 | tee -a "$O/log.txt"
done
# 2. test_attention 15-18 on sm_90a
wait $tb; echo "test_cuda build rc $? $(el)" | tee -a "$O/log.txt"
for k in 15 16 17 18; do
  guard 20 "test_attention case $k" || break
  DG_TEST_CASE=$k DG_TEST_FILTER=test_attention timeout "$(lim 60)" build/tests/test_cuda >> "$O/tests.txt" 2>&1
  echo "test_attention case $k rc $? $(el)" | tee -a "$O/log.txt"
done
tst() { # NAME ENV FILTER: build/tests/test_cuda under ENV (VAR=VALUE or -) with DG_TEST_FILTER, into tests.txt
  local rc
  guard 25 "$1" || return 1
  { echo; echo "## $1: $2 DG_TEST_FILTER=$3 build/tests/test_cuda"; } >> "$O/tests.txt"
  if [ "$2" = - ]; then DG_TEST_FILTER=$3 timeout "$(lim 90)" build/tests/test_cuda >> "$O/tests.txt" 2>&1
  else env "$2" DG_TEST_FILTER=$3 timeout "$(lim 90)" build/tests/test_cuda >> "$O/tests.txt" 2>&1; fi
  rc=$?
  echo "test $1 rc $rc $(el)" | tee -a "$O/log.txt"
}
tst batch - test_attention_batch
tst choice - test_attention_choice
tst batch_18 DGEMMA_ATTN=18 test_turbo_batch
tst graphs_16 DGEMMA_ATTN=16 test_graphs
grep -hE "^# attention|^# cuda (batch|graphs)|FAIL|ERROR" "$O/tests.txt" | cut -c1-220 | tee -a "$O/log.txt"
# 3. the vllm A/B (optional)
if [ "${AT12_BENCH:-0}" = 1 ] && [ -f /tmp/dg26b.ok ]; then
  make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/dgemma build/libdgemma_cuda.so > /tmp/at12_build_b.txt 2>&1
  echo "dgemma build rc $? $(el)" | tee -a "$O/log.txt"
  : > "$O/bench.txt"
  for e in - DGEMMA_ATTN=16 - DGEMMA_ATTN=16; do
    guard 60 "vllm $e" || break
    { echo; echo "## $e build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 3 --profile"; } >> "$O/bench.txt"
    if [ "$e" = - ]; then timeout "$(lim 90)" build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 3 --profile >> "$O/bench.txt" 2>&1
    else env "$e" timeout "$(lim 90)" build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 3 --profile >> "$O/bench.txt" 2>&1; fi
    echo "vllm $e rc $? $(el)" | tee -a "$O/log.txt"
  done
  grep -E "^## |attention version|^\| vllm \| filler|^\| attention \|" "$O/bench.txt" | cut -c1-200 | tee -a "$O/log.txt"
fi
echo "done $(el)" | tee -a "$O/log.txt"
