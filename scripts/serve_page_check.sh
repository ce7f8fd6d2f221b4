#!/usr/bin/env bash
# serve_page_check.sh [OUT_DIR]: the live canvas page in headless Chromium (Debian package `chromium`,
# driven by the npm package puppeteer-core 23.11.1, installed here into .node/ if missing; neither is
# installed by setup.sh: ~300 MB, so this check is not part of `make test`).
#  1. a fresh `dgemma serve` (turbo engine) on a free loopback port;
#  2. the page with ?q=QUESTION: it must show the canvas from the draft-canvas events, then the
#     streamed answer and "done (stop|length|repetition)" (scripts/serve_page_check.cjs);
#  3. with OUT_DIR, a screenshot mid-denoising (a 512-token answer without stop ids, taken once the
#     canvas has some settled positions) to OUT_DIR/serve-page.png.
# Exit 0 if every check passed. BIN = path of dgemma (default build/dgemma).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/dgemma}
OUT=${1:-}
CHROME=$(command -v chromium || command -v chromium-browser || true)
[ -n "$CHROME" ] || { echo "serve_page_check: chromium is not installed (apt-get install chromium)" >&2; exit 2; }
if ! grep -qs '"version": "23.11.1"' .node/node_modules/puppeteer-core/package.json; then
  echo "serve_page_check: installing puppeteer-core 23.11.1 into .node/"
  mkdir -p .node && npm install --silent --no-audit --no-fund --prefix .node puppeteer-core@23.11.1 >/dev/null
fi
KW='{"diffusion_turbo": true, "turbo_accept": "confidence", "turbo_threshold": [0.95, 0.80, 8], "turbo_repair": true, "turbo_compact": true}'
tmp=$(mktemp -d); SPID=""
trap '[ -n "$SPID" ] && kill $SPID 2>/dev/null; rm -rf "$tmp"' EXIT
start() { # $1 = gen kwargs
  PORT=$((20000 + RANDOM % 20000))
  OMP_WAIT_POLICY=passive "$BIN" serve --port $PORT --quiet --gen-kwargs "$1" 2>"$tmp/server.log" &
  SPID=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "serve_page_check: the server did not start" >&2; cat "$tmp/server.log" >&2; exit 1
}
stop() { kill $SPID; wait $SPID 2>/dev/null || true; SPID=""; }
start "$KW"
res=$(NODE_PATH=.node/node_modules node scripts/serve_page_check.cjs "http://127.0.0.1:$PORT/?q=What%20is%207%20times%208%3F" "$CHROME")
stop
echo "page: $res"
echo "$res" | grep -q '"answer":"model: [^"]' && echo "$res" | grep -Eq '"status":"done \((stop|length|repetition)\)"' ||
  { echo "serve_page_check: FAILED (no streamed answer or no end)" >&2; exit 1; }
if [ -n "$OUT" ]; then
  mkdir -p "$OUT"
  start '{"diffusion_turbo": true, "turbo_compact": true, "eos_token_id": [], "max_new_tokens": 512}'
  res=$(NODE_PATH=.node/node_modules node scripts/serve_page_check.cjs \
        "http://127.0.0.1:$PORT/?q=Tell%20me%20a%20story%20about%20the%20sea." "$CHROME" "$OUT/serve-page.png")
  stop
  echo "mid-denoising: $res"
  echo "screenshot: $OUT/serve-page.png"
fi
echo "serve_page_check: passed"
