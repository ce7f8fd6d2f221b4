#!/bin/bash
# (ran as dev/gpu/s23_lab.sh at d726a53 on an H100 80GB HBM3, 143.5 s wall, session 23's first call)
# Session 23, issue 11's lab call: the persistent versions 107-108 (helper pers22) beside 50 (the backend) and 95,
# their barriers under racecheck and synccheck (cuBLAS's ceiling GEMM left uninstrumented), and the wgmma emulation
# against the hardware (test_wgmma, test_quant_experts_wgmma on an sm_90a build). Usage: bash dev/gpu/s23_lab.sh $OUT
# (carry .devdeb .devbin)
O=$1; mkdir -p "$O"
. scripts/gpu_env.sh
P=/tmp/dgdeps; [ -d $P ] || for f in .devdeb/*.deb; do dpkg -x $f $P; done
export LD_LIBRARY_PATH="$CUL:$P/usr/lib/x86_64-linux-gnu"
xz -dc .devbin/moe_quant.xz > /tmp/mq; chmod +x /tmp/mq
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$O/lab.txt"
t0=$(date +%s)
/tmp/mq --bits 4 --versions 50,95,107,108 --ms 16 --ts 256,512 --reps 5 >> "$O/lab.txt" 2>&1; echo "lab rc $? $(( $(date +%s)-t0 )) s" | tee -a "$O/log.txt"
# the sm_90a build for the wgmma checks, in the background while the sanitizers run
( make -j12 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" BUILD=build-a CUDA_ARCH="-gencode=arch=compute_90a,code=sm_90a" build-a/tests/test_cuda > "$O/build_a.txt" 2>&1; echo "build_a rc $? $(( $(date +%s)-t0 )) s" >> "$O/log.txt" ) &
bp=$!
for tool in racecheck synccheck; do
  timeout 120 compute-sanitizer --tool $tool --kernel-name-exclude kns=nvjet --kernel-name-exclude kns=cublasLt /tmp/mq --bits 4 --versions 107,108 --ms none --ts 256 --reps 1 > "$O/san_$tool.txt" 2>&1
  echo "$tool rc $? $(( $(date +%s)-t0 )) s: $(grep -c 'ok, = v50' "$O/san_$tool.txt") rows = v50; $(grep 'ERROR SUMMARY\|RACECHECK SUMMARY' "$O/san_$tool.txt" | tr '\n' ' ')" | tee -a "$O/log.txt"
done
wait $bp
for f in test_wgmma test_quant_experts_wgmma; do
  DG_TEST_FILTER=$f timeout 120 build-a/tests/test_cuda > "$O/$f.txt" 2>&1; echo "$f rc $? $(( $(date +%s)-t0 )) s: $(tail -2 "$O/$f.txt" | tr '\n' ' ')" | tee -a "$O/log.txt"
done
tail -30 "$O/build_a.txt" > "$O/build_tail.txt"; rm -f "$O/build_a.txt"
