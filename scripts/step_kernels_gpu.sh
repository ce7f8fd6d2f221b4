#!/usr/bin/env bash
# step_kernels_gpu.sh OUT: where a 26B-A4B decoder step's GPU time goes (issue 12), in one command on the
# GPU machine: build, write the random checkpoint (dgemma mkrandom), then Nsight Compute's
# gpu__time_duration over STEP_COUNT kernel launches of the vllm protocol after skipping STEP_SKIP
# (the prefill and the first forwards), summed per kernel name (ncu_step.txt), and the protocol itself
# without the profiler (bench_vllm.jsonl). Carry .devdeb and .devdata.
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/step_kernels_gpu.sh OUT}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
. scripts/gpu_env.sh
mkdir -p .cache/gemma3
[ -f .cache/gemma3/tokenizer.json ] || gunzip -c .devdata/gemma3/tokenizer.json.gz > .cache/gemma3/tokenizer.json
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" all > /tmp/build.txt 2>&1 || { tail -30 /tmp/build.txt; exit 1; }
echo "== built $(el)"
[ -f /tmp/dg26b/config.json ] || build/dgemma mkrandom /tmp/dg26b --source .cache/gemma3 -t 14 > /tmp/mkrandom.log 2>&1
tail -1 /tmp/mkrandom.log; echo "== checkpoint $(el)"
timeout 150 build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 1 -o "$OUT/bench_vllm.jsonl" 2>&1 | tail -4
echo "== bench $(el)"
timeout ${NCU_T:-240} ncu --metrics gpu__time_duration.sum --launch-skip ${STEP_SKIP:-3000} --launch-count ${STEP_COUNT:-1200} \
  --csv --print-units base build/dgemma bench -m /tmp/dg26b --device cuda --protocol vllm --reps 1 > /tmp/ncu.csv 2>/tmp/ncu.err
echo "ncu rc $? $(el)"; tail -3 /tmp/ncu.err
python3 scripts/ncu_sum.py /tmp/ncu.csv > "$OUT/ncu_step.txt"
head -40 "$OUT/ncu_step.txt"
echo "== done $(el)"
