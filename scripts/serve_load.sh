#!/usr/bin/env bash
# serve_load.sh [-n REQUESTS] [-b MAX_BATCH] [-k MAX_TOKENS] [-t THREADS] [-r ROUNDS]: the load test of `dgemma serve`
# on loopback (bounded: REQUESTS requests of at most MAX_TOKENS tokens). A fresh server with the turbo
# engine's recommended setting, then scripts/serve_load.cjs (node's fetch, no packages): REQUESTS
# concurrent streams, each checked against the same request run alone; prints lost / corrupted /
# mismatched counts, p50/p99 latency, aggregate tok/s and the server's RSS after warm-up and after the
# load (ROUNDS > 1: the concurrent phase repeated, the RSS after each round). Exit 0 when nothing was lost,
# corrupted or different. BIN = dgemma (default build/dgemma).
set -euo pipefail
cd "$(dirname "$0")/.."
N=100; B=4; K=64; T=0; R=1
while getopts "n:b:k:t:r:" o; do case $o in n) N=$OPTARG;; b) B=$OPTARG;; k) K=$OPTARG;; t) T=$OPTARG;; r) R=$OPTARG;; *) exit 2;; esac; done
BIN=${BIN:-build/dgemma}
KW='{"diffusion_turbo": true, "turbo_accept": "confidence", "turbo_threshold": [0.95, 0.80, 8], "turbo_repair": true, "turbo_compact": true}'
PORT=$((20000 + RANDOM % 20000))
OMP_WAIT_POLICY=passive "$BIN" serve --port $PORT -t "$T" --max-batch "$B" --max-queue $((N + 16)) --quiet --gen-kwargs "$KW" &
SPID=$!
trap 'kill $SPID 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break; sleep 0.1; done
node scripts/serve_load.cjs $PORT $SPID "$N" "$K" "$R"
