#!/usr/bin/env bash
# The README's main-job command: install dependencies, build, create the embedded default
# tiny checkpoint if it is absent (models/tiny, random weights in the official format), then
# run `ds41 generate` on it. Extra arguments are passed to `ds41 generate`.
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
