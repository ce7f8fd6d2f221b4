#!/bin/bash
# issue 16 memory bullet: mem_per_canvas at 2 and 4 layers (aud16)
cd /work/wt-aud16
R=/tmp/aud16m
for c in 2:/work/main/.devdata/cfg_26b_2layers.json 4sfsf:$R/cfg4_sfsf.json 4sssf:$R/cfg4_sssf.json; do
  n=${c%%:*}; cfg=${c#*:}; d=$R/m$n
  echo "== $n $cfg $(date -u +%H:%M:%S) load: $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf $d
  /usr/bin/time -f "mkrandom %e s, peak %M kB" /tmp/aud16m/bin/dgemma mkrandom $d --config $cfg -t 2 2>&1 | tail -3
  du -sh $d
  /usr/bin/time -f "mem_per_canvas %e s, peak %M kB" /tmp/aud16m/bin/mem_per_canvas $d 3 2 2 2>&1
  rm -rf $d
  echo "== end $n $(date -u +%H:%M:%S) load: $(cut -d' ' -f1-3 /proc/loadavg)"
done
