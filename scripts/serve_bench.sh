#!/usr/bin/env bash
# serve_bench.sh [-m DIR] [-b "1 2 4"] [-n MAX_TOKENS] [-r ROUNDS] [-t THREADS] [-- SERVE_OPTS...]
# Aggregate throughput of `dgemma serve` with continuous batching: for each B, a fresh server with
# --max-batch B and the turbo engine's recommended setting, B concurrent non-streamed chat requests
# (different questions and seeds) per round, ROUNDS rounds after one warm-up round. Prints per B the
# tokens returned, the wall time, aggregate tok/s (tokens / wall), the speed-up over B = 1, and the
# server's batched denoising steps (one stacked decoder pass each) against the forwards the requests
# took. Needs curl and python3 (JSON); loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/dgemma-small; BS="1 2 4"; NTOK=128; ROUNDS=3; THREADS=0; EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    -m) MODEL=$2; shift 2;; -b) BS=$2; shift 2;; -n) NTOK=$2; shift 2;; -r) ROUNDS=$2; shift 2;;
    -t) THREADS=$2; shift 2;; --) shift; EXTRA=("$@"); break;; *) echo "serve_bench.sh: unknown option $1" >&2; exit 2;;
  esac
done
BIN=${BIN:-build/dgemma}
[[ ${SERVE_WAIT:-300} =~ ^[0-9]+$ ]] || { echo "serve_bench.sh: SERVE_WAIT=$SERVE_WAIT is not a number of seconds" >&2; exit 2; }
KW='{"diffusion_turbo": true, "turbo_accept": "confidence", "turbo_threshold": [0.95, 0.80, 8], "turbo_repair": true, "turbo_compact": true}'
QS=("What is 7 times 8?" "Tom has 23 apples and buys 14 more. How many apples does he have?"
    "Write a line about the sea." "What is 12 plus 30?" "Sam has 5 pens and loses 2. How many are left?"
    "Name a color." "What is 9 times 6?" "Tell me about the moon.")
PORT=$((20000 + RANDOM % 20000))
SPID=""
# (the trap's kill may fail, the server already stopped: allowed, so that set -e does not end the trap before its rm)
tmp=$(mktemp -d); trap '{ [ -n "$SPID" ] && kill $SPID 2>/dev/null; } || true; rm -rf "$tmp"' EXIT
base=""
for B in $BS; do
  OMP_WAIT_POLICY=passive "$BIN" serve -m "$MODEL" -t "$THREADS" --port $PORT --max-batch "$B" --quiet \
    --gen-kwargs "$KW" "${EXTRA[@]}" 2>"$tmp/server.log" &
  SPID=$!
  # until /health answers: SERVE_WAIT seconds at most (default 300: the 26B checkpoint loads in tens of seconds)
  for _ in $(seq $(( ${SERVE_WAIT:-300} * 10 ))); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    kill -0 $SPID 2>/dev/null || { echo "serve_bench.sh: the server exited:" >&2; tail -5 "$tmp/server.log" >&2; exit 1; }
    sleep 0.1
  done
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 || { echo "serve_bench.sh: no /health after ${SERVE_WAIT:-300} s" >&2; exit 1; }
  round() { # $1 = round index: B concurrent requests, their bodies to $tmp/r.$i
    local pids=()
    for i in $(seq 0 $((B - 1))); do
      q=${QS[$(( (i + $1 * B) % ${#QS[@]} ))]}
      curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -o "$tmp/r.$i" \
        -d "{\"messages\": [{\"role\": \"user\", \"content\": \"$q\"}], \"max_tokens\": $NTOK, \"seed\": $(( i + $1 * B ))}" &
      pids+=($!)
    done
    wait "${pids[@]}"
  }
  round 0 # warm-up
  steps0=$(curl -s "http://127.0.0.1:$PORT/metrics" | sed -n 's/^dgemma_step_seconds_count //p')
  tok=0; fwd=0; t0=$(date +%s.%N)
  for r in $(seq 1 "$ROUNDS"); do
    round "$r"
    for i in $(seq 0 $((B - 1))); do
      read -r a b < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["usage"]["completion_tokens"], d["dgemma"]["denoising_steps"])' "$tmp/r.$i")
      tok=$((tok + a)); fwd=$((fwd + b))
    done
  done
  t1=$(date +%s.%N)
  steps1=$(curl -s "http://127.0.0.1:$PORT/metrics" | sed -n 's/^dgemma_step_seconds_count //p')
  kill $SPID; wait $SPID 2>/dev/null || true; SPID=""
  python3 - "$B" "$tok" "$t0" "$t1" "$fwd" "$steps0" "$steps1" "${base:-0}" <<'PY'
import sys
B, tok, t0, t1, fwd, s0, s1, base = sys.argv[1:]
B, tok, fwd = int(B), int(tok), int(fwd)
wall = float(t1) - float(t0); tps = tok / wall
base = float(base) or tps
print(f"B={B}: {tok} tokens in {wall:.2f} s = {tps:.1f} tok/s aggregate ({tps / base:.2f}x B=1); "
      f"{int(float(s1) - float(s0))} batched steps for {fwd} forwards")
PY
  if [ -z "$base" ]; then base=$(python3 -c "print($tok / ($t1 - $t0))"); fi
done
