#!/bin/bash
# Session 26's call for issue 11 (helper fgb): gate/up and down in ONE launch (src/cuda/qmoe_fg.cuh qr_fg_kernel,
# lab version 114 = the backend's DGEMMA_EXPERTS_FG=1, off by default) timed in the lab and end to end. One command,
# carry `.devdeb .devdata/gemma3`, default kind (H100); about 8-9 minutes (< 560 s), in this order:
#   1. the default build (`make build/dgemma build/tests/test_cuda`, no CUDA_ARCH: sm_90a SASS + compute_90 PTX) with,
#      beside it, the lab narrowed to versions 1-3, 40, 50, 95-114 (-DLAB_ONLY_SK, sm_90a; version 114 is the
#      library's qr_fg_bits<4>, linked from build/libdgemma.a), ptxas -v of src/cuda/qmoe_fg.cu alone (fg_ptxas.txt:
#      qr_fg_kernel's registers and spills in the library's build) and a CPU CLI writing the 26B-A4B random checkpoint
#      /tmp/dg26b (gpu_mkrandom_cpu_bg);
#   2. the GPU tests of the switch (tests.txt): test_quant_experts_fg, test_quant_experts_fgb (the backend's fused
#      launch word for word the two launches', counters back at 0) and test_experts_fg_passes (a 4-bit g64 synthetic
#      model through the passes: logits word for word with the switch off / on, graph captures and replays, profile
#      marks), then with DGEMMA_EXPERTS_FG=1 in the environment: test_quant_experts, test_experts_dn_fuse,
#      test_graphs, test_profile, test_turbo_batch, test_quant_synth_logits (their models mostly do not take the
#      fused launch: they check that the switch changes nothing elsewhere);
#   3. `dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 3 --profile`, A B A B: A the default (two
#      launches, DGEMMA_DN_FUSE unset), B DGEMMA_EXPERTS_FG=1 (bench.txt; summary.md: one row per run: tok/s (median of
#      3), median s, its spread (min-max s of the 3), ms per forward, the --profile run's experts stage and "all" in
#      ms per pass);
#   4. (last, with what is left of 550 s, at most 60 s) the lab rows once: `moe_quant --bits 4 --versions 50,114
#      --ms 16 --ts 128,256 --ss 256 --reps 5` (lab.txt; fused.txt: per case version 50's gate_up+down row = the
#      backend's two launches with DGEMMA_DN_FUSE=1, and 114's = one launch, both after the L2 flush, 114 checked word
#      for word against 50 and its counters).
# Guards: each test at most 60 s and none run into the last ~200 s; a bench only with >= 45 s left.
# The rule (written before any GPU run; docs/cuda.md "Session 26 (helper fgb)"): DGEMMA_EXPERTS_FG becomes the
# default (experts_fg_on's default 1 in src/cuda/qmoe.cu) only if (a) in both pairs (runs 1-2 and 3-4) B's vllm tok/s
# median is above A's by more than the two rows' spreads (tok/s from each row's max_s and min_s), (b) B's experts
# stage (ms per pass, --profile) is below A's in both pairs, (c) every test of step 2 passes (tests.txt: no FAILED;
# test_experts_fg_passes' line with its fused launches counted and "logits words that differ 0"), and (d) every 114
# row of the lab (the skewed --ss 256 one too) reads "ok, = v50" with the counters ok. A is today's default
# (DGEMMA_DN_FUSE unset), so B's gain includes the fused down input's (session 17, H200: experts 0.04 ms per pass
# shorter, the whole not faster). Expected (fg11's arithmetic, docs/cuda.md): 6-12 % of gate/up + down at the 26B's
# canvas, ~11-23 us of ~190 us per layer, i.e. ~0.35-0.7 ms of ~14.3 ms per pass: vllm ~1,128 -> ~1,155-1,185 tok/s
# on the H100 (session 25's at15 numbers). A tie or a loss keeps the switch off (the next reading: lab 114 with
# version 110's per-block stamps); a failed test or word difference is a bug to fix before any timing counts.
# Files back (at most 8 come back from $OUT): log.txt (the build's and the lab build's tails too), tests.txt,
# fg_ptxas.txt, summary.md, bench.txt, bench.jsonl (the four runs' rows, each run after a {"kind": "run"} line),
# lab.txt, fused.txt.
# Usage: bash dev/gpu/s26_fgb.sh $OUT
O=${1:?usage: dev/gpu/s26_fgb.sh OUT}; mkdir -p "$O"
. scripts/gpu_env.sh
A="-gencode=arch=compute_90a,code=sm_90a"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a "$O/log.txt"
git log -1 --format='%h %s' 2>/dev/null | cut -c1-100 >> "$O/log.txt"
gpu_mkrandom_cpu_bg "$O/log.txt"
mkdir -p build-fg; rm -f build-fg/moe_quant.o
nvcc -c -O2 -std=c++17 $A -DLAB_ONLY_SK -Iinclude -Isrc $XC dev/cuda/moe_quant.cu -o build-fg/moe_quant.o \
  > /tmp/lab_build.txt 2>&1 &
lp=$!
nvcc -c -O2 -std=c++17 $A -Xptxas -v -Iinclude -Isrc $XC src/cuda/qmoe_fg.cu -o build-fg/qmoe_fg.o > /tmp/fg_ptxas.txt 2>&1 &
pp=$!
make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/dgemma build/tests/test_cuda > /tmp/build.txt 2>&1
echo "build rc $? $(el)" | tee -a "$O/log.txt"; tail -3 /tmp/build.txt >> "$O/log.txt"
echo "nvflags: $(cat build/.nvflags)" >> "$O/log.txt"
[ -x build/dgemma ] && [ -x build/tests/test_cuda ] || { tail -30 /tmp/build.txt; exit 1; }
export LD_LIBRARY_PATH="$CUL:/tmp/dgdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
left() { echo $(( 550 - $(date +%s) + t0 )); } # seconds left of the call's 550
# 2. the tests of the switch (each filter its own process: cmocka takes one pattern); each at most 60 s and never
#    into the ~200 s the four benches and the lab need
for t in test_quant_experts_fg test_quant_experts_fgb test_experts_fg_passes FG=1:test_quant_experts \
         FG=1:test_experts_dn_fuse FG=1:test_graphs FG=1:test_profile FG=1:test_turbo_batch FG=1:test_quant_synth_logits; do
  lim=$(( $(left) - 200 )); [ $lim -gt 60 ] && lim=60
  if [ $lim -lt 10 ]; then echo "test $t not run: $(left) s left $(el)" | tee -a "$O/log.txt"; continue; fi
  if [ "${t#FG=1:}" != "$t" ]; then
    DGEMMA_EXPERTS_FG=1 DG_TEST_FILTER=${t#FG=1:} timeout $lim build/tests/test_cuda >> "$O/tests.txt" 2>&1
  else
    DG_TEST_FILTER=$t timeout $lim build/tests/test_cuda >> "$O/tests.txt" 2>&1
  fi
  echo "test $t rc $? $(el)" | tee -a "$O/log.txt"
done
grep -E "^# (backend DGEMMA_EXPERTS_FG|DGEMMA_EXPERTS_FG|kernel lab version 114)|FAILED|ERROR" "$O/tests.txt" | tee -a "$O/log.txt"
echo "tests: $(grep -c '\[  PASSED  \] 1 test' "$O/tests.txt") of 9 passed, $(grep -c '\[  FAILED  \]' "$O/tests.txt") FAILED lines" | tee -a "$O/log.txt"
# the lab's object and the ptxas run (CPU work) end before the benches, so that they do not run beside them
wait $pp; grep -A3 -E "Compiling entry.*qr_fg_kernel" /tmp/fg_ptxas.txt | grep -E "Compiling|registers|spill" > "$O/fg_ptxas.txt"
wait $lp; echo "lab compile rc $? $(el)" | tee -a "$O/log.txt"
rm -f build-fg/moe_quant # never an earlier call's binary on a warm machine
nvcc $A build-fg/moe_quant.o build/libdgemma.a -L"$CUL" $NXL -lcublas -lcudart -lcjson -lgomp -o build-fg/moe_quant \
  >> /tmp/lab_build.txt 2>&1
echo "lab link rc $? $(el)" | tee -a "$O/log.txt"; [ -x build-fg/moe_quant ] || tail -20 /tmp/lab_build.txt >> "$O/log.txt"
# 3. the 26B vllm bench, A B A B
wait $mk; tail -1 /tmp/mkrandom.log >> "$O/log.txt"
echo "| run | DGEMMA_EXPERTS_FG | tok/s | median s | spread s | ms/forward | experts ms/pass | all ms/pass |" > "$O/summary.md"
echo "|---|---|---|---|---|---|---|---|" >> "$O/summary.md"
n=0
for pair in 1 2; do
  for v in default 1; do
    n=$((n + 1))
    if [ $v = 1 ]; then export DGEMMA_EXPERTS_FG=1; else unset DGEMMA_EXPERTS_FG; fi
    rm -f /tmp/fgb_bench_$n.jsonl
    if [ $(left) -lt 45 ]; then echo "bench $n not run: $(left) s left $(el)" | tee -a "$O/log.txt"; continue; fi
    timeout 70 build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 3 --profile \
      -o /tmp/fgb_bench_$n.jsonl > /tmp/bench.txt 2>&1
    echo "bench $n DGEMMA_EXPERTS_FG=$v rc $? $(el)" | tee -a "$O/log.txt"
    # one bench.jsonl for the four runs (at most 8 files come back): each run's rows after a line naming it
    { echo "{\"kind\": \"run\", \"run\": $n, \"DGEMMA_EXPERTS_FG\": \"$v\"}"; cat /tmp/fgb_bench_$n.jsonl 2>/dev/null; } >> "$O/bench.jsonl"
    { echo; echo "## run $n: DGEMMA_EXPERTS_FG=$v"; cat /tmp/bench.txt; } >> "$O/bench.txt"
    awk -v n=$n -v v=$v -F'|' '
      /^\| experts \|/ { ex = $3 } /^\| all \|/ { all = $3 }
      /^\| vllm \| filler \|/ { tok = $10; med = $8; spr = $9; msf = $11 }
      END { gsub(/ /, "", ex); gsub(/ /, "", all)
            printf "| %d | %s | %s | %s | %s | %s | %s | %s |\n", n, v, tok, med, spr, msf, ex, all }' \
      /tmp/bench.txt >> "$O/summary.md"
  done
done
unset DGEMMA_EXPERTS_FG
cat "$O/summary.md" | tee -a "$O/log.txt"
# 4. the lab rows once (last: what time is left, at most 60 s)
lt=$(left); [ $lt -gt 60 ] && lt=60
if [ -x build-fg/moe_quant ] && [ $lt -ge 5 ]; then
  timeout $lt build-fg/moe_quant --bits 4 --versions 50,114 --ms 16 --ts 128,256 --ss 256 --reps 5 > "$O/lab.txt" 2>&1
  echo "lab rc $? $(el): $(grep -c '| 114 | .*ok, = v50' "$O/lab.txt") 114 rows ok = v50, $(grep -c 'counters ok' "$O/lab.txt") with counters ok, $(grep -c FAIL "$O/lab.txt") FAIL" | tee -a "$O/log.txt"
  grep -E 'gate_up\+down|version 114' "$O/lab.txt" > "$O/fused.txt"
else
  echo "lab not run: $lt s left $(el)" | tee -a "$O/log.txt"; tail -20 /tmp/lab_build.txt
fi
echo "done $(el)" | tee -a "$O/log.txt"
