#!/bin/bash
# Session 28's call for issue 12's prefill line (helper pp12; docs/cuda.md "Session 28 (helper pp12): where a
# 1024-token prefill's 40 ms go"): where the 40.65 ms of a 1,024-token prefill go (H100, session 28's run of
# dev/gpu/s27_au12.sh), stage by stage, and whether the larger encoder chunk that the arithmetic points to
# (DGEMMA_ENC_CHUNK, a switch since session 10) takes most of it. One command, carry `.devdeb .devdata/gemma3`, default
# kind (H100); < 120 s on a warm machine that holds /tmp/dg26b and an earlier build/ (a fresh one: the build
# ~260 s beside mkrandom ~155 s, then the items: ~420 s; give it DG_CALL_S). Items after the build run under a guard
# of the time left (PP12_T, default 540 s or DG_CALL_S - 20) and their own timeouts, in order of value:
#   0. build/dgemma, build/libdgemma_cuda.so and build/tests/test_cuda (the library make line of s27_au12.sh: no
#      CUDA_ARCH, the Makefile's sm_90a + compute_90), beside it /tmp/dg26b by the CPU CLI (gpu_mkrandom_cpu_bg);
#   1. tests: test_profile_encode (default chunk, then DGEMMA_ENC_CHUNK=1024 and 64), test_profile (default and 1024), and
#      test_synth_logits under DGEMMA_ENC_CHUNK=1024 (the candidate's logits against the CPU's, 700-token prompt in
#      one chunk);
#   2. `bench -m /tmp/dg26b --device cuda --protocol step --contexts 1024,8192 --reps 3 --profile` at the default
#      chunk (256): the step rows and the first P's prefill split into stages (the profile is one more prefill, not
#      in the rows);
#   3. the same with DGEMMA_ENC_CHUNK=1024 (the candidate); 4. with DGEMMA_ENC_CHUNK=512 only with PP12_ALL=1 (each
#      bench ~35-40 s, most of it the 26B's load: session 28's step3 of 1024,8192 took 39 s; items 1-3 ~100 s warm).
# Files back (5): log.txt, build_tail.txt, tests.txt, step.txt (items 2-4, each run's whole output), bench.jsonl
# (every JSON row, each run's after a {"kind": "run"} line).
#
# The rule, written before any GPU run (the prediction is docs/cuda.md's table):
#  - The prediction holds if item 2's profile has experts as the largest stage at 18-28 ms (predicted ~23.4: four
#    streams of the 12.4 GB of 4-bit experts at M 16), q/k/v + o-proj + dense MLP 8-14 ms (predicted ~11.3),
#    attention under 5 ms, the stages summing to 80-100 % of the profiled dg_encode's wall. It is refuted by
#    experts under 18 ms (the chunks do not pay the expert stream each) or attention over 5 ms (attention, not the
#    experts, is the encoder's problem).
#  - The candidate (DGEMMA_ENC_CHUNK=1024) is worth proposing as the default if, in this call, (a) item 1's
#    test_synth_logits passes under it, (b) its P 1024 prefill median is <= 0.80 x item 2's (predicted ~25-27
#    against ~40.6 ms; the spreads of session 28's runs were 0.2 %), (c) its P 1024 and 8192 step medians are within
#    3 % of item 2's (the decoder pass does not change; only the sliding rings grow by 768 slots) and (d) its device
#    GiB (context held) at P 8192 is within 0.5 GiB of item 2's (the rings +0.16 GB, the work buffers for 1,024
#    rows). 512 (PP12_ALL=1; predicted ~31-32 ms) is the fallback if 1,024 fails (c) or (d).
#  - Either way the 16 ms line is not met by the chunk alone: predicted ~25 ms at 1,024, the experts at 64 rows per
#    expert then ~13.8 ms (the ceiling's M 64, 30 % of the roofline) are the next wall.
# Usage: DG_CALL_S=<the call's limit> bash dev/gpu/s28_pp12.sh $OUT
O=${1:?usage: dev/gpu/s28_pp12.sh OUT}; mkdir -p "$O"
. scripts/gpu_env.sh
T=${PP12_T:-$(call_budget 540)}
# left, guard and lim: scripts/gpu_env.sh; bench and tst are this script's own (an ENV argument, "-" for none)
# bench NAME TIMEOUT ENV ARGS...: ENV (VAR=VALUE or "-") then build/dgemma bench ARGS -o /tmp/pp12_NAME.jsonl, its
# output appended to step.txt under a heading, its rows to bench.jsonl after a run line
bench() {
  local name=$1 to=$2 env=$3; shift 3
  rm -f /tmp/pp12_$name.jsonl
  if [ "$env" = - ]; then timeout "$to" build/dgemma bench "$@" -o /tmp/pp12_$name.jsonl > /tmp/pp12_$name.txt 2>&1
  else env "$env" timeout "$to" build/dgemma bench "$@" -o /tmp/pp12_$name.jsonl > /tmp/pp12_$name.txt 2>&1; fi
  local rc=$?
  echo "bench $name ($env) rc $rc $(el)" | tee -a "$O/log.txt"
  { echo; echo "## $name: $env build/dgemma bench $*"; cat /tmp/pp12_$name.txt; } >> "$O/step.txt"
  { echo "{\"kind\": \"run\", \"run\": \"$name\", \"env\": \"$env\", \"args\": \"$*\", \"rc\": $rc}"
    cat /tmp/pp12_$name.jsonl 2>/dev/null; } >> "$O/bench.jsonl"
  return $rc
}
# tst NAME ENV FILTER: build/tests/test_cuda under ENV with DG_TEST_FILTER, its output to tests.txt
tst() {
  local env=$2 filt=$3 rc
  { echo; echo "## $1: $env DG_TEST_FILTER=$filt build/tests/test_cuda"; } >> "$O/tests.txt"
  if [ "$env" = - ]; then DG_TEST_FILTER=$filt timeout "$(lim 60)" build/tests/test_cuda >> "$O/tests.txt" 2>&1
  else env "$env" DG_TEST_FILTER=$filt timeout "$(lim 60)" build/tests/test_cuda >> "$O/tests.txt" 2>&1; fi
  rc=$?
  echo "test $1 rc $rc $(el)" | tee -a "$O/log.txt"
}
rm -f /tmp/pp12_*.txt /tmp/pp12_*.jsonl
: > "$O/step.txt"; : > "$O/tests.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv | tee -a "$O/log.txt"
gpu_mkrandom_cpu_bg "$O/log.txt"
make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/dgemma build/libdgemma_cuda.so build/tests/test_cuda \
  > /tmp/build.txt 2>&1
echo "build rc $? $(el)" | tee -a "$O/log.txt"; tail -3 /tmp/build.txt > "$O/build_tail.txt"
echo "nvflags: $(cat build/.nvflags 2>/dev/null)" >> "$O/log.txt"
# 1. tests (while mkrandom may still run on the host's cores: these are correctness checks, not timings)
if guard 60 "tests"; then
  tst encode_256 - test_profile_encode
  tst encode_1024 DGEMMA_ENC_CHUNK=1024 test_profile_encode
  tst encode_64 DGEMMA_ENC_CHUNK=64 test_profile_encode
  tst profile - test_profile
  tst profile_1024 DGEMMA_ENC_CHUNK=1024 test_profile
  tst synth_1024 DGEMMA_ENC_CHUNK=1024 test_synth_logits
fi
wait $mk; tail -1 /tmp/mkrandom.log >> "$O/log.txt"
# 2-4. the step protocol with the prefill's profile, default chunk, then the candidate, then 512
guard 40 "step, chunk 256" && bench c256 "$(lim 90)" - -m /tmp/dg26b --device cuda --protocol step \
  --contexts 1024,8192 --reps 3 --profile
guard 40 "step, chunk 1024" && bench c1024 "$(lim 90)" DGEMMA_ENC_CHUNK=1024 -m /tmp/dg26b --device cuda \
  --protocol step --contexts 1024,8192 --reps 3 --profile
[ "${PP12_ALL:-0}" = 1 ] && guard 40 "step, chunk 512" && bench c512 "$(lim 90)" DGEMMA_ENC_CHUNK=512 -m /tmp/dg26b --device cuda \
  --protocol step --contexts 1024,8192 --reps 3 --profile
grep -hE "^# encoder profile|^\[  (PASSED|FAILED)|^\[  FAILED" "$O/tests.txt" | tee -a "$O/log.txt"
grep -hE "^\| (1024|8192) \||^step --profile|^\| (experts|all|attention|q/k/v) " "$O/step.txt" | cut -c1-240 | tee -a "$O/log.txt"
echo "done $(el)" | tee -a "$O/log.txt"
