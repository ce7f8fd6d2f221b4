#!/usr/bin/env bash
# profile_gpu.sh OUT: where the GPU time goes (issues 11 and 12), in one command on the GPU machine:
#   1. Nsight Compute on the backend's quantized expert kernel (the lab's version 3, 4-bit gate/up) at
#      M = 1 and at the 256-token canvas: the full set of sections, and the per-SASS-instruction source
#      page (warp stall samples per instruction) as CSV (ncu_src_m1.csv, ncu_src_t256.csv)
#   2. Nsight Systems over the vllm protocol on the 26B random checkpoint (written by dgemma mkrandom
#      meanwhile): the GPU kernels by total time (nsys_kern.txt)
# OUT holds log.txt, ncu.txt, ncu_src_m1.csv, ncu_src_t256.csv, nsys_kern.txt. Carry .devdeb and .devdata.
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/profile_gpu.sh OUT}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
. scripts/gpu_env.sh
mkdir -p .cache/gemma3
[ -f .cache/gemma3/tokenizer.json ] || gunzip -c .devdata/gemma3/tokenizer.json.gz > .cache/gemma3/tokenizer.json
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" all > /tmp/build.txt 2>&1 || { tail -30 /tmp/build.txt; exit 1; }
(build/dgemma mkrandom /tmp/dg26b --source .cache/gemma3 -t 12 > /tmp/mkrandom.log 2>&1) &
mk=$!
nvcc -O2 -lineinfo -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iinclude -Isrc $XC dev/cuda/moe_quant.cu build/libdgemma.a \
  -L"$CUL" $NXL -lcublas -lcudart -lcjson -lgomp -o build/moe_quant || exit 1
echo "== built $(el)"
: > "$OUT/ncu.txt"
for c in "m1:--ms 1 --ts none" "t256:--ms none --ts 256"; do
  n=${c%%:*}; args=${c#*:}
  timeout 120 ncu --set full --import-source yes -k regex:qr_kernel -c 1 -o /tmp/ncu_$n build/moe_quant --bits 4 --versions 3 $args --reps 1 > /dev/null 2>&1
  echo "#### $n" >> "$OUT/ncu.txt"
  ncu -i /tmp/ncu_$n.ncu-rep >> "$OUT/ncu.txt" 2>&1
  ncu -i /tmp/ncu_$n.ncu-rep --page source --csv --print-source sass > "$OUT/ncu_src_$n.csv" 2>&1
  echo "ncu $n $(el): $(wc -l < "$OUT/ncu_src_$n.csv") source lines"
done
grep -E "####|Duration|DRAM Throughput|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|Achieved Active Warps" "$OUT/ncu.txt"
wait $mk; tail -1 /tmp/mkrandom.log
if command -v nsys > /dev/null; then
  timeout 200 nsys profile -o /tmp/nsys_vllm --force-overwrite true -t cuda build/dgemma bench -m /tmp/dg26b --device cuda \
    --protocol vllm --reps 1 > /tmp/nsys_run.txt 2>&1; echo "nsys rc $? $(el)"; tail -4 /tmp/nsys_run.txt
  nsys stats -r cuda_gpu_kern_sum -f column /tmp/nsys_vllm.nsys-rep > "$OUT/nsys_kern.txt" 2>&1
  head -40 "$OUT/nsys_kern.txt" | cut -c1-200
else
  echo "nsys not found"
fi
echo "== done $(el)"
