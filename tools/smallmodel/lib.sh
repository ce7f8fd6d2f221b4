# lib.sh: the prelude shared by run_all.sh, sweep.sh and train_chunk.sh (sourced, not run).
# sm_opt "$@": the options every script takes (--data, --work, --out, --minutes: DATA, WORK, OUT,
# MINUTES); returns 0 when it took "$1 $2", 1 when "$1" is another option.
sm_opt() {
  case "$1" in
    --data) DATA=$2 ;;
    --work) WORK=$2 ;;
    --out) OUT=$2 ;;
    --minutes) MINUTES=$2 ;;
    *) return 1 ;;
  esac
}
# sm_start WORK: PY (python, $PYTHON if set), T (the tools folder), the whole output appended to
# WORK/run.log, stage "text" lines with the seconds since the start.
sm_start() {
  PY=${PYTHON:-python3}
  T=tools/smallmodel
  mkdir -p "$1"
  exec > >(tee -a "$1/run.log") 2>&1
  T0=$(date +%s)
}
stage() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }
# sm_environment: the GPU and the versions of torch, Transformers and tokenizers in the log.
sm_environment() {
  stage "environment"
  nvidia-smi -L 2>/dev/null || echo "(no nvidia-smi)"
  $PY -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "| transformers", transformers.__version__, "| tokenizers", tokenizers.__version__)'
}
# sm_pack FUNC (the EXIT trap): with --out, run FUNC to fill OUT (at most 8 files come back from a GPU
# command), list OUT, and exit with the script's status.
sm_pack() {
  local rc=$?
  [ -n "$OUT" ] || exit $rc
  stage "pack -> $OUT (exit status so far $rc)"
  mkdir -p "$OUT"
  "$1" || true
  ls -la "$OUT"
  exit $rc
}
# sm_parts NAME: standard input (a tar) split into 15 MiB parts OUT/NAME.tar.part-NN
# (cat NAME.tar.part-* | tar x).
sm_parts() { split -b 15m -d -a 2 - "$OUT/$1.tar.part-"; }
