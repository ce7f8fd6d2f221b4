#!/bin/bash
# session 20, call 4 (the warm machine of call 3, 85 s of the session's device time left): call 3's step runs of synccheck
# and racecheck again (call 3's three concurrent sanitize_gpu.sh SAN_LAYERS=2 runs raced on /tmp/cfgL.json, rewrote
# /tmp/dgL under each other, and two found no model), one process each, at once.
OUT=$1
. scripts/gpu_env.sh; rm -rf /tmp/dgL; build/dgemma mkrandom /tmp/dgL --config dev/cfg_26b_2layers.json --source .cache/gemma3 -t 16 > /tmp/mkL.log 2>&1; tail -1 /tmp/mkL.log; EX="--kernel-name-exclude kns=nvjet --kernel-name-exclude kns=cublasLt"; for tool in synccheck racecheck; do o=""; [ $tool = synccheck ] && o="$EX"; ( timeout 80 compute-sanitizer --tool $tool $o --error-exitcode 9 build/dgemma run -m /tmp/dgL --device cuda -p hi -n 256 -s 1 > $OUT/step_$tool.txt 2>&1; echo "# rc $?" >> $OUT/step_$tool.txt ) & done; wait; for f in $OUT/step_*.txt; do echo "== $f"; grep -E "SUMMARY|rc |tok/s" $f; grep -E "(access|Thread \([0-9,]+\)) at " $f | sed -E 's/.* at //; s/\+0x.*//' | sort | uniq -c | sort -rn | head -20; done
