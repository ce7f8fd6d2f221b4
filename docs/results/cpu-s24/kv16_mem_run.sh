#!/bin/bash
# issue 16 memory bullet after kv16 (canvas K/V in the KV cache's canvas slots): mem_per_canvas at 2 and 4 layers,
# aud16's method and configs; then main (0783b0b) on the 2-layer model as the same-run peer
R=/tmp/kv16m
C3=/work/wt-kv16/docs/results/cpu-s23
for c in 2:/work/main/.devdata/cfg_26b_2layers.json 4sfsf:$C3/aud16_cfg_26b_4layers_sfsf.json 4sssf:$C3/aud16_cfg_26b_4layers_sssf.json; do
  n=${c%%:*}; cfg=${c#*:}; d=$R/m$n
  echo "== $n $cfg $(date -u +%H:%M:%S) load: $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf $d
  /usr/bin/time -f "mkrandom %e s, peak %M kB" $R/bin/dgemma mkrandom $d --config $cfg -t 2 2>&1 | tail -2
  du -sh $d
  echo "-- kv16 ($(git -C /work/wt-kv16 rev-parse --short HEAD) + working tree)"
  /usr/bin/time -f "mem_per_canvas %e s, peak %M kB" $R/bin/mem_per_canvas_kv16 $d 3 2 2 2>&1
  if [ $n = 2 ]; then
    echo "-- main 0783b0b (before)"
    /usr/bin/time -f "mem_per_canvas %e s, peak %M kB" $R/bin/mem_per_canvas_main $d 3 2 2 2>&1
  fi
  rm -rf $d
  echo "== end $n $(date -u +%H:%M:%S) load: $(cut -d' ' -f1-3 /proc/loadavg)"
done
