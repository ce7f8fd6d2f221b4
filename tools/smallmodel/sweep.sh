#!/usr/bin/env bash
# sweep.sh: train several variants of the small model at once on one GPU, keep the best.
#
#   tools/smallmodel/sweep.sh --resume MODEL_DIR --minutes M [--data DIR] [--work DIR] [--out DIR] \
#       --variant 'NAME: train.py args' [--variant ...]
#
# One process cannot keep the H200 busy with a 10 M-parameter model (each step is dominated by
# kernel launches and Python), so the variants run side by side, each its own train.py with its
# own output directory. Then each exported model generates the VALIDATION problems
# (problems_val.jsonl: 25 per step count, seed 9012, disjoint from training and held-out), the
# variant with the best 1-2 step accuracy (ties: all-step accuracy, then command-line order)
# is kept, and only that one is evaluated on the held-out set
# (eval_hf.py, problems + Shakespeare). The held-out set never takes part in the choice.
#
#   --resume DIR  exported model every variant starts from (its tokenizer is reused); without it
#                 every variant starts from scratch with a freshly trained tokenizer
#   --out DIR     at the end: bundle.tar.part-NN (15 MiB parts of the best model, logs, results),
#                 run.log, results.md, loss.png, sweep.md (the per-variant table)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1
# shellcheck source=tools/smallmodel/lib.sh
. tools/smallmodel/lib.sh

DATA=.devdata WORK=/tmp/sweep OUT="" MINUTES=6 RESUME=""
NAMES=() ARGS=()
while [ $# -gt 0 ]; do
  if sm_opt "$@"; then shift 2; continue; fi
  case "$1" in
    --resume) RESUME=$2; shift 2 ;;
    --variant)
      n=${2%%:*}; n=${n// /}
      [[ "$n" =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "sweep.sh: bad variant name in '$2'" >&2; exit 2; }
      NAMES+=("$n"); ARGS+=("${2#*:}"); shift 2 ;;
    *) echo "sweep.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ ${#NAMES[@]} -gt 0 ] || { echo "sweep.sh: give at least one --variant 'NAME: args'" >&2; exit 2; }
sm_start "$WORK"

pack_files() {
  (cd "$WORK" && ls -d run.log loss.png sweep.md tokenizer best eval data/data_meta.json \
      v_*/train_log.csv v_*/train_summary.json v_*/train.log v_*/val/results.json 2>/dev/null) > "$WORK/.packlist" || true
  tar -cf - -C "$WORK" -T "$WORK/.packlist" | sm_parts bundle || true
  for f in run.log loss.png sweep.md eval/results.md; do
    [ -f "$WORK/$f" ] && cp "$WORK/$f" "$OUT/$(basename "$f")"
  done
}
trap 'sm_pack pack_files' EXIT

sm_environment

stage "data"
$PY $T/prepare_data.py --data "$DATA" --out "$WORK/data"
if [ -n "$RESUME" ]; then
  stage "tokenizer: reusing $RESUME/tokenizer.json"
  mkdir -p "$WORK/tokenizer"
  cp "$RESUME/tokenizer.json" "$WORK/tokenizer/"
  [ -f "$RESUME/tokenizer_config.json" ] && cp "$RESUME/tokenizer_config.json" "$WORK/tokenizer/"
  RES=(--resume "$RESUME")
else
  stage "tokenizer"
  $PY $T/train_tokenizer.py --data "$WORK/data" --out "$WORK/tokenizer"
  RES=()
fi

stage "train ${#NAMES[@]} variants side by side, $MINUTES minutes each"
pids=()
for i in "${!NAMES[@]}"; do
  d="$WORK/v_${NAMES[$i]}"; mkdir -p "$d"
  echo "variant ${NAMES[$i]}: train.py ${ARGS[$i]}" | tee "$d/args.txt"
  # shellcheck disable=SC2086  # the variant's arguments are meant to split
  $PY $T/train.py --data "$WORK/data" --tokenizer "$WORK/tokenizer" --out "$d" --minutes "$MINUTES" \
      "${RES[@]}" ${ARGS[$i]} > "$d/train.log" 2>&1 &
  pids+=($!)
done
fail=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then echo "variant ${NAMES[$i]}: trained"; else echo "variant ${NAMES[$i]}: FAILED"; fail=1; fi
  grep -E "^train: (step [0-9]*0{2} |trained|consistency|hf check)" "$WORK/v_${NAMES[$i]}/train.log" | tail -4 || true
done

stage "validation (problems_val.jsonl) for every exported variant"
pids=()
for i in "${!NAMES[@]}"; do
  d="$WORK/v_${NAMES[$i]}"
  [ -f "$d/model/config.json" ] || continue
  $PY $T/eval_hf.py --model "$d/model" --data "$WORK/data" --out "$d/val" --problems-file problems_val.jsonl \
      --skip-shakespeare > "$d/val.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail=1; done

BEST=$($PY - "$WORK" "${NAMES[@]}" <<'EOF'
import json, os, sys
work, names = sys.argv[1], sys.argv[2:]
rows = []
for i, n in enumerate(names):
    d = os.path.join(work, "v_" + n)
    try:
        r = json.load(open(os.path.join(d, "val", "results.json")))["problems"]
        s = json.load(open(os.path.join(d, "train_summary.json")))
    except (OSError, KeyError, ValueError):
        rows.append((n, None, None, None, None, None)); continue
    rows.append((n, r["steps_1_2"]["acc"], r["acc"], s["steps"], s["examples_seen"], s["train_seconds"]))
ok = [r for r in rows if r[1] is not None]
best = max(ok, key=lambda r: (r[1], r[2], -names.index(r[0])))[0] if ok else ""
with open(os.path.join(work, "sweep.md"), "w") as f:
    f.write("| variant | train.py args | steps | examples | train s | val 1-2 steps | val all |\n|---|---|---|---|---|---|---|\n")
    for n, a12, aall, st, ex, ts in rows:
        args = open(os.path.join(work, "v_" + n, "args.txt")).read().split(":", 1)[1].strip()
        f.write("| %s%s | `%s` | %s | %s | %s | %s | %s |\n" % (
            n, " (kept)" if n == best else "", args, st, ex, ts,
            "-" if a12 is None else "%.1f%%" % (100 * a12), "-" if aall is None else "%.1f%%" % (100 * aall)))
print(best)
EOF
)
cat "$WORK/sweep.md"
[ -n "$BEST" ] || { echo "sweep.sh: no variant produced a model"; exit 1; }
stage "kept variant $BEST; held-out evaluation"
rm -rf "$WORK/best"; cp -r "$WORK/v_$BEST" "$WORK/best"
$PY $T/plot_loss.py "$WORK/best/train_log.csv" "$WORK/loss.png" || echo "(plot failed; continuing)"
$PY $T/eval_hf.py --model "$WORK/best/model" --data "$WORK/data" --out "$WORK/eval"
stage "done"
exit $fail
