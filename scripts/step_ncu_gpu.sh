#!/usr/bin/env bash
# step_ncu_gpu.sh OUT: every kernel of a 26B-A4B decoder step, one row each (issue 12), in one command on the GPU
# machine; carry .devdeb and .devdata. dev/cfg_26b_2layers.json is the built-in 26B config (src/writers/mkrandom.c's text)
# cut to 2 layers, one sliding and one full attention: every kernel and shape of a 26B step at 2/30 of its launches.
#   1. build (make all + tests/test_cuda); /tmp/dgL = mkrandom of that config (4-bit g64 experts, the rest bf16)
#   2. SASS=1 (default): cuobjdump of the backend plugin: static opcode counts of every 4-bit qr_kernel
#      instantiation (sass_qr.txt), their whole SASS gzipped (sass_qr4.txt.gz)
#   3. Nsight Compute over `dgemma bench --protocol vllm --reps 1 --warmup 0` on /tmp/dgL with CUDA graphs off (ncu
#      profiles launches; the prefill of the 1,024-token prompt, then the decoder passes): the first NCU_C (default
#      900) launches, duration, DRAM bytes, grid, block and registers of each (ncu_step.csv.gz); fold it with
#      `python3 scripts/ncu_step_sum.py ncu_step.csv.gz`
#   4. RUN_SAN=1: compute-sanitizer (scripts/sanitize_gpu.sh, SAN_PAR=all) over SAN_FILTER under SAN_TOOLS with SAN_T,
#      its summaries and logs under OUT/san; RUN_TESTS=1: build/tests/test_cuda beside it (tests.txt)
# Every result is written under OUT as soon as it exists (a call cut short still returns what it had).
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/step_ncu_gpu.sh OUT}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
. scripts/gpu_env.sh
gpu_build /tmp/build.txt || exit 1
echo "== built $(el)"
gpu_tokenizer
(build/dgemma mkrandom /tmp/dgL --config dev/cfg_26b_2layers.json --source .cache/gemma3 -t 16 > /tmp/mkL.log 2>&1) &
mkl=$!
if [ "${SASS:-1}" = 1 ]; then
  so=build/libdgemma_cuda.so
  cuobjdump -sass "$so" > /tmp/all.sass 2>&1
  awk '/Function :/ {on = index($0, "qr_kernelILi4E") > 0} on' /tmp/all.sass > /tmp/qr4.sass
  gzip -c /tmp/qr4.sass > "$OUT/sass_qr4.txt.gz"
  # instructions, then opcode counts, of each 4-bit instantiation (from the filtered SASS: every function in it is one)
  awk '/Function :/ {if (name != "") print n, name; name = $3; n = 0}
       /^ +\/\*[0-9a-f]+\*\// {n++} END {if (name != "") print n, name}' /tmp/qr4.sass > "$OUT/sass_qr.txt"
  awk '/Function :/ {f = $3}
       /^ +\/\*[0-9a-f]+\*\// {op = $2; if (op ~ /^@/) op = $3; sub(/\..*/, "", op); c[f " " op]++}
       END {for (k in c) print c[k], k}' /tmp/qr4.sass | sort -k2,2 -k1,1nr >> "$OUT/sass_qr.txt"
  echo "== sass $(el): $(wc -l < "$OUT/sass_qr.txt") lines"; head -40 "$OUT/sass_qr.txt" | cut -c1-160
fi
wait $mkl; tail -2 /tmp/mkL.log; echo "== dgL $(el)"
DGEMMA_GRAPHS=0 timeout 200 ncu --clock-control none --csv -c "${NCU_C:-900}" \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__throughput.avg.pct_of_peak_sustained_elapsed \
  build/dgemma bench -m /tmp/dgL --device cuda --protocol vllm --reps 1 --warmup 0 > /tmp/ncu_step.csv 2> /tmp/ncu_err.txt
echo "ncu rc $? $(el)"; tail -3 /tmp/ncu_err.txt; gzip -c /tmp/ncu_step.csv > "$OUT/ncu_step.csv.gz"
python3 scripts/ncu_step_sum.py /tmp/ncu_step.csv > "$OUT/ncu_step.md" 2>&1; head -60 "$OUT/ncu_step.md"
if [ -n "${RUN_TESTS:-}" ]; then (timeout 400 build/tests/test_cuda > "$OUT/tests.txt" 2>&1; echo "test_cuda rc $?" >> "$OUT/tests.txt") & tp=$!; fi
if [ -n "${RUN_SAN:-}" ]; then
  SAN_PAR=all scripts/sanitize_gpu.sh "$OUT/san" > /tmp/san.txt 2>&1; echo "sanitizer rc $? $(el)"
  cat "$OUT"/san/summary_*.txt
fi
[ -n "${RUN_TESTS:-}" ] && { wait $tp; tail -5 "$OUT/tests.txt"; }
[ -d "$OUT/san" ] && tar -czf "$OUT/san.tgz" -C "$OUT" san && rm -rf "$OUT/san" # few files come back from a call
echo "== done $(el)"
