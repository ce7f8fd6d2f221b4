#!/bin/bash
# Several GPU scripts one after another in one device call (session 30: the machine is scarce, each start was refused
# several times; a warm call saves the start and the transfers). Usage:
#   DG_CALL_S=590 bash dev/gpu/s30_chain.sh $OUT NAME=SCRIPT [NAME=SCRIPT ...]
# Each SCRIPT runs as `DG_CALL_S=<seconds left> timeout <seconds left> bash SCRIPT /tmp/chain_NAME`, so its own
# guards plan within what is left of the call (scripts/gpu_env.sh call_budget); then its folder is packed into
# $OUT/NAME.tgz (one file back per script; the device returns at most 8). An item with < 60 s left is skipped.
# chain.txt: each item's rc, and the seconds since the call started. Environment (e.g. AT12_BENCH=1) passes through.
O=${1:?usage: dev/gpu/s30_chain.sh OUT NAME=SCRIPT ...}; shift; mkdir -p "$O"
start=$(date +%s); total=${DG_CALL_S:-600}
for it in "$@"; do
  name=${it%%=*}; script=${it#*=}
  rem=$(( total - ($(date +%s) - start) - 15 ))
  if [ "$rem" -lt 60 ]; then echo "$name skipped: $rem s left" >> "$O/chain.txt"; continue; fi
  d=/tmp/chain_$name; rm -rf "$d"; mkdir -p "$d"
  DG_CALL_S=$rem timeout "$rem" bash "$script" "$d" > "$d/stdout.txt" 2>&1
  echo "$name rc $? at $(( $(date +%s) - start )) s (given $rem s)" >> "$O/chain.txt"
  tar czf "$O/$name.tgz" -C /tmp "chain_$name"
done
cat "$O/chain.txt"
