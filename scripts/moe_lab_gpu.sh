#!/usr/bin/env bash
# moe_lab_gpu.sh OUT: the kernel lab of the quantized MoE on the GPU machine (issue 11): build, every
# version of dev/cuda/moe_quant.cu checked and timed, Nsight Compute on the gathered 256-token MoE,
# the PyTorch anchors. At most 8 files come back from a run: OUT holds log.txt, lab.md, lab.jsonl,
# lab_v1.jsonl, ncu.txt, torch.md, torch.jsonl, ceiling.jsonl.
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/moe_lab_gpu.sh OUT}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
t0=$(date +%s); el() { echo "($(( $(date +%s) - t0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
XC=""; XL=""; NXL=""
if ! echo '#include <cjson/cJSON.h>' | cc -E -x c - >/dev/null 2>&1; then
  P=/tmp/dgdeps; for f in .devdeb/*.deb; do dpkg -x "$f" $P; done; L=$P/usr/lib/x86_64-linux-gnu
  XC="-I$P/usr/include"; XL="-L$L -Wl,-rpath,$L"; NXL="-L$L -Xlinker -rpath -Xlinker $L"
fi
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" all > "$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
CUL=$(dirname "$(readlink -f "$(command -v nvcc)")")/../lib64
nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iinclude -Isrc $XC dev/cuda/moe_quant.cu build/libdgemma.a \
  -L"$CUL" $NXL -lcublas -lcudart -lcjson -lgomp -o build/moe_quant || exit 1
echo "== built $(el)"
timeout 240 build/moe_quant --bits 4,3,2 --versions 2,3,4,5 --json "$OUT/lab.jsonl" > "$OUT/lab.md" 2>&1; echo "lab rc $? $(el)"
timeout 100 build/moe_quant --bits 4 --versions 1 --ms 1,16,64 --ts 256 --reps 5 --json "$OUT/lab_v1.jsonl" >> "$OUT/lab.md" 2>&1; echo "lab v1 rc $? $(el)"
grep -E "ceilings|check:" "$OUT/lab.md"
timeout 120 ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis -k regex:qe_kernel -c 4 build/moe_quant --bits 4 --versions 2,3 --ms none --ts 256 --reps 1 \
  > "$OUT/ncu.txt" 2>&1; echo "ncu rc $? $(el)"
PYTHONUNBUFFERED=1 timeout 150 python3 scripts/torch_anchors.py --ceilings docs/results/h200-moe/ceiling_cuda_run1.jsonl -o "$OUT/torch.jsonl" > "$OUT/torch.md" 2>&1; echo "torch rc $? $(el)"
tail -40 "$OUT/torch.md"
echo "== done $(el)"
