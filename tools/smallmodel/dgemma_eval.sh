#!/usr/bin/env bash
# dgemma_eval.sh: dgemma's own evaluation of an exported small model, the turbo table's configurations
# run side by side (one `dgemma eval problems` process each) instead of one after another.
#
#   tools/smallmodel/dgemma_eval.sh --model DIR --out DIR [--dgemma BIN] [--threads T] [--limit N]
#       [--windows shakespeare_windows.jsonl] [--tar FILE.tgz]
#
#   --model DIR    the exported Hugging Face directory (e.g. /tmp/smc/train/model after train_chunk.sh --final)
#   --out DIR      per configuration NAME.jsonl / NAME.md / NAME.log exactly as scripts/turbo_table.py writes
#                  them (a rerun resumes each), then turbo_table.md / .jsonl / table.txt from
#                  `turbo_table.py --analyze-only`; sh_dgemma.txt with --windows
#   --threads T    threads per process (default 3: five processes on a 16-core machine)
#   --limit N      the first N held-out problems only (a quick check of the pipeline)
#   --windows F    also `dgemma eval text` on eval_hf.py's shakespeare_windows.jsonl (one process, T threads)
#   --tar FILE     pack --out into FILE (a GPU call returns at most 8 files)
# The configurations and their --gen-kwargs come from scripts/turbo_table.py's DEFAULT_CONFIGS, the problems
# from tools/smallmodel/data/problems_heldout.jsonl; item i uses seed i in every configuration, as in
# turbo_table.py. Exit status: 1 if a process failed (its NAME.log says why), else 0.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=build-cpu/dgemma MODEL="" OUT="" T=3 LIMIT=0 WIN="" TAR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --dgemma) BIN=$2; shift 2 ;;
    --threads) T=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --windows) WIN=$2; shift 2 ;;
    --tar) TAR=$2; shift 2 ;;
    *) echo "dgemma_eval.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$MODEL" ] && [ -n "$OUT" ] || { echo "dgemma_eval.sh: --model DIR and --out DIR are required" >&2; exit 2; }
[ -x "$BIN" ] || { echo "dgemma_eval.sh: no dgemma binary at $BIN (--dgemma)" >&2; exit 2; }
[ -f "$MODEL/config.json" ] || { echo "dgemma_eval.sh: $MODEL has no config.json" >&2; exit 2; }
mkdir -p "$OUT"
FILE=tools/smallmodel/data/problems_heldout.jsonl
LIM=(); [ "$LIMIT" -gt 0 ] && LIM=(--limit "$LIMIT")
t0=$(date +%s)
pids=(); names=()
while IFS=$'\t' read -r name kw; do
  args=(eval problems --file "$FILE" -o "$OUT/$name.jsonl" -t "$T" -m "$MODEL" "${LIM[@]}")
  [ -n "$kw" ] && args+=(--gen-kwargs "$kw")
  echo "dgemma_eval: $name: $BIN ${args[*]}" >&2
  "$BIN" "${args[@]}" > "$OUT/$name.md" 2> "$OUT/$name.log" &
  pids+=($!); names+=("$name")
done < <(python3 -c 'import sys; sys.path.insert(0, "scripts"); import turbo_table as t
for n, k in t.DEFAULT_CONFIGS: print("%s\t%s" % (n, k))')
rc=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    echo "dgemma_eval: ${names[$i]} done ($(( $(date +%s) - t0 )) s)" >&2
  else
    echo "dgemma_eval: ${names[$i]} failed ($(( $(date +%s) - t0 )) s): $(tail -2 "$OUT/${names[$i]}.log")" >&2; rc=1
  fi
done
python3 scripts/turbo_table.py --analyze-only --out "$OUT" "${LIM[@]}" > "$OUT/table.txt" 2>&1 || rc=1
cat "$OUT/table.txt"
if [ -n "$WIN" ]; then
  s0=$(date +%s)
  "$BIN" eval text -m "$MODEL" -t "$T" -f "$WIN" > "$OUT/sh_dgemma.txt" 2>&1 || rc=1
  echo "dgemma_eval: eval text $(( $(date +%s) - s0 )) s" >> "$OUT/sh_dgemma.txt"
  tail -3 "$OUT/sh_dgemma.txt"
fi
echo "dgemma_eval: all done in $(( $(date +%s) - t0 )) s, status $rc" >&2
[ -n "$TAR" ] && tar -czf "$TAR" -C "$(dirname "$OUT")" "$(basename "$OUT")"
exit $rc
