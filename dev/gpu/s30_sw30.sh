#!/bin/bash
# Session 30's check of helper sw30's switch table on a GPU (docs/cuda.md "Session 30 (helper sw30)"): every DGEMMA_*
# switch read through src/backend/switches.c, a bad value refused by dg_model_load / dg_context_new. No kernel
# changed. Rule, written before any GPU run: one command, carry `.devdeb`, default kind (H100), DG_CALL_S = the
# call's limit (600 if unset); best run right after dev/gpu/s30_mm12.sh on the same warm machine (its build/ is then
# only relinked for the files this branch touches, and its /tmp/dg26b3 is there); <= 5 files back. Items, most
# important first, each under a guard of the time left and its own timeout:
#   1. tests: test_attention_choice (valid DGEMMA_ATTN values choose as before; 9, 17, "15,", "6,17", "x" refuse
#      the context), test_cublas_pool (the table's line), test_enc_chunk_refused, test_step_stats (P's group from
#      dg_sw_get(DG_SW_SC_INPLACE)) and again under DGEMMA_SC_INPLACE=0, test_graphs, test_branch, test_gemm_pins,
#      test_synth_logits;
#   2. the CLI under bad values: `DGEMMA_GRAPHS=yes build/dgemma run --device cuda` and `DGEMMA_ROUTE=gird` (rc 1,
#      the line naming the variable and the value), `DGEMMA_ATTN=15, build/dgemma bench --device cuda` (rc 1 at the
#      model load, before any measurement, no -o file; as on the emulation, docs/results/cpu-s30/sw30_cli_bad.txt);
#   3. words: `build/dgemma logits` on models/dgemma-small (--device cuda, a fixed prompt and canvas) unset, and
#      under every switch set to the word of its default (DGEMMA_ROUTE=grid DGEMMA_VOCAB=zstore DGEMMA_GRAPHS=1
#      DGEMMA_PDL=1 DGEMMA_BRANCH=1 DGEMMA_SC_INPLACE=1 DGEMMA_WEIGHT_BLOCK=1 DGEMMA_CUDA_LIMITS=1
#      DGEMMA_STACK_DENSE=0 DGEMMA_ATTN=15 DGEMMA_ENC_CHUNK=1024), then under DGEMMA_ROUTE=tiles and DGEMMA_VOCAB=chain
#      (documented as the same words);
#   4. with /tmp/dg26b3 there (mm12's) and time left: `bench -m /tmp/dg26b3 --device cuda --protocol vllm --reps 2`
#      twice at the defaults.
# Predictions: every test passes; item 2's three commands refuse at once (rc 1) with the line; item 3's sha256 all equal
# (the readers give the default's value for the default's word; tiles and chain are documented word-identical);
# item 4's tok/s within max(the two runs' spread, 1 %) of s30_mm12's vllm A rows of the same machine (the table adds
# ~30 getenv + parse per model and per context, microseconds; no pass reads a switch differently).
# Verdicts (the rule): the branch is right on the GPU if items 1-3 hold. A failed test or a differing sha names the
# switch whose reader changed: fix it before the merge. Item 4 outside the margin: rerun once; still outside, say so
# and look at what reads a switch per pass (none should).
# Files back: log.txt, build_tail.txt, tests.txt, cli.txt, step.txt (+ bench.jsonl).
# Usage: DG_CALL_S=300 bash dev/gpu/s30_sw30.sh $OUT
O=${1:?usage: dev/gpu/s30_sw30.sh OUT}; mkdir -p "$O"
. scripts/gpu_env.sh
T=$(call_budget 280)
TP=/tmp/sw_ # left, guard, lim, bench (its files /tmp/sw_NAME.txt, .jsonl) and one: scripts/gpu_env.sh
rm -f /tmp/sw_*.txt /tmp/sw_*.jsonl /tmp/sw_*.f32
: > "$O/tests.txt"; : > "$O/cli.txt"; : > "$O/step.txt"; : > "$O/bench.jsonl"
nvidia-smi --query-gpu=name,driver_version --format=csv | tee -a "$O/log.txt"
git log --oneline -1 2>/dev/null | tee -a "$O/log.txt"
make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/dgemma build/libdgemma_cuda.so build/tests/test_cuda \
  > /tmp/sw_build.txt 2>&1
echo "build rc $? $(el)" | tee -a "$O/log.txt"
tail -3 /tmp/sw_build.txt > "$O/build_tail.txt"
# 1. tests
if [ -x build/tests/test_cuda ]; then
  one attention_choice test_attention_choice
  one cublas_pool test_cublas_pool
  one enc_chunk_refused test_enc_chunk_refused
  one step_stats test_step_stats
  one step_stats_sc0 test_step_stats DGEMMA_SC_INPLACE=0
  one graphs test_graphs
  one branch test_branch
  one gemm_pins test_gemm_pins
  one synth_logits test_synth_logits
fi
# 2. the CLI under bad values
cli() { # cli NAME ENV... -- ARGS...: build/dgemma ARGS under ENV, its last lines and rc in cli.txt
  local name=$1; shift; local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  guard 15 "cli $name" || return 1
  { echo "## $name: ${envs[*]} build/dgemma $*"; env "${envs[@]}" timeout "$(lim 30)" build/dgemma "$@" 2>&1 | tail -4
    echo "rc ${PIPESTATUS[0]}"; } >> "$O/cli.txt"
  echo "cli $name $(tail -1 "$O/cli.txt") $(el)" | tee -a "$O/log.txt"
}
if [ -x build/dgemma ]; then
  cli graphs_yes DGEMMA_GRAPHS=yes -- run -m models/dgemma-small --device cuda -p "1+1=" -s 1
  cli route_gird DGEMMA_ROUTE=gird -- run -m models/dgemma-small --device cuda -p "1+1=" -s 1
  cli attn_comma "DGEMMA_ATTN=15," -- bench -m models/dgemma-small --device cuda --protocol vllm --reps 1 \
    -o /tmp/sw_refused.jsonl
  echo "bench -o file after the refusal: $([ -e /tmp/sw_refused.jsonl ] && echo present || echo absent)" >> "$O/cli.txt"
fi
# 3. words: logits unset, under the defaults' words, under tiles / chain
C=$(seq -s, 5 68)
lg() { # lg NAME ENV...: logits to /tmp/sw_NAME.f32 under ENV, its sha256 in cli.txt
  local name=$1; shift
  guard 20 "logits $name" || return 1
  env "$@" timeout "$(lim 40)" build/dgemma logits -m models/dgemma-small --device cuda --prompt-ids 2,105,2364 \
    --canvas-ids "$C" -o /tmp/sw_$name.f32 > /tmp/sw_lg_$name.txt 2>&1
  local rc=$?
  echo "logits $name rc $rc $(sha256sum /tmp/sw_$name.f32 2>/dev/null | cut -c1-16) [$*]" | tee -a "$O/cli.txt" "$O/log.txt"
}
if [ -x build/dgemma ]; then
  lg unset
  lg defaults DGEMMA_ROUTE=grid DGEMMA_VOCAB=zstore DGEMMA_GRAPHS=1 DGEMMA_PDL=1 DGEMMA_BRANCH=1 DGEMMA_SC_INPLACE=1 \
    DGEMMA_WEIGHT_BLOCK=1 DGEMMA_CUDA_LIMITS=1 DGEMMA_STACK_DENSE=0 DGEMMA_ATTN=15 DGEMMA_ENC_CHUNK=1024
  lg tiles DGEMMA_ROUTE=tiles
  lg chain DGEMMA_VOCAB=chain
fi
# 4. vllm at the defaults, twice
if [ -f /tmp/dg26b3.ok ]; then
  for i in 1 2; do
    guard 50 "vllm $i" && ENVS="" bench vllm$i "$(lim 80)" -m /tmp/dg26b3 --device cuda --protocol vllm --reps 2
  done
  for i in 1 2; do [ -f /tmp/sw_vllm$i.txt ] && echo "vllm$i: $(grep '^| vllm |' /tmp/sw_vllm$i.txt | head -1)" |
    tee -a "$O/log.txt"; done
fi
echo "tests: $(grep -c '^\[  PASSED  \]' "$O/tests.txt") passed lines, $(grep -c '^\[  FAILED  \]' "$O/tests.txt") failed lines" |
  tee -a "$O/log.txt"
echo "done $(el)" | tee -a "$O/log.txt"
