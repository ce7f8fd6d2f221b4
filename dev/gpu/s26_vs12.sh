#!/bin/bash
# (History: DGEMMA_VOCAB=one lost in session 27 and was deleted in session 28; this script no longer applies to main.)
# Session 26's call for issue 12 item 5 (helper vs12): DGEMMA_VOCAB=one (k_vocab_one, src/cuda/kernels.cu: the sampler
# statistics and the self-conditioning probabilities P in one launch that reads the [256, 262,144] logits once, every
# word the chain's) against the default zstore (4 passes over the logits, 4 launches). One command, carry
# .devdeb .devdata/gemma3, default kind (H100); about 8 minutes, under 540 s (session 25's at15 call: build 263 s
# beside mkrandom, a vllm bench --profile ~41 s; here build ~265 + lab ~40 + tests ~30 + 4 benches ~165 = ~500 s):
#   1. build/dgemma, build/libdgemma.a and build/tests/test_cuda (no CUDA_ARCH: the Makefile's sm_90a + compute_90),
#      beside them the lab's object (dev/cuda/step_kernels.cu, nvcc -c, sm_90a) and a CPU CLI in build-c writing
#      the 26B-A4B random checkpoint /tmp/dg26b (gpu_mkrandom_cpu_bg); the lab linked after the library;
#   2. the lab's vocab chain rows (`build/step_kernels_lab --chain --reps 30`: lab.md; L2 flushed before each
#      repetition): per proposal mode v0 chain, v2 fused (+ groups), v3 z stored (the default), "v3 stats" and
#      "v3 sc" (the default's two halves as the backend runs them: the profile's statistics stage and the
#      probabilities' pass of its self-conditioning), "v4 one (G blocks)" (the backend's DGEMMA_VOCAB=one), "v4 one
#      b3" (the same kernel held to 3 blocks per SM), "v4 phased" (its three-launch form), each word for word
#      against v0 (records, P, bad position; the logits untouched);
#   3. test_cuda's tests of the chains and of what the context change touches (tests.txt): test_vocab_chain (k_vocab_one's
#      one-launch forms on the GPU word for word with the chain: its line says in how many cases the single launch
#      ran), test_vocab_modes (generations under one = the chain's tokens), test_step_stats, test_ctx_arena (the
#      context's new buffer of row counters); the rest of test_cuda does not fit in the call's time (the default
#      path's only change is that buffer);
#   4. `dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 3 --profile` with the default (A: zstore) and
#      DGEMMA_VOCAB=one (B), alternated A B A B (bench.txt: each run's whole output; the profile now prints floors for
#      embedding and norms, combine and sampler statistics: tools/bench.c stage_acts); summary.md: one row per run:
#      tok/s (median of 3), spread (min-max s), ms per forward, the profile's LM head, self-conditioning, sampler
#      statistics and all (ms per pass).
# How to read it (the rule, written before the call): DGEMMA_VOCAB=one becomes the default (passes.cu
# vocab_mode_from_env returns 3 when DGEMMA_VOCAB is unset; zstore stays selectable) if all of
#   (a) lab.md: the "v4 one (G blocks)" rows of both modes carry no FAIL and G > 0 (the single launch ran), and
#       tests.txt: 0 failed, test_vocab_chain's line "one's single launch (row waits) in N of them" with N > 0;
#   (b) in both pairs (runs 1-2 and 3-4) B's vllm tok/s median is above A's by more than the two rows' spread
#       (tok/s from max_s and min_s of each row);
#   (c) in both pairs B's self-conditioning + sampler statistics (ms per pass) is below A's.
# Expected from the byte count (docs/cuda.md "Session 26 (helper vs12)"): the stats stage (A: 0.577 ms per profiled
# pass, 3 kernels over 815 MB) and SC's probabilities' pass (403 MB) become one launch over 404 MB; the kernels are
# arithmetic-bound (fp64 exp, tanhf, divisions: the same arithmetic in both), so the gain is the repeated passes'
# share: lab "v4 one" sampled vs "v3 stats" + "v3 sc" sampled; if that is < 0.1 ms, (b) will not hold. Otherwise (or
# if v4 one b3 beats v4 one by > 5 %: then the backend's form should become b3 first and this call repeat) the
# default stays zstore and the numbers go into docs/measurements.md either way.
# Files back (at most 8 come back from $OUT): log.txt, build_tail.txt, lab.md, tests.txt, summary.md, bench.txt,
# bench.jsonl (the four runs' rows, each run after a {"kind": "run"} line).
# Usage: bash dev/gpu/s26_vs12.sh $OUT
O=${1:?usage: dev/gpu/s26_vs12.sh OUT}; mkdir -p "$O"
. scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a "$O/log.txt"
gpu_mkrandom_cpu_bg "$O/log.txt"
rm -f /tmp/step_kernels_lab.o build/step_kernels_lab # never an earlier call's on a warm machine
( nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc $XC -c dev/cuda/step_kernels.cu \
    -o /tmp/step_kernels_lab.o > /tmp/lab_build.txt 2>&1; echo "lab object rc $? $(el)" >> "$O/log.txt" ) &
labo=$!
make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/dgemma build/libdgemma.a build/tests/test_cuda \
  > /tmp/build.txt 2>&1
echo "build rc $? $(el)" | tee -a "$O/log.txt"; tail -3 /tmp/build.txt > "$O/build_tail.txt"
echo "nvflags: $(cat build/.nvflags)" >> "$O/log.txt"
wait $labo
nvcc -gencode=arch=compute_90a,code=sm_90a /tmp/step_kernels_lab.o build/libdgemma.a -L"$CUL" $NXL -lcublas -lcudart \
  -lcublasLt -lcjson -lgomp -o build/step_kernels_lab >> /tmp/lab_build.txt 2>&1
echo "lab link rc $? $(el)" | tee -a "$O/log.txt"; tail -5 /tmp/lab_build.txt >> "$O/build_tail.txt"
timeout 90 build/step_kernels_lab --chain --reps 30 > "$O/lab.md" 2>&1
echo "lab rc $? $(el)" | tee -a "$O/log.txt"
grep -E "v3 stats|v3 sc|v4 |FAIL|^# " "$O/lab.md" | tee -a "$O/log.txt"
: > "$O/tests.txt"
for t in test_vocab_chain test_vocab_modes test_step_stats test_ctx_arena; do
  DG_TEST_FILTER=$t timeout 40 build/tests/test_cuda >> "$O/tests.txt" 2>&1
  echo "test_cuda $t rc $? $(el)" | tee -a "$O/log.txt"
done
grep -E "^# vocabulary|FAILED|ERROR" "$O/tests.txt" | head -12 | tee -a "$O/log.txt"
# a test that skips exits 0 too ("[  PASSED  ] 0 test(s)"): count the passes
echo "tests: $(grep -c '\[  PASSED  \] 1 test' "$O/tests.txt") of 4 passed, $(grep -c '^\[  SKIPPED \] 1 test' "$O/tests.txt") skipped, $(grep -c '^\[  FAILED  \] 1 test' "$O/tests.txt") failed" | tee -a "$O/log.txt"
wait $mk; tail -1 /tmp/mkrandom.log >> "$O/log.txt"
echo "| run | DGEMMA_VOCAB | tok/s | median s | spread s | ms/forward | LM head | self-conditioning | statistics | all |" \
  > "$O/summary.md"
echo "|---|---|---|---|---|---|---|---|---|---|" >> "$O/summary.md"
n=0
for pair in 1 2; do
  for v in default one; do
    n=$((n + 1))
    if [ $v = one ]; then export DGEMMA_VOCAB=one; else unset DGEMMA_VOCAB; fi
    rm -f /tmp/vs12_bench_$n.jsonl
    timeout 100 build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 3 --profile \
      -o /tmp/vs12_bench_$n.jsonl > /tmp/bench.txt 2>&1
    echo "bench $n DGEMMA_VOCAB=$v rc $? $(el)" | tee -a "$O/log.txt"
    # one bench.jsonl for the four runs (at most 8 files come back): each run's rows after a line naming it
    { echo "{\"kind\": \"run\", \"run\": $n, \"DGEMMA_VOCAB\": \"$v\"}"; cat /tmp/vs12_bench_$n.jsonl 2>/dev/null; } >> "$O/bench.jsonl"
    { echo; echo "## run $n: DGEMMA_VOCAB=$v"; cat /tmp/bench.txt; } >> "$O/bench.txt"
    awk -v n=$n -v v=$v -F'|' '
      /^\| LM head \|/ { hd = $3 } /^\| self-conditioning \|/ { sc = $3 } /^\| sampler statistics \|/ { st = $3 }
      /^\| all \|/ { all = $3 }
      /^\| vllm \| filler \|/ { tok = $10; med = $8; spr = $9; msf = $11 }
      END { gsub(/ /, "", hd); gsub(/ /, "", sc); gsub(/ /, "", st); gsub(/ /, "", all)
            printf "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", n, v, tok, med, spr, msf, hd, sc, st, all }' \
      /tmp/bench.txt >> "$O/summary.md"
  done
done
unset DGEMMA_VOCAB
cat "$O/summary.md" | tee -a "$O/log.txt"
echo "done $(el)" | tee -a "$O/log.txt"
