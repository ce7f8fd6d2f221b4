#!/bin/bash
# session 19, call 3 (right after call 2, the machine warm, /tmp/dgL and the build still there): synccheck of the
# 2-layer 26B step and of test_gemm_pins for 560 s each, and racecheck of test_synth_logits case 2 with every report.
OUT=${1:?usage: call3.sh OUT}; . scripts/gpu_env.sh; mkdir -p $OUT/s
( s0=$(date +%s); timeout 560 compute-sanitizer --tool synccheck --error-exitcode 9 build/dgemma run -m /tmp/dgL --device cuda -p hi -n 256 -s 1 > /tmp/sc.txt 2>&1; echo "# rc $?, $(( $(date +%s) - s0 )) s" >> /tmp/sc.txt; cut -c1-400 /tmp/sc.txt | head -c 30000 > $OUT/s/synccheck_26b_2layers.txt ) &
( s0=$(date +%s); DG_TEST_FILTER=test_gemm_pins timeout 560 compute-sanitizer --tool synccheck --error-exitcode 9 build/tests/test_cuda > /tmp/gp.txt 2>&1; echo "# rc $?, $(( $(date +%s) - s0 )) s" >> /tmp/gp.txt; head -c 20000 /tmp/gp.txt > $OUT/s/synccheck_gemm_pins.txt ) &
( s0=$(date +%s); DG_TEST_CASE=2 DG_TEST_FILTER=test_synth_logits timeout 400 compute-sanitizer --tool racecheck --print-limit 100 --racecheck-report all build/tests/test_cuda > /tmp/r2.txt 2>&1; echo "# rc $?, $(( $(date +%s) - s0 )) s" >> /tmp/r2.txt; head -c 60000 /tmp/r2.txt > $OUT/s/racecheck_synth2_all.txt ) &
wait
