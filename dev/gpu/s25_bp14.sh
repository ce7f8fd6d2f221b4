#!/bin/bash
# Session 25's call for issue 14 (helper bp14): where a stacked batch pass's time goes. One command, carry
# .devdeb .devdata/gemma3; about 6 minutes on an H100 (the sm_90a build ~190 s beside mkrandom ~220 s, then the
# batch bench ~125 s for the timed rows + ~40 s for the profiled runs):
#   1. in the background: the library, the CLI and the CUDA plugin for sm_90a in build-a (as s25_wl14.sh PART=bench,
#      the build of /work/.device/2's rows: 434.8 / 484.0 / 502.4 tok/s) with tests/test_cuda, and a CPU CLI in build-c
#      writing the 26B-A4B random checkpoint /tmp/dg26b (mkrandom; the tokenizer from .devdata/gemma3, gzipped);
#   2. once build-a is there, while mkrandom runs: test_profile and test_profile_batch (the stage marks of the
#      stacked passes, bench --profile --protocol batch's source) on the hardware (tests.txt);
#   3. `dgemma bench --protocol batch --canvases 1,4,8 --reps 2 --profile` (defaults: no DGEMMA_WL), bench.txt and
#      bench.jsonl (the rows as protocol "batch", each B's profile as "batch_profile");
#   4. only with FULL=1 (+ ~80-100 s, so ~7.5 min in all): the same with --gen-kwargs '{"turbo_compact": false}',
#      bench_full.txt / .jsonl: the full canvases of every batch row before session 25 (each canvas forwards all 256
#      positions each step, a stacked pass of B canvases is B x 256 rows). Since session 25 the protocol's setting
#      (tools/bench.c kBatchDefaults) has turbo_compact true, the compacted decoder issue 14's acceptance names.
# How to read bench.txt: the table first is the timed rows (tok/s, passes, floor), as in /work/.device/2/bench.txt;
# the profiled runs come after it, one more dg_generate_batch per B with the stage timing of every canvas's context on
# (not in the timed rows; the concurrent branches are off while profiling, so the layers run their dense MLP and MoE
# one after the other, as the vllm profile does). Per B: a line with the wall time, the batched passes and how many
# canvases each carried, the rows per pass (forward-set positions summed over the canvases: min / median / max), the
# prefills, commits and repair forwards run per canvas; then one table, per stage: "stacked ms per pass" = GPU ms of
# the stacked passes (on the batch's work context) per batched pass, its share, the cost model's floor at each pass's
# recorded rows and floor / ms; "per-canvas ms per pass" = the canvases' own streams (prefill, commits, repair
# forwards, top-K, self-conditioning rows; at B = 1 also its compacted passes) summed over the canvases, per batched
# pass, with its share and floor. The host rows (in parentheses) are the time between stacked passes, resp. the
# canvases' idle time, not GPU work. The last line splits the wall time per pass into stacked GPU + per-canvas GPU + the
# rest (host work and the GPU idle). docs/cuda.md (issue 14's section, "Where a stacked pass's time goes") says what
# to compare: the per-canvas dense products and attention x B against the experts' one stack.
# Usage: [FULL=1] bash dev/gpu/s25_bp14.sh $OUT
O=$1; mkdir -p "$O"
. scripts/gpu_env.sh
A="-gencode=arch=compute_90a,code=sm_90a"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee -a "$O/log.txt"
git log --oneline -1 | tee -a "$O/log.txt"
( make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" BUILD=build-a CUDA_ARCH="$A" all build-a/tests/test_cuda \
    > /tmp/build_a.txt 2>&1; echo "build_a rc $? $(el)" >> "$O/log.txt" ) &
bp=$!
gpu_mkrandom_cpu_bg "$O/log.txt"
wait $bp; tail -3 /tmp/build_a.txt > "$O/build_tail.txt"
for t in test_profile test_profile_batch; do
  DG_TEST_FILTER=$t timeout 60 build-a/tests/test_cuda >> "$O/tests.txt" 2>&1
  echo "$t rc $? $(el)" | tee -a "$O/log.txt"
done
wait $mk; tail -2 /tmp/mkrandom.log >> "$O/log.txt"
timeout 300 build-a/dgemma bench -m /tmp/dg26b --device cuda --protocol batch --canvases 1,4,8 --reps 2 --profile \
  -o "$O/bench.jsonl" > "$O/bench.txt" 2>&1
echo "batch --profile rc $? $(el)" | tee -a "$O/log.txt"
tail -60 "$O/bench.txt"
if [ "${FULL:-0}" = 1 ]; then
  timeout 200 build-a/dgemma bench -m /tmp/dg26b --device cuda --protocol batch --canvases 1,4,8 --reps 2 --profile \
    --gen-kwargs '{"turbo_compact": false}' -o "$O/bench_full.jsonl" > "$O/bench_full.txt" 2>&1
  echo "batch --profile full canvases rc $? $(el)" | tee -a "$O/log.txt"
  tail -60 "$O/bench_full.txt"
fi
echo "done $(el)" | tee -a "$O/log.txt"
