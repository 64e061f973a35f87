#!/usr/bin/env bash
# The README's test command: install dependencies, build, run every test that needs no GPU.
# GPU tests carry the label "gpu" and skip themselves when no device is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j2 --timeout 900
