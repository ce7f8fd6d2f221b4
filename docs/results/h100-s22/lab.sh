#!/bin/bash
# (ran as dev/gpu/s22_lab.sh at 2c72ca5~ on an H100 80GB HBM3, 245.6 s wall; the source page (src.csv.gz, 1.4 MB) was not committed: counts.txt is its summary)
# Session 22, issue 11's lab call: versions 102-106 beside 50 and 95, the ring versions' barriers under
# racecheck and synccheck, and the ncu source page of the fastest new version at T 256. Usage: bash dev/gpu/s22_lab.sh $OUT
O=$1; mkdir -p "$O"
. scripts/gpu_env.sh
P=/tmp/dgdeps; [ -d $P ] || for f in .devdeb/*.deb; do dpkg -x $f $P; done
export LD_LIBRARY_PATH="$CUL:$P/usr/lib/x86_64-linux-gnu"
xz -dc .devbin/moe_quant.xz > /tmp/mq; chmod +x /tmp/mq
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$O/lab.txt"
t0=$(date +%s)
/tmp/mq --bits 4 --versions 50,95,102,103,104,105,106 --ms 16 --ts 256,512 --reps 5 >> "$O/lab.txt" 2>&1; echo "lab rc $? $(( $(date +%s)-t0 )) s" | tee -a "$O/log.txt"
for tool in racecheck synccheck; do
  timeout 100 compute-sanitizer --tool $tool /tmp/mq --bits 4 --versions 105,106 --ms none --ts 256 --reps 1 > "$O/san_$tool.txt" 2>&1
  echo "$tool rc $? $(( $(date +%s)-t0 )) s: $(grep -c 'ok, = v50' "$O/san_$tool.txt") rows = v50; $(grep 'ERROR SUMMARY\|RACECHECK SUMMARY' "$O/san_$tool.txt" | tr '\n' ' ')" | tee -a "$O/log.txt"
done
# the fastest of 102-106 at gathered T 256 gate/up (median us)
best=$(awk -F'|' '$3 ~ /gate_up/ && $4 ~ /gathered T 256/ && $6+0 >= 102 {gsub(/ /,"",$6); print $7+0, $6}' "$O/lab.txt" | sort -n | head -1 | cut -d' ' -f2)
echo "fastest new version at T 256 gate/up: $best" | tee -a "$O/log.txt"
if [ -n "$best" ]; then
  timeout 150 ncu --set full --import-source no -k "regex:qr_kernel|qr_dring" -c 8 -o /tmp/lab$best /tmp/mq --bits 4 --versions $best --ms none --ts 256 --reps 1 > "$O/ncu.log" 2>&1
  echo "ncu rc $? $(( $(date +%s)-t0 )) s" | tee -a "$O/log.txt"
  ncu -i /tmp/lab$best.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>&1
  python3 scripts/qr_src_counts.py /tmp/src.csv > "$O/counts.txt" 2>&1
  gzip -c /tmp/src.csv > "$O/src.csv.gz"
fi
tail -3 "$O/ncu.log" >> "$O/log.txt"
