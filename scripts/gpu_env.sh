# gpu_env.sh: sourced by the GPU-machine scripts (moe_gpu.sh, moe_lab_gpu.sh, sanitize_gpu.sh). Sets
#   XC, XL   make's XCFLAGS/XLDFLAGS for cJSON/cmocka (unpacked from .devdeb/ under /tmp/dgdeps when the
#            machine lacks their headers; empty otherwise)
#   NXL      the same library flags spelled for nvcc (-Xlinker)
#   CUL      the CUDA toolkit's library directory (from the nvcc on the PATH)
#   el       a function printing the seconds since the script started: "(N s)"
#   left, guard, lim, bench, one  a call script's guarded items and their logs (below; dev/gpu/s28_*.sh, s29_*.sh)
#   san_tests, san_cases  the tests of tests/test_cuda.c (below)
# and builds the kernel lab with lab_build (build/moe_quant from dev/cuda/moe_quant.cu, for sm_90a; needs build/libdgemma.a;
# LAB_LEAN=1: only versions 1-3, 40, 50, 80-94 and 95-106, built in a fraction of the time).
t0=$(date +%s)
el() { echo "($(( $(date +%s) - t0 )) s)"; }
# The call's own limit: DG_CALL_S, the seconds the device call may run (its limit_s: 600, or less where the
# session's device time left, status's budget_left_s, is less; the lead passes it, e.g. `DG_CALL_S=420 bash ...`),
# 600 if unset. call_left: the seconds left of it less a 10 s margin (for the summary lines after the last item);
# call_cap N: a timeout of N s or call_left where that is less (at least 1: `timeout 0` would mean no limit);
# call_budget N: the seconds a script plans its guarded items in: N, or DG_CALL_S - 20 where that is less.
call_left() { echo $(( ${DG_CALL_S:-600} - 10 - ($(date +%s) - t0) )); }
call_cap() { local l; l=$(call_left); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
call_budget() { local c=$(( ${DG_CALL_S:-600} - 20 )); [ "$c" -lt "$1" ] && echo "$c" || echo "$1"; }
# A call script's guarded items (dev/gpu/s28_*.sh, s29_*.sh): the script sets O (its output folder, the log
# $O/log.txt) and T (the seconds it plans its items in, e.g. T=$(call_budget 560)) after sourcing this file.
# left: the seconds left of T since the script started (t0).
left() { echo $((T - ($(date +%s) - t0))); }
# guard NEED NAME: 0 if NEED seconds are left, else the line "skip NAME: L s left, it needs NEED (N s)" in the
# log (and on stdout) and 1.
guard() {
  local l; l=$(left)
  if [ "$l" -lt "$1" ]; then echo "skip $2: $l s left, it needs $1 $(el)" | tee -a "$O/log.txt"; return 1; fi
}
# lim CAP: a command's timeout, CAP or the time left less 10 s, whichever is smaller (guard first: it can be < 1).
lim() { local l; l=$(($(left) - 10)); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
# bench NAME TIMEOUT ARGS...: build/dgemma bench ARGS -o ${TP}NAME.jsonl under timeout TIMEOUT (TP: the script's
# prefix of its /tmp files, e.g. TP=/tmp/m12_; the environment from the caller, ENVS its words for the headings),
# the output and stderr in ${TP}NAME.txt, appended to $O/step.txt under a heading, the rows to $O/bench.jsonl
# after a {"kind": "run"} line; "bench NAME rc RC (N s)" in the log; returns bench's status.
bench() {
  local name=$1 to=$2; shift 2
  rm -f ${TP}$name.jsonl
  timeout "$to" build/dgemma bench "$@" -o ${TP}$name.jsonl > ${TP}$name.txt 2>&1
  local rc=$?
  echo "bench $name rc $rc $(el)" | tee -a "$O/log.txt"
  { echo; echo "## $name: ${ENVS:-} build/dgemma bench $*"; cat ${TP}$name.txt; } >> "$O/step.txt"
  { echo "{\"kind\": \"run\", \"run\": \"$name\", \"env\": \"${ENVS:-}\", \"args\": \"$*\", \"rc\": $rc}"
    cat ${TP}$name.jsonl 2>/dev/null; } >> "$O/bench.jsonl"
  return $rc
}
# one NAME FILTER [ENV=VALUE...]: build/tests/test_cuda with DG_TEST_FILTER=FILTER under the ENV words (after
# guard 25; timeout lim 90), its output appended to $O/tests.txt under a heading, "test NAME rc RC (N s)" in the log.
one() {
  local name=$1 f=$2; shift 2
  guard 25 "test $name" || return 1
  { echo; echo "## $name: $* DG_TEST_FILTER=$f build/tests/test_cuda"; } >> "$O/tests.txt"
  env "$@" DG_TEST_FILTER="$f" timeout "$(lim 90)" build/tests/test_cuda >> "$O/tests.txt" 2>&1
  echo "test $name rc $? $(el)" | tee -a "$O/log.txt"
}
XC=""; XL=""; NXL=""
if ! echo '#include <cjson/cJSON.h>' | cc -E -x c - >/dev/null 2>&1; then
  P=/tmp/dgdeps; for f in .devdeb/*.deb; do dpkg -x "$f" $P; done; L=$P/usr/lib/x86_64-linux-gnu
  XC="-I$P/usr/include"; XL="-L$L -Wl,-rpath,$L"; NXL="-L$L -Xlinker -rpath -Xlinker $L"
fi
CUL=$(dirname "$(readlink -f "$(command -v nvcc)")")/../lib64
lab_build() { # sm_90a: the lab's wgmma versions (qmoe_w.cuh) need it
  nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a ${LAB_LEAN:+-DLAB_LEAN} -Iinclude -Isrc $XC dev/cuda/moe_quant.cu build/libdgemma.a \
    -L"$CUL" $NXL -lcublas -lcudart -lcjson -lgomp -o build/moe_quant
}
# lab_unpack: the LAB_LEAN lab carried in .devbin (moe_quant.xz, .devbin/README) as /tmp/mq, with LD_LIBRARY_PATH
# set for it (the CUDA libraries; cJSON from .devdeb, unpacked under /tmp/dgdeps if not yet).
lab_unpack() {
  [ -d /tmp/dgdeps ] || for f in .devdeb/*.deb; do dpkg -x "$f" /tmp/dgdeps; done
  export LD_LIBRARY_PATH="$CUL:/tmp/dgdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  xz -dc .devbin/moe_quant.xz > /tmp/mq && chmod +x /tmp/mq
}
# san_tests: the tests of tests/test_cuda.c, one per line, in its order; san_cases: the same with each test that loops
# over cases (DG_TEST_CASE) as TEST@K, one item per case, space-separated (sanitize_gpu.sh's SAN_FILTER=cases;
# san_sweep_gpu.sh counts them; dev/sanitize_gpu_paths.sh checks the table against the tests that call test_case).
san_tests() { grep -o "cmocka_unit_test([a-z_0-9]*)" tests/test_cuda.c | sed 's/cmocka_unit_test(//; s/)//'; }
san_cases() {
  local t
  for t in $(san_tests); do
    case $t in
      test_synth_logits|test_turbo_generate) echo $t@{0..4} ;; test_golden_logits) echo $t@{0..3} ;;
      test_replay|test_sampled) echo $t@{0..5} ;; test_attention) echo $t@{1..18} ;; test_quant_synth_logits) echo $t@{0..2} ;;
      *) echo $t ;;
    esac
  done | tr '\n' ' '
}
# gpu_tokenizer: the Gemma tokenizer (carried gzipped in .devdata) unpacked into .cache/gemma3, mkrandom's --source.
gpu_tokenizer() {
  mkdir -p .cache/gemma3
  [ -f .cache/gemma3/tokenizer.json ] || gunzip -c .devdata/gemma3/tokenizer.json.gz > .cache/gemma3/tokenizer.json
}
# gpu_build LOG: make all and tests/test_cuda with CUDA, the output in LOG; on failure its tail and status 1.
gpu_build() {
  make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" all build/tests/test_cuda > "$1" 2>&1 || { tail -30 "$1"; return 1; }
}
# gpu_mkrandom_cpu_bg LOG: a CPU-only CLI in build-c (so that it needs no CUDA build: it runs beside one) writing the
# 26B-A4B random checkpoint /tmp/dg26b in the background, "mkrandom rc N (T s)" appended to LOG (the CLI's build
# in /tmp/build_c.txt, mkrandom's output in /tmp/mkrandom.log); mk = the job's pid, for `wait $mk`.
# A checkpoint written whole by an earlier call on the same warm machine (/tmp/dg26b.ok, made after mkrandom
# succeeded) is kept: "mkrandom kept" is logged instead, and the job ends at once.
gpu_mkrandom_cpu_bg() {
  ( if [ -f /tmp/dg26b.ok ] && [ -f /tmp/dg26b/config.json ]; then echo "mkrandom kept (/tmp/dg26b.ok) $(el)" >> "$1"; exit 0; fi
    rm -f /tmp/dg26b.ok
    gpu_tokenizer
    make -j4 CUDA=0 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" BUILD=build-c build-c/dgemma > /tmp/build_c.txt 2>&1 &&
    build-c/dgemma mkrandom /tmp/dg26b --source .cache/gemma3 -t 4 > /tmp/mkrandom.log 2>&1
    r=$?; [ $r = 0 ] && touch /tmp/dg26b.ok
    echo "mkrandom rc $r $(el)" >> "$1" ) &
  mk=$!
}
# gpu_mkrandom_bg [THREADS]: the 26B-A4B random checkpoint /tmp/dg26b written in the background unless it is
# there (log /tmp/mkrandom.log); mk = the job's pid, for `wait $mk`.
gpu_mkrandom_bg() {
  gpu_tokenizer
  [ -f /tmp/dg26b/config.json ] || (build/dgemma mkrandom /tmp/dg26b --source .cache/gemma3 -t "${1:-8}" > /tmp/mkrandom.log 2>&1) &
  mk=$!
}
