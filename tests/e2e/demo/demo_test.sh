#!/usr/bin/env bash
# e2e: make-checkpoint --tokenizer + generate (the path scripts/demo.sh takes).
set -euo pipefail
DS41=$1
SHARED=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$DS41" make-checkpoint --preset tiny --seed 3 --tokenizer "$SHARED/tokenizer-v41" --out "$tmp/m" >/dev/null
test -f "$tmp/m/tokenizer.json"
grep -q '"vocab_size": 129280' "$tmp/m/config.json"
out=$("$DS41" generate --model "$tmp/m" --prompt "The capital of France is" --max-tokens 8 --seed 1 2>"$tmp/err")
grep -q "decode: 8 tokens" "$tmp/err" || { cat "$tmp/err"; echo "expected 8 decoded tokens"; exit 1; }
[ -n "$out" ] || { echo "no text streamed"; exit 1; }
# Same seed, same output (greedy by default is deterministic; sampling is seeded).
out2=$("$DS41" generate --model "$tmp/m" --prompt "The capital of France is" --max-tokens 8 --seed 1 2>/dev/null)
[ "$out" = "$out2" ] || { echo "generate is not deterministic"; exit 1; }
"$DS41" generate --model "$tmp/m" --prompt "Hi" --chat --effort max --max-tokens 4 >/dev/null 2>&1
# A bad effort is a clear error, exit code non-zero.
if "$DS41" generate --model "$tmp/m" --prompt "Hi" --chat --effort 101 --max-tokens 4 >/dev/null 2>"$tmp/err2"; then
  echo "effort 101 accepted"; exit 1
fi
grep -qi "effort" "$tmp/err2" || { cat "$tmp/err2"; exit 1; }
echo ok
