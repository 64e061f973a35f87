#!/usr/bin/env bash
# The README's main-job command: install dependencies, build, create the embedded default
# tiny checkpoint if it is absent (models/tiny, random weights in the official format), then
# run `ds41 generate` on it, then serve it (`ds41 serve` on a free loopback port) and answer one
# chat request through the server with `ds41 chat --url` (DS41_DEMO_SERVE=0 skips the server).
# Extra arguments are passed to `ds41 generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
MODEL=${DS41_DEMO_MODEL:-models/tiny}
if [ ! -f "$MODEL/config.json" ]; then
  # The tiny preset with the V4.1 tokenizer copied in (its vocabulary widened to 129,280 ids).
  ./build/tools/ds41 make-checkpoint --preset tiny --seed 1 --tokenizer ../shared/tokenizer-v41 --out "$MODEL"
fi
./build/tools/ds41 inspect "$MODEL"
./build/tools/ds41 generate --model "$MODEL" --prompt "${DS41_DEMO_PROMPT:-The capital of France is}" --max-tokens 32 "$@"
if [ "${DS41_DEMO_SERVE:-1}" = 1 ]; then
  log=$(mktemp)
  ./build/tools/ds41 serve --model "$MODEL" --port 0 -q >"$log" 2>&1 &
  pid=$!
  trap 'kill "$pid" 2>/dev/null || true; rm -f "$log"' EXIT
  url=""
  for _ in $(seq 1 300); do
    url=$(grep -o 'http://[0-9.]*:[0-9]*' "$log" | head -1 || true)
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "demo: ds41 serve exited" >&2; exit 1; }
    sleep 0.2
  done
  [ -n "$url" ] || { cat "$log"; echo "demo: ds41 serve did not become ready" >&2; exit 1; }
  echo "demo: serving $MODEL at $url; one chat request:"
  printf '%s\n' "${DS41_DEMO_PROMPT:-The capital of France is}" | ./build/tools/ds41 chat --url "$url" --max-tokens 32
  kill -TERM "$pid"
  wait "$pid"
  echo "demo: server stopped"
fi
