#!/bin/bash
# Session 26's second call, right after dev/gpu/s25_bp14.sh on the same warm machine (its build-a, the sm_90a library
# and CLI, and /tmp/dg26b are reused; if either is missing they are made again here, ~4 min more). Carry .devdeb
# .devdata/gemma3. Three parts:
#   1. issue 14: `dgemma serve` on the 26B random checkpoint with --max-batch 1, 4, 8 and as many concurrent chat
#      requests (scripts/serve_bench.sh: the turbo engine's recommended setting with the compacted decoder, 256 tokens
#      each, 2 rounds after a warm-up), serve.txt: aggregate tok/s against B = 1 (the acceptance: B = 4 >= 2.5x,
#      B = 8 >= 4x, as for the batch protocol);
#   2. issue 11: lab versions 50, 110, 112, 113 twice (dev/gpu/s25_sk11.sh's runs and rule; the lab narrowed with
#      -DLAB_ONLY_SK, compiled during part 1 and linked against build-a's library), lab.txt, rows.txt, timeline.txt;
#   3. in the background from the start: build/ (the default CUDA_ARCH, tests/test_cuda) for the sanitizer call after
#      this one (dev/gpu/s26_san.sh).
# Usage: bash dev/gpu/s26_call2.sh $OUT
O=$1; mkdir -p "$O"
. scripts/gpu_env.sh
A="-gencode=arch=compute_90a,code=sm_90a"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee "$O/log.txt"
git log --oneline -1 | tee -a "$O/log.txt"
mkdir -p build-sk
( nvcc -c -O2 -std=c++17 $A -DLAB_ONLY_SK -Xptxas -v -Iinclude -Isrc $XC dev/cuda/moe_quant.cu -o build-sk/moe_quant.o \
    > "$O/lab_build.txt" 2>&1; echo "lab compile rc $? $(el)" >> "$O/log.txt" ) &
lp=$!
( nice make -j6 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/tests/test_cuda > /tmp/san_build.txt 2>&1
  echo "build/ (sanitizers) rc $? $(el)" >> "$O/log.txt" ) &
if [ ! -x build-a/dgemma ] || [ ! -f build-a/libdgemma.a ]; then
  echo "build-a missing: building $(el)" | tee -a "$O/log.txt"
  make -j8 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" BUILD=build-a CUDA_ARCH="$A" all > /tmp/build_a.txt 2>&1
  echo "build_a rc $? $(el)" | tee -a "$O/log.txt"
fi
if [ ! -f /tmp/dg26b/config.json ]; then
  echo "/tmp/dg26b missing: mkrandom $(el)" | tee -a "$O/log.txt"
  gpu_tokenizer; build-a/dgemma mkrandom /tmp/dg26b --source .cache/gemma3 -t 8 > /tmp/mkrandom.log 2>&1
  echo "mkrandom rc $? $(el)" | tee -a "$O/log.txt"
fi
export LD_LIBRARY_PATH="$CUL:/tmp/dgdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BIN=build-a/dgemma SERVE_WAIT=300 timeout 240 scripts/serve_bench.sh -m /tmp/dg26b -b "1 4 8" -n 256 -r 2 -- --device cuda \
  > "$O/serve.txt" 2>&1
echo "serve_bench rc $? $(el)" | tee -a "$O/log.txt"
cat "$O/serve.txt"
wait $lp
nvcc $A build-sk/moe_quant.o build-a/libdgemma.a -L"$CUL" $NXL -lcublas -lcudart -lcjson -lgomp -o build-sk/moe_quant \
  >> "$O/lab_build.txt" 2>&1
echo "lab link rc $? $(el)" | tee -a "$O/log.txt"
if [ -x build-sk/moe_quant ]; then
  grep -A2 -E "Compiling entry.*qr_sk_kernel" "$O/lab_build.txt" | grep -E "Compiling|registers|spill" > "$O/sk_ptxas.txt"
  for run in 1 2; do
    echo "## run $run" >> "$O/lab.txt"
    timeout 150 build-sk/moe_quant --bits 4 --versions ${LAB_VERSIONS:-50,110,112,113} --ms 16 --ts 128,256 --reps 5 >> "$O/lab.txt" 2>&1
    echo "lab run $run rc $? $(el): $(grep -c 'ok, = v50' "$O/lab.txt") rows = v50, $(grep -c 'vs 50.*(ok)' "$O/lab.txt") 112 rows ok vs 50, $(grep -c FAIL "$O/lab.txt") FAIL so far" | tee -a "$O/log.txt"
  done
  grep -E '^## run|\| (50|112|113) \|' "$O/lab.txt" > "$O/rows.txt"
  grep -E '^## run|\| 110 \||^  timeline|^   (phases|starts|slots|per-SM)' "$O/lab.txt" > "$O/timeline.txt"
  cat "$O/rows.txt"
else
  tail -30 "$O/lab_build.txt"
fi
wait
echo "done $(el)" | tee -a "$O/log.txt"
