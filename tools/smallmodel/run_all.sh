#!/usr/bin/env bash
# run_all.sh: reproduce the bundled small DiffusionGemma from scratch, in one command, on the
# GPU machine: data -> tokenizer -> train (time-boxed) -> export -> HF reload/generate check ->
# evaluation -> loss plot -> pack.
#
#   tools/smallmodel/run_all.sh [--smoke] [--minutes M] [--data DIR] [--work DIR] [--out DIR]
#                               [--resume MODEL_DIR] [-- extra train.py args]
#
#   --data DIR    copies of ../shared/data/gsm8k/train.jsonl and
#                 ../shared/data/text/tinyshakespeare/input.txt (default .devdata)
#   --work DIR    where every stage writes (default /tmp/smallmodel)
#   --out DIR     if given, at the end: DIR/bundle.tar.part-00, -01, ... (a tar of the model
#                 directory, logs and results, split in 15 MiB parts: cat bundle.tar.part-* | tar x)
#                 plus run.log, results.md, loss.png and train_summary.json (at most 8 files)
#   --minutes M   training-loop budget (default 6; the whole run takes about M + 2.5 minutes)
#   --smoke       every stage on a tiny budget (about 1.5-2 minutes in all) to validate the pipeline
#   --resume DIR  start from an exported model (its tokenizer is reused; no tokenizer training)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1
# shellcheck source=tools/smallmodel/lib.sh
. tools/smallmodel/lib.sh

DATA=.devdata WORK=/tmp/smallmodel OUT="" MINUTES=6 SMOKE=0 RESUME=""
EXTRA=()
while [ $# -gt 0 ]; do
  if sm_opt "$@"; then shift 2; continue; fi
  case "$1" in
    --smoke) SMOKE=1; shift ;;
    --resume) RESUME=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "run_all.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
sm_start "$WORK"

pack_files() {
  (cd "$WORK" && ls -d run.log loss.png tokenizer train/model train/train_log.csv train/train_summary.json \
      eval data/data_meta.json data/problems_heldout.jsonl 2>/dev/null) > "$WORK/.packlist" || true
  tar -cf - -C "$WORK" -T "$WORK/.packlist" | sm_parts bundle || true
  for f in run.log loss.png train/train_summary.json eval/results.md; do
    [ -f "$WORK/$f" ] && cp "$WORK/$f" "$OUT/$(basename "$f")"
  done
}
trap 'sm_pack pack_files' EXIT

sm_environment

if [ "$SMOKE" = 1 ]; then
  PREP=(--train-n 20000); TOKA=(--problems 2000 --check-samples 3000)
  TRAINA=(--max-steps 20 --minutes 1 --log-every 5)
  EVALA=(--per-step 4 --sh-windows 4 --gen-batch 32)
else
  PREP=(); TOKA=(); TRAINA=(--minutes "$MINUTES"); EVALA=()
fi

stage "data"
$PY $T/prepare_data.py --data "$DATA" --out "$WORK/data" "${PREP[@]}"

if [ -n "$RESUME" ]; then
  stage "tokenizer: reusing $RESUME/tokenizer.json"
  mkdir -p "$WORK/tokenizer"
  cp "$RESUME/tokenizer.json" "$WORK/tokenizer/"
  [ -f "$RESUME/tokenizer_config.json" ] && cp "$RESUME/tokenizer_config.json" "$WORK/tokenizer/"
  TRAINA+=(--resume "$RESUME")
else
  stage "tokenizer"
  $PY $T/train_tokenizer.py --data "$WORK/data" --out "$WORK/tokenizer" "${TOKA[@]}"
fi

stage "train + export + HF check"
$PY $T/train.py --data "$WORK/data" --tokenizer "$WORK/tokenizer" --out "$WORK/train" "${TRAINA[@]}" "${EXTRA[@]}"

stage "loss plot"
$PY $T/plot_loss.py "$WORK/train/train_log.csv" "$WORK/loss.png" || echo "(plot failed; continuing)"

stage "evaluation (Transformers)"
$PY $T/eval_hf.py --model "$WORK/train/model" --data "$WORK/data" --out "$WORK/eval" "${EVALA[@]}"

stage "done"
