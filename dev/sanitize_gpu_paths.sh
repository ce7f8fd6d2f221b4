#!/usr/bin/env bash
# sanitize_gpu_paths.sh: scripts/sanitize_gpu.sh's SAN_RUN / SAN_LAYERS paths without a GPU, with stubs for make,
# compute-sanitizer and build/dgemma (its mkrandom writes only a config.json, and fails when --config names a missing
# file or --source has no tokenizer.json, as the real one does) and gunzip (slow to start), in a private /tmp (the
# script's paths /tmp/dg26b, /tmp/dgL, /tmp/cfgL.json are fixed):
# needs root and unshare(1). Prints one line per case and exits 1 if any case is wrong. Cases: SAN_LAYERS=2 with
# SAN_RUN on /tmp/dgL and on /tmp/dg26b (the second had no /tmp/cfgL.json before review19: mkrandom failed), SAN_LAYERS=4,
# SAN_LAYERS=4 then 2 on one machine (a warm machine's /tmp/dgL of 4 layers was taken for the 2-layer cut), three tools'
# runs started together on a fresh machine (session 20: they raced on /tmp/cfgL.json; review20: on the tokenizer one
# of them was still unpacking), SAN_FILTER=cases against the tests of test_cuda.c that loop over cases, SAN_PAR=all with
# a test that skips (NOT-PASSED) and SAN_DEADLINE.
#   sudo dev/sanitize_gpu_paths.sh
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
exec unshare -m --propagation private bash -s "$SRC" <<'EOS'
set -u
SRC=$1
mount -t tmpfs none /tmp || exit 1
H=/tmp/h; R=/tmp/repo; mkdir -p $H/bin $R/scripts $R/dev $R/tests $R/build $R/.devdata/gemma3 $R/.cache
cp "$SRC"/scripts/sanitize_gpu.sh "$SRC"/scripts/gpu_env.sh $R/scripts/; cp "$SRC"/dev/cfg_26b_2layers.json $R/dev/
cp "$SRC"/tests/test_cuda.c $R/tests/; echo "{}" | gzip > $R/.devdata/gemma3/tokenizer.json.gz
printf '#!/bin/bash\nexit 0\n' > $H/bin/make; cp $H/bin/make $H/bin/cc
# gunzip slow to start: gpu_tokenizer's tokenizer.json then exists, empty, for a while (its redirection made it)
printf '#!/bin/bash\nsleep 0.5; exec %s "$@"\n' "$(command -v gunzip)" > $H/bin/gunzip
cat > $H/bin/compute-sanitizer <<'EOF'
#!/bin/bash
while [ $# -gt 0 ] && [[ "$1" != */dgemma ]] && [[ "$1" != */test_cuda ]]; do shift; done # the application and its
# arguments, run as the tool would
"$@" || exit 1
echo "========= ERROR SUMMARY: 0 errors"
EOF
cat > $R/build/dgemma <<'EOF'
#!/bin/bash
[ "$1" = run ] && { [ -f "$3/config.json" ] || { echo "dgemma: cannot load model $3" >&2; exit 1; }; exit 0; }
[ "$1" = mkrandom ] || exit 0
out=$2; shift 2; cfg=""; src=""
while [ $# -gt 0 ]; do [ "$1" = --config ] && cfg=$2; [ "$1" = --source ] && src=$2; shift; done
[ -z "$cfg" ] || [ -f "$cfg" ] || { echo "mkrandom: cannot open $cfg" >&2; exit 1; }
[ -s "$src/tokenizer.json" ] || { echo "mkrandom: no tokenizer in '$src' (empty or missing)" >&2; exit 1; }
mkdir -p "$out"; sleep 0.3 # a model being written: its directory there, no config.json yet
if [ -n "$cfg" ]; then cp "$cfg" "$out/config.json"; else python3 -c 'import json; print(json.dumps({"text_config":
  {"num_hidden_layers": 30, "layer_types": ["sliding_attention"] * 29 + ["full_attention"]}}))' > "$out/config.json"; fi
EOF
mkdir -p $R/build/tests; cat > $R/build/tests/test_cuda <<'EOF'
#!/bin/bash
echo "[==========] Running 1 test(s)."; echo "[ RUN      ] $DG_TEST_FILTER" # test_branch skips (rc 0, as cmocka)
if [ "$DG_TEST_FILTER" = test_branch ]; then echo "[  SKIPPED ] test_branch"; echo "[  PASSED  ] 0 test(s)."
else echo "[       OK ] $DG_TEST_FILTER"; echo "[  PASSED  ] 1 test(s)."; fi
EOF
chmod +x $H/bin/* $R/build/dgemma $R/build/tests/test_cuda
export PATH=$H/bin:$PATH
bad=0
layers() { python3 -c 'import json; print(json.load(open("/tmp/dgL/config.json"))["text_config"]["num_hidden_layers"])' 2>/dev/null; }
case1() { # NAME WANT_LAYERS SAN_LAYERS SAN_RUN's model
  SAN_LAYERS=$3 SAN_RUN="run -m $4 --device cuda -p hi" SAN_TOOLS=memcheck bash $R/scripts/sanitize_gpu.sh /tmp/out > /tmp/o.txt 2>&1
  local rc=$? got; got=$(layers)
  if [ $rc = 0 ] && [ "$got" = "$2" ]; then echo "ok   $1"; else echo "FAIL $1: rc $rc, /tmp/dgL layers '$got' (want $2): $(tail -1 /tmp/o.txt)"; bad=1; fi
}
case1 "SAN_LAYERS=2, SAN_RUN on /tmp/dgL" 2 2 /tmp/dgL
rm -rf /tmp/dgL /tmp/dg26b /tmp/cfgL.json
case1 "SAN_LAYERS=2, SAN_RUN on /tmp/dg26b" 2 2 /tmp/dg26b
rm -rf /tmp/dgL /tmp/dg26b /tmp/cfgL.json
case1 "SAN_LAYERS=4" 4 4 /tmp/dgL
case1 "SAN_LAYERS=2 after SAN_LAYERS=4 on the same machine" 2 2 /tmp/dgL
rm -rf /tmp/dgL /tmp/dg26b /tmp/cfgL.json $R/.cache/gemma3 # three runs started together, one tool each (session 20's call 3), on a
# fresh machine (no tokenizer unpacked yet): each finds the model
for t in memcheck racecheck synccheck; do
  SAN_LAYERS=2 SAN_RUN="run -m /tmp/dgL --device cuda -p hi" SAN_TOOLS=$t bash $R/scripts/sanitize_gpu.sh /tmp/out_$t > /tmp/o_$t.txt 2>&1 &
done; wait
n=$(cat /tmp/out_*/*_run.txt | grep -c "^# rc 0,")
if [ "$n" = 3 ] && [ "$(layers)" = 2 ]; then echo "ok   SAN_LAYERS=2, three tools started together"
else echo "FAIL SAN_LAYERS=2, three tools started together: $n of 3 ran (rc 0); $(grep -h "cannot load\|mkrandom:" /tmp/out_*/*_run.txt /tmp/o_*.txt | head -1)"; bad=1; fi
# SAN_FILTER=cases: the tests split into cases are exactly those of test_cuda.c that call test_case (DG_TEST_CASE)
want=$(awk '/^static void test_[a-z_0-9]*\(void \*\*state\)/ {n = $3; sub(/\(void/, "", n)} /test_case\(/ && !/^static/ {print n}' \
  "$SRC"/tests/test_cuda.c | sort -u | tr '\n' ' ')
got=$(cd $R && . scripts/gpu_env.sh && san_cases | tr ' ' '\n' | grep @ | sed 's/@.*//' \
  | sort -u | tr '\n' ' ')
if [ -n "$want" ] && [ "$want" = "$got" ]; then echo "ok   SAN_FILTER=cases splits exactly the looping tests ($(echo $got | wc -w))"
else echo "FAIL SAN_FILTER=cases: test_cuda.c loops in '$want', the script splits '$got'"; bad=1; fi
# SAN_PAR=all: a test that skips (cmocka exits 0) is marked NOT-PASSED, one that passes is not; past SAN_DEADLINE none starts
SAN_PAR=all SAN_TOOLS=memcheck SAN_FILTER="test_branch test_ctx_arena" bash $R/scripts/sanitize_gpu.sh /tmp/out_p > /tmp/o_p.txt 2>&1
s=/tmp/out_p/summary_memcheck.txt
if grep -q "^memcheck test_branch rc 0 .*NOT-PASSED" $s && grep -q "^memcheck test_ctx_arena rc 0 .*kernels: none$" $s; then
  echo "ok   SAN_PAR=all: a skipped test NOT-PASSED, a passed one clean"
else echo "FAIL SAN_PAR=all: a skipped test NOT-PASSED, a passed one clean: $(cat $s 2>/dev/null | tr '\n' '|')"; bad=1; fi
SAN_DEADLINE=$(( $(date +%s) + 5 )) SAN_PAR=all SAN_TOOLS=memcheck SAN_FILTER=test_ctx_arena bash $R/scripts/sanitize_gpu.sh /tmp/out_d \
  > /tmp/o_d.txt 2>&1
if grep -q "^memcheck test_ctx_arena rc none .*NOT-PASSED" /tmp/out_d/summary_memcheck.txt; then echo "ok   SAN_DEADLINE: nothing started past it"
else echo "FAIL SAN_DEADLINE: $(cat /tmp/out_d/summary_memcheck.txt 2>/dev/null)"; bad=1; fi
exit $bad
EOS
