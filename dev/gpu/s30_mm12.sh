#!/bin/bash
# Session 30's call for issue 12's memory lines with the faster prefill (helper mm12, session 29; docs/cuda.md
# "Session 29 (helper mm12)"). Rule, written before any GPU run: one command, carry `.devdeb .devdata/gemma3`,
# default kind (H100), DG_CALL_S = the call's limit (600 if unset). A fresh machine builds (~250-330 s) while a
# CPU-only CLI writes the 4-bit checkpoint /tmp/dg26b and then the 3-bit /tmp/dg26b3 (~155 s each; kept on a warm
# machine that has /tmp/dg26b.ok, /tmp/dg26b3.ok); <= 6 files back. Every item after the build runs under a guard of
# the time left and its own timeout, most important first (a fresh machine may reach only items 1-2: then the same
# command again on the warm machine runs the rest; items already logged as passed may be read from the first call):
#   1. correctness at the new defaults (encoder chunk 1,024; its rows beyond 256 over the logits; sliding layers
#      attending in calls of 256 rows): test_enc_view (the logits refused after a long encode, the next decode's
#      words those of a context that never decoded between its encodes), test_synth_logits (case 4: a 700-token
#      prompt in one chunk with the rings wrapping, against the CPU), test_profile_encode (marks per chunk),
#      test_ctx_arena (both views inside the block), test_cuda_truncate, test_replay, test_turbo_generate,
#      test_branch, test_vocab_chain, test_step_stats, test_golden_logits, test_cuda_copy, test_enc_chunk_refused,
#      test_cublas_pool (the switch's environment and refusals); then test_enc_view and
#      test_synth_logits under DGEMMA_ENC_CHUNK=256 (the old layout's path);
#   2. 4-bit memory and prefill: DGEMMA_CUDA_MEMLOG=1 `bench -m /tmp/dg26b --device cuda --protocol step --contexts
#      1024,8192 --reps 3` at the default chunk (1,024), then the same under DGEMMA_ENC_CHUNK=256 (the A/B);
#   3. 3-bit memory at 8K (`--contexts 8192 --reps 1 --warmup 0`, memory log): the defaults, DGEMMA_BRANCH_HANDLE=one,
#      DGEMMA_CUBLAS_POOL=small, both (small + one), DGEMMA_CUBLAS_POOL=zero;
#   4. the vllm A/B of m3b12's rule (a) on /tmp/dg26b3 (session 29's series): A the defaults, B DGEMMA_SC_INPLACE=0
#      alone, C DGEMMA_BRANCH_WS_KIB=32768 alone, `--protocol vllm --reps 2`, in the order A B C A B C;
#   5. with time left: test_branch, test_graphs and test_golden_logits under DGEMMA_CUBLAS_POOL=small.
# Predictions (docs/cuda.md, dev/ctx_bytes_26b.py): the context block at cap 8,448 is 908,854,784 B at chunk 1,024
# and at 256 alike (the encoder's view, 299,045,888 B, lies inside the decoder's union of 359,974,912 B: the
# canvas's rows, P's head and the logits), so **4-bit 8K 17.73 GiB at both chunks** (session 29: 17.73 at 256,
# 18.08 at 1,024 before mm12); the KV cache column 0.410 GiB at both (the rings no longer grow with the chunk);
# 8K prefill ~245-255 ms at 1,024 (session 29: 243.9 before mm12; the sliding layers' attention now 4 calls per
# chunk instead of 1) against ~348 at 256; the decoder step unchanged (~12.5 ms at 1K). 3-bit 8K: defaults 15.07,
# one 15.005 (session 29), small ~14.95 and small + one ~14.94 if cuBLAS sizes each handle's pool from
# CUBLAS_WORKSPACE_CONFIG at cublasCreate (each cublasCreate's 64-66 MiB -> ~0.1-2 MiB: the memory log's "after its
# cublasCreate" lines show it), else as the defaults (cuBLAS read the variable before the library set it).
# Verdicts (the rule):
#   (a) chunk 1,024 stays the default (DG_CUDA_ENC_CHUNK, src/model/context.h) if every item-1 test passes, item 2's
#       P 8192 row at 1,024 has device GiB <= 17.75 and prefill median <= 0.8 x the 256 run's, and the step median
#       at both P within max(the two spreads, 1 %) of the 256 run's; a failed test or the memory over 17.75: the
#       default goes back to 256 (one line) until the cause is fixed; a prefill not faster: 256 too.
#   (b) the 3-bit line (<= 15.000 GiB at 8K) is met by the first of item 3's settings under it; DGEMMA_CUBLAS_POOL=small
#       becomes the default only if its GiB is lower than the defaults' by >= 0.05, item 5's three tests pass under it,
#       and a later call's vllm A/B (A defaults, B small) shows no loss by (c)'s margin; zero: the same if cuBLAS
#       takes it (its memory log); DGEMMA_BRANCH_HANDLE=one as m3b12's rule (b).
#   (c) m3b12's rule (a) applied apart: in both pairs a B (C) faster than A by more than max(the larger spread,
#       0.5 %) means P in place (the 4 MiB side workspace) costs speed: that default goes (DGEMMA_SC_INPLACE's default
#       0: +112 MiB; SIDE_WS_DEFAULT 32 MiB: +28 MiB); otherwise both stay.
# Files back: log.txt, build_tail.txt, tests.txt, step.txt (every bench's whole output with its memory log),
# bench.jsonl (every JSON row, each run's after a {"kind": "run"} line), summary.md (the rows and the log lines).
# Usage: DG_CALL_S=600 bash dev/gpu/s30_mm12.sh $OUT
# Session 31 (lead): MM12_ITEMS (default "1 2 3 4 5") runs only the items named, MM12_Q (default "4 3") writes only
# those checkpoints. Session 31's H100 call ran item 1 (all 17 tests passed) and timed item 2's first bench out (a
# fresh machine: build 439 s beside the 4-bit checkpoint's 296 s); so the next call is MM12_ITEMS="2" MM12_Q=4 on a
# fresh machine, then MM12_ITEMS="3 4 5" MM12_Q=3 on the warm one (the verdicts below unchanged).
O=${1:?usage: dev/gpu/s30_mm12.sh OUT}; mkdir -p "$O"
. scripts/gpu_env.sh
T=$(call_budget 560)
ITEMS=" ${MM12_ITEMS:-1 2 3 4 5} "; QS=${MM12_Q:-4 3}
has() { case "$ITEMS" in *" $1 "*) return 0 ;; esac; return 1; }
TP=/tmp/mm_ # left, guard, lim, bench (its files /tmp/mm_NAME.txt, .jsonl) and one: scripts/gpu_env.sh
rm -f /tmp/mm_*.txt /tmp/mm_*.jsonl
: > "$O/step.txt"; : > "$O/tests.txt"; : > "$O/bench.jsonl"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.total --format=csv | tee -a "$O/log.txt"
git log --oneline -1 | tee -a "$O/log.txt"
# both checkpoints beside the build, one after the other: a CPU-only CLI in build-c (gpu_mkrandom_cpu_bg's way)
( gpu_tokenizer
  if ! { [ -f /tmp/dg26b.ok ] && [ -f /tmp/dg26b3.ok ]; }; then
    make -j4 CUDA=0 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" BUILD=build-c build-c/dgemma > /tmp/build_c.txt 2>&1 ||
      { echo "build-c failed $(el)" >> "$O/log.txt"; exit 1; }
  fi
  for q in $QS; do
    d=/tmp/dg26b; rec=""; [ $q = 3 ] && { d=/tmp/dg26b3; rec="--recipe all=bf16,experts=3"; }
    if [ -f $d.ok ] && [ -f $d/config.json ]; then echo "mkrandom $q-bit kept $(el)" >> "$O/log.txt"; continue; fi
    rm -f $d.ok
    build-c/dgemma mkrandom $d --source .cache/gemma3 $rec -t 4 > /tmp/mm_mkrandom$q.log 2>&1
    r=$?; [ $r = 0 ] && touch $d.ok
    echo "mkrandom $q-bit rc $r $(el)" >> "$O/log.txt"
  done ) &
mk=$!
make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/dgemma build/libdgemma_cuda.so build/tests/test_cuda \
  > /tmp/mm_build.txt 2>&1
echo "build rc $? $(el)" | tee -a "$O/log.txt"
tail -3 /tmp/mm_build.txt > "$O/build_tail.txt"
# 1. correctness at the new defaults, then the old layout's path
if has 1 && [ -x build/tests/test_cuda ]; then
  one enc_view test_enc_view
  one synth_logits test_synth_logits
  one profile_encode test_profile_encode
  one ctx_arena test_ctx_arena
  one truncate test_cuda_truncate
  one replay test_replay
  one turbo_generate test_turbo_generate
  one branch test_branch
  one vocab_chain test_vocab_chain
  one step_stats test_step_stats
  one golden test_golden_logits
  one copy test_cuda_copy
  one enc_chunk_refused test_enc_chunk_refused
  one refuse_too_big test_refuse_too_big # (session 29, lead: DGEMMA_CUDA_MEM_LIMIT bad values refused)
  one cublas_pool test_cublas_pool
  one enc_view_256 test_enc_view DGEMMA_ENC_CHUNK=256
  one synth_logits_256 test_synth_logits DGEMMA_ENC_CHUNK=256
fi
# 2. 4-bit: memory and prefill at the default chunk (1,024), then at 256
wait_ck() { # wait_ck Q: 0 once /tmp/dg26b(3).ok is there (waiting for the background job while it runs)
  local d=/tmp/dg26b; [ "$1" = 3 ] && d=/tmp/dg26b3
  while [ ! -f $d.ok ] && kill -0 $mk 2>/dev/null && [ "$(left)" -gt 60 ]; do sleep 5; done
  [ -f $d.ok ]
}
if has 2 && wait_ck 4 && guard 60 "step 4-bit chunk 1024"; then
  ENVS="DGEMMA_CUDA_MEMLOG=1" DGEMMA_CUDA_MEMLOG=1 bench step4 "$(lim 120)" -m /tmp/dg26b --device cuda \
    --protocol step --contexts 1024,8192 --reps 3
fi
if has 2 && [ -f /tmp/dg26b.ok ] && guard 60 "step 4-bit chunk 256"; then
  ENVS="DGEMMA_CUDA_MEMLOG=1 DGEMMA_ENC_CHUNK=256" DGEMMA_CUDA_MEMLOG=1 DGEMMA_ENC_CHUNK=256 bench step4_256 \
    "$(lim 120)" -m /tmp/dg26b --device cuda --protocol step --contexts 1024,8192 --reps 3
fi
# 3. 3-bit memory lines at 8K
s3() { # s3 NAME ENV...: the 3-bit step at 8K with the memory log under ENV (exported in a subshell)
  local name=$1; shift
  guard 45 "$name" || return 1
  ( export DGEMMA_CUDA_MEMLOG=1 "$@"
    ENVS="DGEMMA_CUDA_MEMLOG=1 $*" bench "$name" "$(lim 90)" -m /tmp/dg26b3 --device cuda --protocol step \
      --contexts 8192 --reps 1 --warmup 0 )
}
if has 3 && wait_ck 3; then
  s3 step3
  s3 step3_one DGEMMA_BRANCH_HANDLE=one
  s3 step3_small DGEMMA_CUBLAS_POOL=small
  s3 step3_small_one DGEMMA_CUBLAS_POOL=small DGEMMA_BRANCH_HANDLE=one
  s3 step3_zero DGEMMA_CUBLAS_POOL=zero
fi
# 4. the vllm A/B: A defaults, B DGEMMA_SC_INPLACE=0, C DGEMMA_BRANCH_WS_KIB=32768; A B C A B C
if has 4 && { wait_ck 3 || true; } && [ -f /tmp/dg26b3.ok ]; then
  for i in 1 2; do
    guard 50 "vllm A $i" && ENVS="" bench vllmA$i "$(lim 80)" -m /tmp/dg26b3 --device cuda --protocol vllm --reps 2
    guard 50 "vllm B $i" && ENVS="DGEMMA_SC_INPLACE=0" DGEMMA_SC_INPLACE=0 \
      bench vllmB$i "$(lim 80)" -m /tmp/dg26b3 --device cuda --protocol vllm --reps 2
    guard 50 "vllm C $i" && ENVS="DGEMMA_BRANCH_WS_KIB=32768" DGEMMA_BRANCH_WS_KIB=32768 \
      bench vllmC$i "$(lim 80)" -m /tmp/dg26b3 --device cuda --protocol vllm --reps 2
  done
fi
# 5. the pool switch's words
if has 5 && [ -x build/tests/test_cuda ]; then
  one branch_small test_branch DGEMMA_CUBLAS_POOL=small
  one graphs_small test_graphs DGEMMA_CUBLAS_POOL=small
  one golden_small test_golden_logits DGEMMA_CUBLAS_POOL=small
fi
# summary: each run's rows and memory-log lines; the tests' verdicts
{
  echo "| run | P | prefill median ms | prefill spread ms | step median ms | step spread ms | device GiB (context held) | before the context GiB | KV cache GiB |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for r in step4 step4_256 step3 step3_one step3_small step3_small_one step3_zero; do
    awk -F'|' -v r=$r '/^\| [0-9]+ \| [0-9.]+ \|/ { printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r, $2, $3, $4, $7, $8, $13, $14, $15 }' \
      /tmp/mm_$r.txt 2>/dev/null
  done
  echo
  echo "vllm A/B/C on /tmp/dg26b3 (A: defaults; B: DGEMMA_SC_INPLACE=0; C: DGEMMA_BRANCH_WS_KIB=32768):"
  for r in vllmA1 vllmB1 vllmC1 vllmA2 vllmB2 vllmC2; do
    [ -f /tmp/mm_$r.txt ] && echo "$r: $(grep '^| vllm |' /tmp/mm_$r.txt | head -1)"
  done
  echo
  for r in step4 step4_256 step3 step3_one step3_small step3_small_one step3_zero; do
    [ -f /tmp/mm_$r.txt ] && { echo "### $r"; grep "^dgemma cuda mem:" /tmp/mm_$r.txt | head -16; }
  done
  echo
  echo "tests: $(grep -c '^\[  PASSED  \]' "$O/tests.txt") passed lines, $(grep -c '^\[  FAILED  \]' "$O/tests.txt") failed lines"
  grep -E '^\[  (FAILED|PASSED)  \]|^## |^# encoder view|^# encoder profile|^# context' "$O/tests.txt" | head -80
} > "$O/summary.md"
cat "$O/summary.md" | tee -a "$O/log.txt" > /dev/null
echo "done $(el)" | tee -a "$O/log.txt"
