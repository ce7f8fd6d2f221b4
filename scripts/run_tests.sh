#!/usr/bin/env bash
# run_tests.sh BUILD_DIR [BUILD_DIR...]: run every cmocka test binary found in
# BUILD_DIR/tests, print each binary's own summary, the reasons of skipped
# tests (the "# SKIP <reason>" lines of tests/testutil.h's dg_test_skip; for
# tests/python, unittest's "skipped 'REASON'", and a failing test's traceback)
# and a total line
#   "dgemma tests: N passed, M failed, K skipped (B binaries, C crashed; skipped: REASONS)".
# With FUZZ_BUILD=DIR it also runs every libFuzzer harness in DIR for
# FUZZ_TEST_SECONDS (default 3) over its seed corpus (scripts/fuzz.sh), one
# test each. Exit status is nonzero if any test failed or a binary crashed.
# TEST_JOBS=N runs N test binaries at a time (default 1; `make test`: the cores), the
# slowest first (TEST_FIRST, basenames); the output and the counts are those of one at
# a time, in the same order (each binary's output is printed once it has ended).
set -u
cd "$(dirname "$0")/.."
# Idle OpenMP threads sleep instead of spinning (what dgemma itself defaults to): spinning ones
# took CPU from the binaries running beside them and from the server threads of test_serve
# (its user time 141 s -> 56 s). test_cli checks the CLI's own default with the variable unset.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
passed=0; failed=0; skipped=0; bins=0; crashed=0
why=""   # "K in BINARY: reason" per binary with skips, "; "-separated (the total line)
whyl=""  # the same, one per line (a reason may itself hold "; ")
list=()
for dir in "$@"; do
  for t in "$dir"/tests/test_*; do
    [ -x "$t" ] && list+=("$t")
  done
done
jobs=${TEST_JOBS:-1}
case "$jobs" in ''|*[!0-9]*|0) jobs=1;; esac
# the order they start in: TEST_FIRST's binaries (the long ones, a sanitizer build's first),
# then the others as listed, so that the last to start are short
first=${TEST_FIRST:-test_serve test_cli test_bench test_turbo test_quant test_golden test_eval test_mkrandom}
order=()
for name in $first; do
  for ((d = $#; d >= 1; d--)); do
    for i in "${!list[@]}"; do
      [ "${list[$i]}" = "${!d}/tests/$name" ] && order+=("$i")
    done
  done
done
for i in "${!list[@]}"; do
  case " ${order[*]} " in *" $i "*) ;; *) order+=("$i");; esac
done
res=$(mktemp -d)
trap 'rm -rf "$res"' EXIT
# the runner: at most $jobs binaries at once, each one's output and exit status into $res
(
  for i in "${order[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    ( "${list[$i]}" > "$res/$i.out" 2>&1; echo $? > "$res/$i.part"; mv "$res/$i.part" "$res/$i.rc" ) &
  done
  wait
) &
for i in "${!list[@]}"; do
  t=${list[$i]}
  bins=$((bins+1))
  echo "== $t"
  while [ ! -f "$res/$i.rc" ]; do sleep 0.2; done
  out=$(cat "$res/$i.out"); rc=$(cat "$res/$i.rc")
  sum=$(echo "$out" | grep -E '\[  (PASSED|FAILED|  ERROR|SKIPPED)|\[  ERROR   \]|\[   LINE   \]|\[==========\]|^#|FAIL')
  echo "$sum" | head -100
  # past the first 100 lines, still every failure (a test binary with many # lines hid its FAILED line)
  echo "$sum" | tail -n +101 | grep -E '\[  (FAILED|  ERROR)|\[  ERROR   \]|\[   LINE   \]|FAIL' | head -50
  p=$(echo "$out" | grep -o '\[  PASSED  \] [0-9]*' | awk '{s+=$NF} END{print s+0}')
  f=$(echo "$out" | grep -o '\[  FAILED  \] [0-9]*' | awk '{s+=$NF} END{print s+0}')
  # cmocka's own count: "[  SKIPPED ] N test(s), listed below:" (skipped tests are not in PASSED)
  k=$(echo "$out" | grep -o '\[  SKIPPED \] [0-9]* test' | awk '{s+=$(NF-1)} END{print s+0}')
  passed=$((passed+p)); failed=$((failed+f)); skipped=$((skipped+k))
  if [ "$k" -gt 0 ]; then
    r=$(echo "$out" | sed -n 's/^# SKIP //p' | awk '!seen[$0]++' | paste -sd '|' - | sed 's/|/ | /g')
    why="${why:+$why; }$k in $t: ${r:-no reason printed}"
    whyl="$whyl  $k in $t: ${r:-no reason printed}"$'\n'
  fi
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
    crashed=$((crashed+1)); echo "$out" | tail -30; echo "!! $t exited with status $rc"
  fi
done
wait
# Python tests of the small-model tools (plain python3, no third-party packages)
if [ -d tests/python ] && ! command -v python3 >/dev/null 2>&1; then
  echo "!! python3 not found: tests/python cannot run (scripts/setup.sh installs it)"; crashed=$((crashed+1))
elif [ -d tests/python ]; then
  echo "== python3 -m unittest discover -s tests/python"
  # -v: one line per test, "... skipped 'REASON'" for a skip (its reason for the summary)
  pout=$(python3 -m unittest discover -s tests/python -v 2>&1); prc=$?
  # the failures' tracebacks (from unittest's first ==== line), then its count lines
  [ $prc -ne 0 ] && echo "$pout" | sed -n '/^======/,$p' | head -150
  echo "$pout" | tail -4
  pr=$(echo "$pout" | sed -n 's/^Ran \([0-9]*\) test.*/\1/p')
  pf=$(echo "$pout" | sed -n 's/^FAILED (\(.*\))/\1/p' | grep -o '\(failures\|errors\)=[0-9]*' | grep -o '[0-9]*' | awk '{s+=$1} END{print s+0}')
  ps=$(echo "$pout" | grep -o 'skipped=[0-9]*' | grep -o '[0-9]*' | awk '{s+=$1} END{print s+0}')
  bins=$((bins+1))
  pr=$(( ${pr:-0} - ps )); skipped=$((skipped+ps))
  if [ "$ps" -gt 0 ]; then
    # "test_x (module.Class.test_x) ... skipped 'no shared data'" -> "test_x: no shared data"
    r=$(echo "$pout" | sed -n "s/^\([A-Za-z0-9_]*\) (.*) \.\.\. skipped '\(.*\)'\$/\1: \2/p" | paste -sd '|' - | sed 's/|/ | /g')
    why="${why:+$why; }$ps in tests/python: ${r:-no reason printed}"
    whyl="$whyl  $ps in tests/python: ${r:-no reason printed}"$'\n'
  fi
  if [ $prc -eq 0 ]; then passed=$((passed+pr)); else failed=$((failed+${pf:-1})); passed=$((passed+pr-${pf:-1})); fi
fi
# libFuzzer harnesses of fuzz/ (make fuzz-build), FUZZ_TEST_SECONDS each over
# their seeds and fuzz/regress/: one test per harness, a crash is a failure
if [ -n "${FUZZ_BUILD:-}" ]; then
  echo "== scripts/fuzz.sh $FUZZ_BUILD ${FUZZ_TEST_SECONDS:-3} test"
  fout=$(scripts/fuzz.sh "$FUZZ_BUILD" "${FUZZ_TEST_SECONDS:-3}" test 2>&1)
  echo "$fout"
  fo=$(echo "$fout" | grep -c '^fuzz: .* ok:')
  ff=$(echo "$fout" | grep -c '^fuzz: .* FAILED')
  bins=$((bins+1)); passed=$((passed+fo)); failed=$((failed+ff))
  if [ $((fo+ff)) -eq 0 ]; then echo "!! no fuzz harness ran in $FUZZ_BUILD"; crashed=$((crashed+1)); fi
fi
if [ $skipped -gt 0 ]; then
  echo "skipped tests:"
  printf '%s' "$whyl"
fi
echo "dgemma tests: $passed passed, $failed failed, $skipped skipped ($bins binaries, $crashed crashed${why:+; skipped: $why})"
[ $failed -eq 0 ] && [ $crashed -eq 0 ] && [ $bins -gt 0 ]
