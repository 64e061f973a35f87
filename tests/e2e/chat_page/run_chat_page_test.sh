#!/usr/bin/env bash
# ctest wrapper for chat_page_test.js: skips (exit 77) without node or chromium, installs
# puppeteer-core from the committed lock (npm ci) when node_modules is missing or stale, makes
# the tiny model and runs the browser test.
#   run_chat_page_test.sh DS41_BINARY SHARED_DIR OUT_DIR
set -euo pipefail
DS41=$1
SHARED=$2
OUT=$3
here=$(cd "$(dirname "$0")" && pwd)
chromium=${DS41_CHROMIUM:-/usr/bin/chromium}
command -v node >/dev/null 2>&1 || { echo "SKIP: node is not installed (apt install nodejs npm)"; exit 77; }
[ -x "$chromium" ] || { echo "SKIP: $chromium is missing (apt install chromium)"; exit 77; }
if [ ! -f "$here/node_modules/.package-lock.json" ] ||
   ! cmp -s "$here/package-lock.json" "$here/node_modules/.ds41-lock"; then
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error) || { echo "FAIL: npm ci (network?)"; exit 1; }
  cp "$here/package-lock.json" "$here/node_modules/.ds41-lock"
fi
mkdir -p "$OUT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$DS41" make-checkpoint --preset tiny --seed 1 --tokenizer "$SHARED/tokenizer-v41" --out "$tmp/tiny" >/dev/null
node "$here/chat_page_test.js" "$DS41" "$tmp/tiny" "$OUT/chat_page.png"
