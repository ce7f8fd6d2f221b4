#!/usr/bin/env bash
# train_chunk.sh: one time-boxed piece of a training schedule that spans several GPU commands.
# Each call resumes the checkpoint the previous call left, trains --minutes, checkpoints and packs.
#
#   tools/smallmodel/train_chunk.sh --ckpt DIR --minutes M [--data DIR] [--work DIR] [--out DIR]
#       [--init MODEL_DIR] [--parts DIR] [--final] [-- train.py args for the first call]
#
#   --ckpt DIR    the full (fp32) training checkpoint, read and written on the GPU machine. Keep it
#                 in an ignored path of the repository that no call carries (.devout/ckpt): it stays
#                 there between the calls of one session while the machine is held
#   --init DIR    first call only: start from an exported model (its tokenizer is reused); without
#                 it the first call trains a tokenizer and the model from scratch
#   --parts DIR   when DIR/ckpt.tar.part-* exist and --ckpt holds no checkpoint (a fresh machine),
#                 unpack them into --ckpt first (the pack of an earlier session, carried back)
#   --out DIR     pack (at most 8 files, each under 16 MiB, 64 MiB in all): ckpt.tar.part-NN (the
#                 checkpoint as bf16 weights without AdamW moments, 15 MiB parts: about 19 MiB for
#                 the 9.9 M-parameter model; cat ckpt.tar.part-* | tar x), train_log.csv (every run
#                 so far), loss.png, run.log, train_summary.json; with --final also
#                 model.tar.part-NN (the exported Hugging Face directory)
#   --final       export the model and run Transformers' reload / generate check at the end
# The first call's train.py arguments fix the schedule (--schedule-steps, --lr, --warmup,
# --mix-schedule, --batch, ...); later calls take those from the checkpoint (train.py reports the
# arguments it ignores) and use the rest (--probe-every, --compile, --ckpt-every, --log-every).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1
# shellcheck source=tools/smallmodel/lib.sh
. tools/smallmodel/lib.sh

DATA=.devdata WORK=/tmp/smchunk OUT="" MINUTES=8 CKPT="" INIT="" PARTS="" FINAL=0
EXTRA=()
while [ $# -gt 0 ]; do
  if sm_opt "$@"; then shift 2; continue; fi
  case "$1" in
    --ckpt) CKPT=$2; shift 2 ;;
    --init) INIT=$2; shift 2 ;;
    --parts) PARTS=$2; shift 2 ;;
    --final) FINAL=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "train_chunk.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$CKPT" ] || { echo "train_chunk.sh: --ckpt DIR is required" >&2; exit 2; }
mkdir -p "$CKPT"
sm_start "$WORK"

pack_files() {
  if [ -f "$CKPT/state.pt" ]; then
    rm -rf "$WORK/ckpt_pack"
    $PY $T/ckpt.py convert "$CKPT" "$WORK/ckpt_pack" --dtype bf16 --moments drop &&
      tar -cf - -C "$WORK/ckpt_pack" . | sm_parts ckpt || true
  fi
  if [ "$FINAL" = 1 ] && [ -d "$WORK/train/model" ]; then
    tar -cf - -C "$WORK/train" model | sm_parts model || true
  fi
  for f in "$CKPT/train_log.csv" "$WORK/loss.png" "$WORK/run.log" "$WORK/train/train_summary.json"; do
    [ -f "$f" ] && cp "$f" "$OUT/$(basename "$f")"
  done
}
trap 'sm_pack pack_files' EXIT

sm_environment

if [ ! -f "$CKPT/state.pt" ] && [ -n "$PARTS" ] && ls "$PARTS"/ckpt.tar.part-* >/dev/null 2>&1; then
  stage "unpacking $PARTS/ckpt.tar.part-* into $CKPT"
  cat "$PARTS"/ckpt.tar.part-* | tar -x -C "$CKPT"
fi

if [ -f "$WORK/data/data_meta.json" ] && [ -f "$WORK/data/problems_ops1.jsonl" ]; then
  stage "data: reusing $WORK/data"
else
  stage "data"
  $PY $T/prepare_data.py --data "$DATA" --out "$WORK/data"
fi

TRAINA=(--ckpt "$CKPT" --minutes "$MINUTES")
[ "$FINAL" = 1 ] || TRAINA+=(--no-export)
if [ -f "$CKPT/state.pt" ]; then
  stage "train: resuming $CKPT ($($PY -c 'import json,sys; m=json.load(open(sys.argv[1])); print("global step", m["trainer"]["step"], "run", m["trainer"]["run"])' "$CKPT/meta.json"))"
  # the schedule, data and model settings come from the checkpoint (train.py reports any of EXTRA
  # that differ); EXTRA still sets this run's --probe-every, --compile, --ckpt-every, --log-every
  TRAINA+=(--resume-train "$CKPT" --tokenizer "$CKPT")
elif [ -n "$INIT" ]; then
  stage "train: first run of the schedule, from the exported model $INIT"
  TRAINA+=(--resume "$INIT" --tokenizer "$INIT")
else
  stage "tokenizer (first run of the schedule, from scratch)"
  $PY $T/train_tokenizer.py --data "$WORK/data" --out "$WORK/tokenizer"
  TRAINA+=(--tokenizer "$WORK/tokenizer")
fi
$PY $T/train.py --data "$WORK/data" --out "$WORK/train" "${TRAINA[@]}" "${EXTRA[@]}"

stage "loss plot (every run in $CKPT/train_log.csv)"
$PY $T/plot_loss.py "$CKPT/train_log.csv" "$WORK/loss.png" || echo "(plot failed; continuing)"
stage "done"
