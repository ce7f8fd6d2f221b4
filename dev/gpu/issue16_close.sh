#!/bin/bash
# Issue 16's last sanitizer pairs at HEAD (docs/cuda.md "Issue 16's sanitizer account", review aud16): the four tools
# over test_group_sums_perm, test_router_route (mode 4), test_combine_norm (version 2) and test_route on the default
# build, and over test_wgmma and test_quant_experts_wgmma on an sm_90a build (they skip on the default one).
# One call, carry .devdeb; about 5-6 minutes on an H100. Usage: bash dev/gpu/issue16_close.sh $OUT
O=$1; mkdir -p "$O"
. scripts/gpu_env.sh
git log --oneline -1 2>/dev/null | tee "$O/log.txt"; nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$O/log.txt"
gpu_build "$O/build.txt" || exit 1; echo "build $(el)" | tee -a "$O/log.txt"
F="test_group_sums_perm test_router_route test_combine_norm test_route"
( make -j8 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" BUILD=build-a CUDA_ARCH="-gencode=arch=compute_90a,code=sm_90a" \
    build-a/tests/test_cuda > /tmp/build_a.txt 2>&1 || { echo "build_a FAILED" >> "$O/log.txt"; exit 1; }
  echo "build_a $(el)" >> "$O/log.txt"
  mkdir -p "$O/w"
  for tool in memcheck racecheck initcheck synccheck; do
    for t in test_wgmma test_quant_experts_wgmma; do
      DG_TEST_FILTER=$t timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 build-a/tests/test_cuda > "$O/w/${tool}_$t.txt" 2>&1
      echo "$tool $t rc $? $(el) $(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$O/w/${tool}_$t.txt" | tr '\n' ' ') $(grep -c '\[  PASSED  \]\|\[  SKIPPED \]' "$O/w/${tool}_$t.txt") passed/skipped lines" >> "$O/log.txt"
    done
  done ) &
bw=$!
DGEMMA_INITCHECK=1 SAN_OPTS="--kernel-name-exclude kns=nvjet --kernel-name-exclude kns=cublasLt" SAN_PAR=all SAN_T=300 \
  SAN_TOOLS="memcheck initcheck synccheck" SAN_FILTER="$F" scripts/sanitize_gpu.sh "$O/a" > "$O/stdout_a.txt" 2>&1 &
ba=$!
SAN_PAR=all SAN_T=300 SAN_TOOLS=racecheck SAN_FILTER="$F" scripts/sanitize_gpu.sh "$O/b" > "$O/stdout_b.txt" 2>&1
wait $ba; wait $bw
echo "done $(el)" | tee -a "$O/log.txt"
cat "$O"/a/summary_*.txt "$O"/b/summary_*.txt 2>/dev/null | tee -a "$O/log.txt"
tar -czf "$O/all.tgz" -C "$O" a b w build.txt stdout_a.txt stdout_b.txt && rm -rf "$O/a" "$O/b" "$O/w" "$O/build.txt" "$O"/stdout_*.txt
