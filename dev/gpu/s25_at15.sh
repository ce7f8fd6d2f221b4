#!/bin/bash
# Session 25's call for issue 12 item 2 (helper at15): attention version 15 (att_wq_kernel, src/cuda/attention_wq.cuh)
# as the backend's default on Hopper. One command, carry .devdeb .devdata/gemma3, default kind (H100); about 5-6
# minutes (the build ~3 min beside mkrandom, test_cuda ~1-2 min (at most 240 s), four vllm benches of ~25 s):
#   1. the default build (`make all build/tests/test_cuda`, no CUDA_ARCH: the Makefile's default, since session 25
#      sm_90a SASS + compute_90 PTX; build/.nvflags into log.txt) and, beside it, a CPU CLI in build-c writing the
#      26B-A4B random checkpoint /tmp/dg26b (mkrandom);
#   2. the whole test_cuda on that build (tests.txt): test_attention's cases 1-15 (15 through the backend's
#      k_attention_any), test_attention_choice (the context's line: version 15 at both head-dim classes on this
#      build and device; printed), and every pass-level test (test_graphs, the turbo tests, the stacked batches, the
#      golden logits ...) with the default, now 15;
#   3. `dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 3 --profile` with DGEMMA_ATTN=6 (A) and with
#      the default (B, 15), alternated A B A B (bench.txt: each run's whole output, its choice line first);
#      summary.md: one row per run: tok/s (median of 3), its spread (min-max of the 3 in seconds), ms per forward,
#      the --profile run's attention stage (ms per pass) and "all" (ms per pass).
# How to read it (the rule, written before the call): 15 stays the default if, in both pairs (runs 1-2 and 3-4),
# B's vllm tok/s median is above A's by more than the two rows' spread (tok/s from max_s and min_s of each row),
# test_cuda passes (tests.txt: 0 failed) and test_attention_choice printed "version 15 at head dims <= 256, 15
# above". Expected from the lab (H100, session 25, /work/.device/3): attention ~1.55 -> ~1.2 ms per pass (-0.35 ms
# of ~13.2 ms), vllm ~1,135 -> ~1,165 tok/s. Otherwise: DGEMMA_ATTN's default back to 6 (attention.cu
# k_attention_choose), the numbers into docs/measurements.md either way.
# Usage: bash dev/gpu/s25_at15.sh $OUT
O=${1:?usage: dev/gpu/s25_at15.sh OUT}; mkdir -p "$O"
. scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a "$O/log.txt"
gpu_mkrandom_cpu_bg "$O/log.txt"
make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" all build/tests/test_cuda > /tmp/build.txt 2>&1
echo "build rc $? $(el)" | tee -a "$O/log.txt"; tail -3 /tmp/build.txt > "$O/build_tail.txt"
echo "nvflags: $(cat build/.nvflags)" >> "$O/log.txt"
timeout 240 build/tests/test_cuda > "$O/tests.txt" 2>&1
echo "test_cuda rc $? $(el)" | tee -a "$O/log.txt"
grep -E "^# attention (choice|version 1[45])|FAILED|PASSED|ERROR|dgemma tests" "$O/tests.txt" | head -12 | tee -a "$O/log.txt"
wait $mk; tail -1 /tmp/mkrandom.log >> "$O/log.txt"
echo "| run | DGEMMA_ATTN | tok/s | median s | spread s | ms/forward | attention ms/pass | all ms/pass |" > "$O/summary.md"
echo "|---|---|---|---|---|---|---|---|" >> "$O/summary.md"
n=0
for pair in 1 2; do
  for v in 6 default; do
    n=$((n + 1))
    if [ $v = 6 ]; then export DGEMMA_ATTN=6; else unset DGEMMA_ATTN; fi
    timeout 100 build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 3 --profile \
      -o "$O/bench_$n.jsonl" > /tmp/bench.txt 2>&1
    echo "bench $n DGEMMA_ATTN=$v rc $? $(el)" | tee -a "$O/log.txt"
    { echo; echo "## run $n: DGEMMA_ATTN=$v"; cat /tmp/bench.txt; } >> "$O/bench.txt"
    awk -v n=$n -v v=$v -F'|' '
      /^\| attention \|/ { att = $3 } /^\| all \|/ { all = $3 }
      /^\| vllm \| filler \|/ { tok = $10; med = $8; spr = $9; msf = $11 }
      END { gsub(/ /, "", att); gsub(/ /, "", all)
            printf "| %d | %s | %s | %s | %s | %s | %s | %s |\n", n, v, tok, med, spr, msf, att, all }' \
      /tmp/bench.txt >> "$O/summary.md"
    grep -m1 "attention version" /tmp/bench.txt >> "$O/log.txt"
  done
done
unset DGEMMA_ATTN
cat "$O/summary.md" | tee -a "$O/log.txt"
echo "done $(el)" | tee -a "$O/log.txt"
