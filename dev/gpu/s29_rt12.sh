#!/bin/bash
# Session 29's call for issue 12 item 3 (helper rt12; docs/cuda.md "Session 29 (helper rt12): the router stage in one
# launch"): DGEMMA_ROUTE=one (mode 5, router_one_kernel: router_tile_kernel's product, the routing, the grouping and
# the gate/up input's copy in one launch) against the default (mode 3: router_tile_kernel + route_gr_kernel), and
# DGEMMA_ROUTE=gridp (mode 6: mode 3's two launches with route_gr_kernel's two serial tails made short, the same
# fixes mode 5 has: the copy's loads first, the placement's table loads all in flight, the last block's copy after
# its placement), which says how much of mode 5's gain is the tails and how much the one launch.
# One command, carry `.devdeb .devdata/gemma3`, default kind (H100), DG_CALL_S = the call's limit (600 if unset).
# A warm machine with an earlier build/ and /tmp/dg26b: ~300 s (the rebuild of moe.cu and its dependants ~40 s,
# tests ~60 s, the lab ~25 s, six vllm benches ~30 s each; the batch protocol and ncu only with time left); a fresh
# one builds ~260-330 s beside mkrandom (~155 s) and reaches the tests and part of the benches: then the same command
# again on the warm machine runs the rest.
# Every item after the build runs under a guard of the time left and its own timeout, in this order:
#   1. tests: test_router_route (modes 1-6: modes 5 and 6's every output word, rlog, choices, weights, the grouping,
#      and the gate/up input's copy and sums, equal to the chain's and k_group_sums_perm's, twice in a row, 7-8 shapes),
#      test_route (modes 1-3, untouched kernels but rtk_choose's new arguments), then under DGEMMA_ROUTE=one:
#      test_graphs, test_branch (the mode inside captured graphs, PDL and the concurrent dense branch: the small
#      model's router is E 8, H 256, T 64: 4 product blocks taking 2 route slots each), test_synth_logits, and
#      test_branch under DGEMMA_ROUTE=gridp;
#   2. the lab (dev/cuda/step_kernels.cu --router --reps 30): "router stage" and "+ gate/up input copy" rows, v3
#      (the default), v5 (one) and v6 (gridp), one stage after an L2 flush and 30 back to back; "0 of N words differ";
#   3. `bench -m /tmp/dg26b --device cuda --protocol vllm --reps 2 --profile`, A = the defaults, B =
#      DGEMMA_ROUTE=one, C = DGEMMA_ROUTE=gridp, in the order A B C A B C (the profile is one more run after the
#      timed reps);
#   4. with time left: `--protocol batch --canvases 1,4 --reps 2 --profile`, A then B (a stacked pass of more than
#      256 rows is past mode 5's table and runs mode 3 there: only the B = 1 and small stacks change);
#   5. with time left and ncu on the machine: `ncu --set full` of the lab's first router_tile_kernel and first
#      router_one_kernel at the 26B shape (ncu.txt): where the product's 10.4 us go against its 2.85 us of FFMA
#      (the shared-memory wavefronts per FFMA, the stall reasons), the next question once the launch count is 1;
#   6. with time left: compute-sanitizer racecheck and synccheck of test_router_route, `--kernel-name
#      kns=router_one` (router_one_kernel checked, the rest run unchecked; san.txt): the shared memory that mode 5's
#      product and routing share, its barriers.
# The rule, written before any GPU run:
#   (a) correctness, per mode: every item-1 test of it passes and the lab's v5 (v6) rows say 0 words differ; else
#       the mode stays off (fixed or deleted; the default untouched).
#   (b) a candidate X (B = one, C = gridp) qualifies if (a) holds for it and, over item 3's runs, both X "router +
#       top-k" rows are below both A rows, mean(A) - mean(X) > the larger of the two spreads (|A1 - A2|, |X1 - X2|),
#       and X's mean tok/s >= A's mean tok/s less the larger of the two tok/s spreads. The default becomes
#       (route_mode_from_env's return when unset; mode 3 kept as DGEMMA_ROUTE=grid) the qualifying candidate with
#       the lower mean router row; if both qualify and their means are within the larger of their spreads, gridp
#       (the smaller change: no new wait). Neither qualifies: the default stays mode 3.
#   (c) the prediction (docs/cuda.md's section: the route's dependent global round trips, ~0.8 us each, calibrated
#       on the lab's route_gr alone): router + top-k 0.905 -> ~0.60-0.72 ms per pass for B (one) and ~0.72-0.80
#       for C (gridp) on the H100; tok/s +1.4-2.4 % (B), +0.8-1.4 % (C); the lab's stage + copy v3 ~27 us -> v5
#       ~18-21, v6 ~20-23 us. Refuted if B's router row drops by less than 0.1 ms or the lab's v5 stage is not below
#       v3's: then the time is not where the arithmetic puts it (the product's own ~8-9 us is kept by construction).
#       B - C is then the launch boundary and the routing on 128 blocks (~3-4 us per layer).
# Files back (8): log.txt, build_tail.txt, tests.txt, lab.md, bench.txt (every bench's whole output), summary.md,
# ncu.txt (item 5), san.txt (item 6).
# Usage: DG_CALL_S=600 bash dev/gpu/s29_rt12.sh $OUT
O=${1:?usage: dev/gpu/s29_rt12.sh OUT}; mkdir -p "$O"
. scripts/gpu_env.sh
T=$(call_budget 570)
left() { echo $((T - ($(date +%s) - t0))); }
guard() {
  local l; l=$(left)
  if [ "$l" -lt "$1" ]; then echo "skip $2: $l s left, it needs $1 $(el)" | tee -a "$O/log.txt"; return 1; fi
}
lim() { local l; l=$(($(left) - 10)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
# bench NAME TIMEOUT ENV ARGS...: ENV (VAR=VALUE or "-") then build/dgemma bench ARGS, the output to bench.txt
bench() {
  local name=$1 to=$2 env=$3; shift 3
  if [ "$env" = - ]; then timeout "$to" build/dgemma bench "$@" > /tmp/rt12_$name.txt 2>&1
  else env "$env" timeout "$to" build/dgemma bench "$@" > /tmp/rt12_$name.txt 2>&1; fi
  local rc=$?
  echo "bench $name ($env) rc $rc $(el)" | tee -a "$O/log.txt"
  { echo; echo "## $name: $env build/dgemma bench $*"; cat /tmp/rt12_$name.txt; } >> "$O/bench.txt"
  return $rc
}
# one NAME FILTER [ENV=VALUE...]: build/tests/test_cuda with DG_TEST_FILTER=FILTER, output to tests.txt
one() {
  local name=$1 f=$2; shift 2
  guard 25 "test $name" || return 1
  { echo; echo "## $name: $* DG_TEST_FILTER=$f build/tests/test_cuda"; } >> "$O/tests.txt"
  env "$@" DG_TEST_FILTER="$f" timeout "$(lim 90)" build/tests/test_cuda >> "$O/tests.txt" 2>&1
  echo "test $name rc $? $(el)" | tee -a "$O/log.txt"
}
rm -f /tmp/rt12_*.txt
: > "$O/tests.txt"; : > "$O/bench.txt"; : > "$O/lab.md"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.total --format=csv | tee -a "$O/log.txt"
git log --oneline -1 | tee -a "$O/log.txt"
gpu_mkrandom_cpu_bg "$O/log.txt"
make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/dgemma build/libdgemma_cuda.so build/libdgemma.a \
  build/tests/test_cuda > /tmp/rt12_build.txt 2>&1
echo "build rc $? $(el)" | tee -a "$O/log.txt"; tail -3 /tmp/rt12_build.txt > "$O/build_tail.txt"
# the lab beside the tests (its own nvcc line: scripts/step_check_gpu.sh's)
( nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iinclude -Isrc $XC dev/cuda/step_kernels.cu build/libdgemma.a \
    -L"$CUL" $NXL -lcublas -lcudart -lcjson -lgomp -o build/step_kernels_lab > /tmp/rt12_lab_build.txt 2>&1
  echo "lab build rc $? $(el)" >> "$O/log.txt" ) &
lb=$!
# 1. tests
if [ -x build/tests/test_cuda ]; then
  one router_route test_router_route
  one route test_route
  one graphs_one test_graphs DGEMMA_ROUTE=one
  one branch_one test_branch DGEMMA_ROUTE=one
  one synth_one test_synth_logits DGEMMA_ROUTE=one
  one branch_gridp test_branch DGEMMA_ROUTE=gridp
fi
# 2. the lab's router rows (v3, v5, v6; every version's words checked against v0 inside)
wait $lb; tail -3 /tmp/rt12_lab_build.txt >> "$O/build_tail.txt"
if [ -x build/step_kernels_lab ] && guard 40 "lab"; then
  timeout "$(lim 60)" build/step_kernels_lab --router --reps 30 > "$O/lab.md" 2>&1
  echo "lab rc $? $(el)" | tee -a "$O/log.txt"
fi
# 3. the vllm A/B/C, A B C A B C
wait $mk; tail -1 /tmp/mkrandom.log >> "$O/log.txt" 2>/dev/null
if [ -f /tmp/dg26b.ok ] && [ -f /tmp/dg26b/config.json ]; then
  for i in 1 2; do
    guard 45 "vllm A $i" && bench vllmA$i "$(lim 90)" - -m /tmp/dg26b --device cuda --protocol vllm --reps 2 --profile
    guard 45 "vllm B $i" && bench vllmB$i "$(lim 90)" DGEMMA_ROUTE=one -m /tmp/dg26b --device cuda --protocol vllm \
      --reps 2 --profile
    guard 45 "vllm C $i" && bench vllmC$i "$(lim 90)" DGEMMA_ROUTE=gridp -m /tmp/dg26b --device cuda --protocol vllm \
      --reps 2 --profile
  done
  # 4. the batch protocol, A then B, with time left
  guard 120 "batch A" && bench batchA "$(lim 110)" - -m /tmp/dg26b --device cuda --protocol batch --canvases 1,4 \
    --reps 2 --profile
  guard 100 "batch B" && bench batchB "$(lim 110)" DGEMMA_ROUTE=one -m /tmp/dg26b --device cuda --protocol batch \
    --canvases 1,4 --reps 2 --profile
else
  echo "no /tmp/dg26b: the benches skipped $(el)" | tee -a "$O/log.txt"
fi
# 5. the product's counters (one launch of each kernel, ncu's replays), with time left
if command -v ncu > /dev/null && [ -x build/step_kernels_lab ] && guard 80 "ncu"; then
  for k in router_tile_kernel router_one_kernel; do
    timeout "$(lim 60)" ncu --set full -k regex:$k -c 1 build/step_kernels_lab --router --reps 1 > /tmp/rt12_ncu.txt 2>&1
    echo "ncu $k rc $? $(el)" | tee -a "$O/log.txt"
    { echo "## $k"; grep -vE "^\| |^\(v5" /tmp/rt12_ncu.txt | grep -E "^  |==PROF==|==ERROR==|==WARNING==" ; } >> "$O/ncu.txt"
  done
fi
# 6. the sanitizers on router_one_kernel (test_router_route: modes 1-6, mode 5's kernel checked)
if command -v compute-sanitizer > /dev/null && [ -x build/tests/test_cuda ]; then
  for tool in racecheck synccheck; do
    guard 60 "$tool" || break
    { echo "## compute-sanitizer --tool $tool --kernel-name kns=router_one --error-exitcode 9 (test_router_route)"
      DG_TEST_FILTER=test_router_route timeout "$(lim 120)" compute-sanitizer --tool $tool --kernel-name kns=router_one \
        --error-exitcode 9 build/tests/test_cuda 2>&1 | tail -25; echo "# rc ${PIPESTATUS[0]}"; } >> "$O/san.txt"
    echo "$tool $(tail -1 "$O/san.txt") $(el)" | tee -a "$O/log.txt"
  done
fi
# summary: the tests' verdicts, the lab's router rows, each bench's tok/s row and router / grouping / all rows
{
  echo "# s29_rt12 summary"; echo
  grep -hE "^## |^\[  (PASSED|FAILED)|^\[  FAILED|^# router" "$O/tests.txt"; echo
  grep -E "^\| router stage|^\| route|^\| router split|^\(v5" "$O/lab.md"; echo
  for r in vllmA1 vllmB1 vllmC1 vllmA2 vllmB2 vllmC2 batchA batchB; do
    [ -f /tmp/rt12_$r.txt ] || continue
    echo "## $r"
    grep -E "^\| (vllm|[14]) \||^\| (router \+ top-k|grouping|experts|all) \|" /tmp/rt12_$r.txt
  done
} > "$O/summary.md" 2>&1
cat "$O/summary.md"
echo "done $(el)" | tee -a "$O/log.txt"
