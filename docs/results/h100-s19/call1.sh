#!/bin/bash
# session 19, call 1 (issue 16): the four sanitizer tools over the tests added since session 12, and three tools over
# a 2-layer cut of the 26B step, all at once after one build; then initcheck's cuBLAS question again.
OUT=$1; set -u; . scripts/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/gpu.txt; compute-sanitizer --version >> $OUT/gpu.txt 2>&1
make -j16 CUDA=1 WERROR= XCFLAGS="$XC" XLDFLAGS="$XL" all build/tests/test_cuda > /tmp/build.txt 2>&1 || { tail -30 /tmp/build.txt; exit 1; }
echo "build $(el)"
nvcc -O2 -gencode=arch=compute_90,code=sm_90 dev/cuda/initcheck_gemm.cu -lcublas -o build/initcheck_gemm > /tmp/ig.txt 2>&1 & ig=$!
gpu_tokenizer
build/dgemma mkrandom /tmp/dgL --config .devdata/cfg_26b_2layers.json --source .cache/gemma3 -t 16 > /tmp/mkL.log 2>&1 || { tail -5 /tmp/mkL.log; exit 1; }
echo "mkrandom 2-layer $(el)"
mkdir -p $OUT/step
for tool in memcheck racecheck synccheck; do
  ( s0=$(date +%s); log=$OUT/step/${tool}_26b_2layers.txt
    { echo "# compute-sanitizer --tool $tool --error-exitcode 9 build/dgemma run -m /tmp/dgL --device cuda -p hi -n 256 -s 1"
      timeout ${STEP_T:-380} compute-sanitizer --tool $tool --error-exitcode 9 build/dgemma run -m /tmp/dgL --device cuda -p hi -n 256 -s 1 2>&1 | cut -c1-400
      echo "# rc ${PIPESTATUS[0]}, $(( $(date +%s) - s0 )) s"; } > $log ) &
done
wait $ig; ( compute-sanitizer --tool initcheck --print-limit 3 build/initcheck_gemm > $OUT/initcheck_gemm.txt 2>&1; echo "# rc $?" >> $OUT/initcheck_gemm.txt ) &
SAN_PAR=all SAN_T=${SAN_T:-380} SAN_TOOLS="memcheck racecheck synccheck initcheck" \
  SAN_FILTER="test_vocab_modes test_ctx_arena test_cuda_copy test_branch test_quant_experts_diet test_quant_experts_lab test_experts_dn_fuse test_attention@9 test_attention@10 test_attention@11" \
  scripts/sanitize_gpu.sh $OUT/tests > $OUT/tests_stdout.txt 2>&1 &
( DG_TEST_FILTER=test_gemm_pins timeout ${SAN_T:-380} compute-sanitizer --tool synccheck --error-exitcode 9 build/tests/test_cuda > /tmp/gp.txt 2>&1; echo "# rc $?" >> /tmp/gp.txt; head -c 20000 /tmp/gp.txt > $OUT/synccheck_gemm_pins.txt ) &
wait
echo "all $(el)"
for f in $OUT/step/*.txt; do echo "== $f"; grep -E "SUMMARY|^# rc" $f; done
cat $OUT/initcheck_gemm.txt | tail -5; tail -3 $OUT/synccheck_gemm_pins.txt
mkdir -p /tmp/prev && cp $OUT/tests/summary_*.txt /tmp/prev/ 2>/dev/null; true
