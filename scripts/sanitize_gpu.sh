#!/usr/bin/env bash
# sanitize_gpu.sh OUT: compute-sanitizer (memcheck, then racecheck) over tests of tests/test_cuda on the GPU
# machine (carry .devdeb); logs in OUT. SAN_FILTER: the DG_TEST_FILTER pattern (default: the quantized MoE), a space-separated list;
# SAN_TOOLS: the tools (default "memcheck racecheck"; also initcheck, synccheck); SAN_T: seconds per run (default 120).
# SAN_RUN: instead of the tests, `build/dgemma $SAN_RUN` under each tool (e.g. "run -m /tmp/dg26b --device cuda -p hi
# -n 256 -s 1": the 26B random checkpoint, written by mkrandom first if missing; logs OUT/TOOL_run.txt); SAN_OPTS: more
# compute-sanitizer options, for the tests too (e.g. "--launch-count 1200": the first launches checked, the rest run
# unchecked; "--kernel-name-exclude kns=nvjet --kernel-name-exclude kns=cublasLt": cuBLAS's kernels run unchecked, for
# initcheck and synccheck (initcheck does not see the nvjet kernels' stores, so cuBLAS's split-K reduction reads its own
# workspace "uninitialized"; synccheck then finishes a 26B step in 26 s where it hung; session 20), never for racecheck
# (excluding them there makes the nvjet kernels fault: "The Sanitizer failed to handle a hardware exception", session 20;
# racecheck's reports in them are the false positive of their asynchronous shared-memory pipelines, sessions 6-19));
# SAN_LAYERS=N: also write /tmp/dgL, the 26B config cut to N layers (the last full attention: every kernel and shape
# of a 26B step, N/30 of its launches), for SAN_RUN's "-m /tmp/dgL".
# SAN_PAR=1: every tool of SAN_TOOLS (default all four) at once, one process each, over each test of SAN_FILTER (default:
# every test of tests/test_cuda.c) one at a time, SAN_T seconds each, none started after SAN_END s (default 480);
# SAN_PAR=all: every (tool, test) pair in a process of its own, all at once (16 cores: ~30 processes ran well, 74 in
# session 20), at most SAN_JOBS (default 80) at a time: each holds a CUDA context and the tool's device memory.
# SAN_FILTER=cases: every test of tests/test_cuda.c, each looping test as its cases TEST@K (san_cases, gpu_env.sh: 67 items
# at 37 tests; dev/sanitize_gpu_paths.sh checks the table against the tests that call test_case).
# A SAN_FILTER item TEST@K runs case K of a test that loops over cases (DG_TEST_CASE, tests/test_cuda.c), e.g.
# "test_replay@0 test_replay@1 ... test_replay@5" (2 x fixture + mode; test_sampled: 3 x fixture + seed - 1). OUT/summary_TOOL.txt, and the logs (the first 20 KB of each) in
# OUT/san_logs.tgz (few files come back from a call). An item's summary line ends in "NOT-PASSED" when its log has no
# passed test or a skipped one (cmocka exits 0 when a test skips, e.g. need_gpu() finding no usable device, or when the
# filter matches none: rc 0 without it checked nothing).
# SAN_DEADLINE: a time (seconds since the epoch) no run may pass: each run's limit is the lesser of SAN_T and the time
# left, and a run with less than 10 s left is not started ("rc none"), so that a call's summary comes back in time.
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/sanitize_gpu.sh OUT}
mkdir -p "$OUT"
. scripts/gpu_env.sh
san_t() { # the seconds a run may take: SAN_T, or less to end by SAN_DEADLINE; status 1 when under 10 s are left of it
  local t=${SAN_T:-120} left; [ -z "${SAN_DEADLINE:-}" ] && { echo "$t"; return 0; }
  left=$(( SAN_DEADLINE - $(date +%s) )); [ "$left" -lt "$t" ] && t=$left
  echo "$t"; [ "$left" -ge 10 ]
}
san_kernels() { # LOG: "kernels: N NAME, ..." for the device code each report of LOG points at (racecheck's "Race
  # reported between Read access at KERNEL" once per report, not its Write peers, review20; its hazard lines' threads;
  # the others' "at KERNEL"), so that reports inside cuBLAS and inside dgemma's kernels are told apart
  grep -E "^=========  .*(Thread \([0-9,]+\) at |on access by )|^=========     at |^========= .*Race reported between [A-Za-z]+ access at " "$1" \
    | sed -E 's/.*on access by ([A-Za-z]+).*/host-API:\1/; s/.* at //; s/^void //; s/[<(].*//; s/\+0x[0-9a-f]+.*//' \
    | sort | uniq -c | sort -rn | awk '{printf "%s%d %s", (NR > 1 ? ", " : "kernels: "), $1, $2} END {if (!NR) printf "kernels: none"}'
}
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/tests/test_cuda > /tmp/san_build.txt 2>&1 || { tail -20 /tmp/san_build.txt; exit 1; }
if [ -n "${SAN_RUN:-}" ]; then
  gpu_build /tmp/san_build_all.txt || exit 1
  # the full 26B checkpoint: for a SAN_RUN naming it, and as the source of a cut other than the committed 2-layer one
  # one writer of .cache/gemma3, /tmp/dg26b, /tmp/cfgL.json and /tmp/dgL at a time: runs started together (one tool
  # each) otherwise read each other's half-written config, remove the model under each other and find none (session 20),
  # or take the tokenizer another run is still unpacking (gpu_tokenizer tests only that the file exists; review20)
  exec 8> /tmp/dgL.lock; flock 8
  if [ "${SAN_LAYERS:-}" != 2 ] || [[ "$SAN_RUN" == */tmp/dg26b* ]]; then gpu_mkrandom_bg 16; wait $mk; else gpu_tokenizer; fi
  case "${SAN_LAYERS:-}" in # /tmp/cfgL.json: the 26B's shapes cut to SAN_LAYERS layers (the last one full attention)
  "") ;;
  2) cp dev/cfg_26b_2layers.json /tmp/cfgL.json ;;
  *) python3 - "$SAN_LAYERS" <<'PY'
import json, sys
n = int(sys.argv[1]); c = json.load(open("/tmp/dg26b/config.json")); t = c["text_config"]
t["num_hidden_layers"] = n; t["layer_types"] = t["layer_types"][:n - 1] + ["full_attention"]
for k in ("quantization", "quantization_config"): c.pop(k, None)
json.dump(c, open("/tmp/cfgL.json", "w"), indent=1)
PY
  ;;
  esac
  if [ -n "${SAN_LAYERS:-}" ]; then # /tmp/dgL from /tmp/cfgL.json (a warm machine's of another N rewritten)
    cmp -s /tmp/cfgL.json /tmp/dgL/config.json.cfgL || rm -rf /tmp/dgL
    [ -f /tmp/dgL/config.json ] || build/dgemma mkrandom /tmp/dgL --config /tmp/cfgL.json --source .cache/gemma3 -t 16 \
      > /tmp/mkL.log 2>&1 && cp /tmp/cfgL.json /tmp/dgL/config.json.cfgL || { tail -3 /tmp/mkL.log; exit 1; }
    tail -1 /tmp/mkL.log
  fi
  flock -u 8; exec 8>&-
  for tool in ${SAN_TOOLS:-memcheck racecheck}; do
    log="$OUT/${tool}_run.txt"; s0=$(date +%s)
    t=$(san_t) || { echo "run $tool: # rc none: not started, SAN_DEADLINE"; continue; }
    { echo "# compute-sanitizer --tool $tool ${SAN_OPTS:-} build/dgemma $SAN_RUN"; timeout "$t" compute-sanitizer \
      --tool $tool ${SAN_OPTS:-} --error-exitcode 9 build/dgemma $SAN_RUN 2>&1 | cut -c1-400; echo "# rc ${PIPESTATUS[0]}, $(( $(date +%s) - s0 )) s"; } > "$log"
    echo "# $(san_kernels "$log")" >> "$log"
    echo "run $tool: $(tail -2 "$log" | head -1) $(tail -1 "$log")"; grep -E "SUMMARY|dgemma:" "$log" | tail -5
  done
  exit 0
fi
[ "${SAN_FILTER:-}" = cases ] && SAN_FILTER=$(san_cases)
if [ -n "${SAN_PAR:-}" ]; then # the tools at once on the same GPU, each test (or TEST@CASE) in a process of its own
  tests=${SAN_FILTER:-$(san_tests)}
  mkdir -p /tmp/san
  san1() { # TOOL ITEM: one test (ITEM = TEST or TEST@CASE: DG_TEST_CASE=CASE) under one tool
    local tool=$1 f=${2%@*} k="" s0 rc log t v=""; [ "$2" != "$f" ] && k=${2#*@}
    s0=$(date +%s); log="/tmp/san/${tool}_${f}${k:+_$k}.txt"
    t=$(san_t) || { echo "$tool $2 rc none 0 s not started: SAN_DEADLINE NOT-PASSED" >> "$OUT/summary_$tool.txt"; return; }
    DG_TEST_CASE="$k" DG_TEST_FILTER="$f" timeout "$t" compute-sanitizer --tool $tool ${SAN_OPTS:-} --error-exitcode 9 \
      build/tests/test_cuda > "$log.full" 2>&1; rc=$?
    grep -qE "^\[  PASSED  \] [1-9]" "$log.full" && ! grep -qE "^\[  SKIPPED \]" "$log.full" \
      || v=" NOT-PASSED (no test passed, or one skipped: not all checked)"
    { echo "# DG_TEST_CASE=$k DG_TEST_FILTER=$f compute-sanitizer --tool $tool ${SAN_OPTS:-} --error-exitcode 9 build/tests/test_cuda:" \
        "rc $rc, $(( $(date +%s) - s0 )) s$v"; echo "# kernels of the reports (the whole log): $(san_kernels "$log.full")"
      head -c 20000 "$log.full"; } > "$log"
    echo "$tool $2 rc $rc $(( $(date +%s) - s0 )) s $(grep -E "SUMMARY" "$log.full" | tail -1) $(san_kernels "$log.full")$v" \
      >> "$OUT/summary_$tool.txt"; rm -f "$log.full"
  }
  for tool in ${SAN_TOOLS:-memcheck racecheck initcheck synccheck}; do
    if [ "$SAN_PAR" = all ]; then for f in $tests; do # every (tool, test) pair at once, at most SAN_JOBS running
        while [ "$(jobs -rp | wc -l)" -ge "${SAN_JOBS:-80}" ]; do wait -n; done; san1 $tool $f & done
    else ( for f in $tests; do san1 $tool $f
        [ "$(( $(date +%s) - t0 ))" -gt "${SAN_END:-480}" ] && { echo "$tool: stopped at the time limit" >> "$OUT/summary_$tool.txt"; break; }
      done ) & fi
  done
  wait; cat "$OUT"/summary_*.txt; tar -czf "$OUT/san_logs.tgz" -C /tmp san; exit 0
fi
for f in ${SAN_FILTER:-test_quant_experts}; do
for tool in ${SAN_TOOLS:-memcheck racecheck}; do
  log="$OUT/${tool}_$(echo "$f" | tr -c "A-Za-z0-9_\n" x).txt" # no * in a file name (they do not come back)
  DG_TEST_FILTER="$f" timeout ${SAN_T:-120} compute-sanitizer --tool $tool ${SAN_OPTS:-} --error-exitcode 9 build/tests/test_cuda \
    > "$log" 2>&1; echo "$f $tool rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK SUMMARY|INITCHECK SUMMARY|OK \]|FAILED" "$log" | tail -4
done
done
