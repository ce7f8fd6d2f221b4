#!/usr/bin/env bash
# fuzz.sh BUILD SECONDS MODE [NAME...]: run the libFuzzer harnesses of fuzz/
# (built by `make fuzz-build` into BUILD) for SECONDS each, one after the other.
#   MODE grow: new inputs are kept in BUILD/corpus/NAME (`make fuzz`);
#   MODE test: a fresh temporary corpus, removed afterwards (`make test`).
# Inputs: BUILD/corpus/NAME (grow only), BUILD/seeds/NAME, fuzz/regress/NAME;
# dictionary BUILD/seeds/NAME.dict. Logs: BUILD/logs/NAME.log; a crash, leak,
# timeout or out-of-memory input goes to BUILD/crash/NAME-*. NAME defaults to
# every BUILD/fuzz_* binary. One line per harness:
#   "fuzz: NAME ok: E executions in S s (R/s), cov C, ft F, corpus K inputs, peak RSS M MB"
# (grow mode adds a line of covered/total edges per source file the corpus reaches,
# from one more pass with -print_coverage; full list in BUILD/logs/NAME.cov)
# or "fuzz: NAME FAILED (...)". Exit status 1 if any failed.
# FUZZ_JOBS=N runs N harnesses at a time (default 1). Extra libFuzzer flags: FUZZ_FLAGS
# (FUZZ_FLAGS=-runs=10000000 stops a harness at 10 M executions or SECONDS,
# whichever comes first; S in the line is the wall time the harness really ran).
set -u
cd "$(dirname "$0")/.."
build=$1; secs=$2; mode=$3; shift 3
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for b in "$build"/fuzz_*; do [ -x "$b" ] && case "$b" in *.d|*.o) ;; *) names+=("$(basename "$b")");; esac; done
fi
mkdir -p "$build/logs" "$build/crash"
tmp=""
[ "$mode" = test ] && tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT

run_one() {
  local name=$1 short=${1#fuzz_} corpus dirs=()
  if [ "$mode" = grow ]; then corpus="$build/corpus/$short"; else corpus="$tmp/$short"; fi
  mkdir -p "$corpus"
  dirs+=("$corpus")
  [ -d "$build/seeds/$short" ] && dirs+=("$build/seeds/$short")
  [ -d "fuzz/regress/$short" ] && dirs+=("fuzz/regress/$short")
  local dict=()
  [ -s "$build/seeds/$short.dict" ] && dict=(-dict="$build/seeds/$short.dict")
  local log="$build/logs/$short.log"
  echo "$build/$name -max_total_time=$secs -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 ${dict[*]} -artifact_prefix=$build/crash/$short- ${FUZZ_FLAGS:-} ${dirs[*]}" > "$log"
  local t0 t1 el
  t0=$(date +%s)
  # shellcheck disable=SC2086
  "$build/$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${dict[@]}" \
    -artifact_prefix="$build/crash/$short-" ${FUZZ_FLAGS:-} "${dirs[@]}" >> "$log" 2>&1
  local rc=$?
  t1=$(date +%s); el=$((t1 - t0))
  local execs done_line
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  done_line=$(grep -E '^#[0-9]+.*(DONE|REDUCE|NEW|pulse|INITED)' "$log" | tail -1)
  local cov ft corp rss
  cov=$(echo "$done_line" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
  ft=$(echo "$done_line" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
  corp=$(echo "$done_line" | sed -n 's/.* corp: \([0-9]*\).*/\1/p')
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
  if [ $rc -eq 0 ] && [ -n "$execs" ]; then
    echo "fuzz: $name ok: $execs executions in $el s ($((execs / (el > 0 ? el : 1)))/s), cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?} inputs, peak RSS ${rss:-?} MB"
    if [ "$mode" = grow ]; then
      # edges covered by the grown corpus in each source file it reaches (one pass, -print_coverage)
      "$build/$name" -runs=0 -print_coverage=1 "$corpus" 2>&1 | grep -E '^(UN)?COVERED_FUNC' > "$build/logs/$short.cov"
      awk '{split($5, e, "/"); f=$NF; sub(":[0-9]+$", "", f); sub(".*/(src|tools)/", "", f);
            if (f ~ /fuzz_/) next; t[f]+=e[2]; if ($1 == "COVERED_FUNC:") {h[f]++; c[f]+=e[1]; r[f]+=e[2]}}
           END {for (f in t) if (h[f]) printf "%s %d/%d edges of %d functions reached (%d in the file)\n",
                f, c[f], r[f], h[f], t[f]}' "$build/logs/$short.cov" |
        sort | paste -sd ',' - | sed 's/,/, /g; s/^/      coverage: /'
    fi
  else
    local why
    why=$(tail -n +2 "$log" | grep -m1 -E '^==[0-9]+==ERROR|runtime error|property broken|out-of-memory|timeout' | cut -c1-200)
    echo "fuzz: $name FAILED (exit $rc: ${why:-see $log}; input in $build/crash/$short-*; log $log)"
    return 1
  fi
}

fail=0
jobs=${FUZZ_JOBS:-1}
if [ "$jobs" -le 1 ]; then
  for n in "${names[@]}"; do run_one "$n" || fail=1; done
else
  pids=(); outs=()
  for n in "${names[@]}"; do
    o=$(mktemp); outs+=("$o")
    run_one "$n" > "$o" & pids+=($!)
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 1; done
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || fail=1; cat "${outs[$i]}"; rm -f "${outs[$i]}"; done
fi
exit $fail
