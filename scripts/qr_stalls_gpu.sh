#!/usr/bin/env bash
# qr_stalls_gpu.sh OUT: where the quantized expert kernel's warps wait (issue 11). Nsight Compute's full set
# with warp-state sampling on version CASES of the MoE lab (default: version 3's gathered 256-token gate/up
# and its M = 1 gate/up), then per case: the raw metrics (raw_CASE.csv) and the SASS with its stall samples
# per instruction (src_CASE.csv). Carry .devdeb.
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/qr_stalls_gpu.sh OUT}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
. scripts/gpu_env.sh
make -j"$(nproc)" CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" build/libdgemma.a > /tmp/build.txt 2>&1 \
  || { tail -30 /tmp/build.txt; exit 1; }
lab_build || exit 1
echo "== built $(el)"
for c in ${CASES:-g256:3:--ms,none,--ts,256 m1:3:--ms,1,--ts,none}; do
  name=${c%%:*}; rest=${c#*:}; v=${rest%%:*}; args=$(echo "${rest#*:}" | tr , ' ')
  timeout 150 ncu --set full --import-source no -k regex:qr_kernel -c 1 -f -o /tmp/rep_$name \
    build/moe_quant --bits 4 --versions "$v" $args --reps 1 > /tmp/ncu_$name.log 2>&1
  echo "ncu $name rc $? $(el)"; tail -3 /tmp/ncu_$name.log
  ncu -i /tmp/rep_$name.ncu-rep --page raw --csv > "$OUT/raw_$name.csv" 2>&1
  ncu -i /tmp/rep_$name.ncu-rep --page source --csv --print-source sass > "$OUT/src_$name.csv" 2>&1
  ls -la "$OUT"
done
echo "== done $(el)"
