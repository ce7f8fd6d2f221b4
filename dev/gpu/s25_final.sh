#!/bin/bash
# Session 25's last call (carry .devdeb .devdata/gemma3; ~7-9 minutes): dev/gpu/s25_at15.sh (the default build with
# attention version 15, the whole test_cuda, the vllm bench A B A B with DGEMMA_ATTN=6 / default) into $OUT/at15, and
# meanwhile the kernel lab narrowed to issue 11's tail split (-DLAB_ONLY_SK, dev/gpu/s25_sk11.sh's build, one nvcc
# beside the library's make), linked against that default build's library after the benches and run as s25_sk11.sh
# runs it (versions 50, 110, 112, 113 twice at M 16 and T 128/256) into $OUT/sk. The rules for reading both are in
# the two scripts' headers. Usage: bash dev/gpu/s25_final.sh $OUT
O=${1:?usage: dev/gpu/s25_final.sh OUT}; mkdir -p "$O/sk" "$O/at15"
. scripts/gpu_env.sh
A="-gencode=arch=compute_90a,code=sm_90a"
mkdir -p build-sk
nice nvcc -c -O2 -std=c++17 $A -DLAB_ONLY_SK -Xptxas -v -Iinclude -Isrc $XC dev/cuda/moe_quant.cu -o build-sk/moe_quant.o \
  > "$O/sk/lab_build.txt" 2>&1 &
lp=$!
bash dev/gpu/s25_at15.sh "$O/at15"
wait $lp; echo "lab compile rc $? $(el)" | tee -a "$O/sk/log.txt"
nvcc $A build-sk/moe_quant.o build/libdgemma.a -L"$CUL" $NXL -lcublas -lcudart -lcjson -lgomp -o build-sk/moe_quant \
  >> "$O/sk/lab_build.txt" 2>&1
echo "lab link rc $? $(el)" | tee -a "$O/sk/log.txt"
grep -A2 -E "Compiling entry.*qr_sk_kernel" "$O/sk/lab_build.txt" | grep -E "Compiling|registers|spill" > "$O/sk/sk_ptxas.txt"
export LD_LIBRARY_PATH="$CUL:/tmp/dgdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for run in 1 2; do
  echo "## run $run" >> "$O/sk/lab.txt"
  timeout 100 build-sk/moe_quant --bits 4 --versions 50,110,112,113 --ms 16 --ts 128,256 --reps 5 >> "$O/sk/lab.txt" 2>&1
  echo "lab run $run rc $? $(el): $(grep -c 'vs 50.*(ok)' "$O/sk/lab.txt") 112 rows ok vs 50, $(grep -c FAIL "$O/sk/lab.txt") FAIL" | tee -a "$O/sk/log.txt"
done
grep -E '^## run|\| (50|112|113) \|' "$O/sk/lab.txt" > "$O/sk/rows.txt"
cat "$O/sk/rows.txt"; cat "$O/at15/summary.md"
echo "done $(el)"
