#!/usr/bin/env bash
# e2e: `ds41 chat` driven through a pipe on the tiny model — in-process (--model) and over HTTP
# (--url against `ds41 serve`): multi-turn history (the second prompt contains the first turn),
# /effort, /reset, /exit, EOF exits 0, thinking under a header without ANSI codes when stdout is
# not a terminal, a wrong key reported per turn; load progress lines from serve, none with -q.
#   chat_cli_test.sh DS41_BINARY SHARED_DIR
set -euo pipefail
DS41=$1
SHARED=$2
tmp=$(mktemp -d)
srv=""
cleanup() { [ -n "$srv" ] && kill "$srv" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
die() { echo "FAIL: $*"; echo "--- stdout"; cat "$tmp/out" 2>/dev/null; echo "--- stderr"; cat "$tmp/err" 2>/dev/null; exit 1; }
"$DS41" make-checkpoint --preset tiny --seed 1 --tokenizer "$SHARED/tokenizer-v41" --out "$tmp/m" >/dev/null

# prompt_tokens N: the prompt size of the N-th answered turn (from the stats lines on stderr).
prompt_tokens() { grep -o 'prompt [0-9]* tokens' "$tmp/err" | sed -n "$1p" | tr -dc 0-9; }

check_session() {  # $1: what ran
  grep -q -- '--- thinking ---' "$tmp/out" || die "$1: no thinking header"
  grep -q '(effort high)' "$tmp/out" || die "$1: /effort high not acknowledged"
  grep -q '(conversation cleared)' "$tmp/out" || die "$1: /reset not acknowledged"
  grep -q '(usage: /effort' "$tmp/out" || die "$1: bad /effort not rejected"
  if grep -q $'\033' "$tmp/out"; then die "$1: ANSI codes on a pipe"; fi
  [ "$(grep -c '(8 tokens' "$tmp/err")" = 4 ] || die "$1: expected 4 answers of 8 tokens"
  local p1 p2 p3
  p1=$(prompt_tokens 1); p2=$(prompt_tokens 2); p3=$(prompt_tokens 3)
  # Turn 2 carries turn 1 (its question and its 8-token answer); after /reset turn 3 starts over.
  [ "$p2" -gt $((p1 + 8)) ] || die "$1: second prompt ($p2) does not contain the first turn ($p1)"
  [ "$p3" -lt "$p2" ] || die "$1: /reset did not clear the history ($p3 >= $p2)"
  grep -q 'never sent' "$tmp/out" && die "$1: input after /exit was processed"
  true
}
# Turns 1-2 without thinking (the answer stays in the history), /reset, turn 3, then /effort high
# and turn 4 with thinking.
session=$'Hello\nAnd then?\n/effort bogus\n/reset\nHi\n/effort high\nThink\n/exit\nnever sent\n'

# In-process: -q prints no load progress.
printf '%s' "$session" | "$DS41" chat --model "$tmp/m" --max-tokens 8 --effort off -q >"$tmp/out" 2>"$tmp/err" || die "chat --model exit $?"
check_session "chat --model"
grep -q 'weights' "$tmp/err" && die "-q printed load progress"
echo "chat --model: prompts $(prompt_tokens 1) $(prompt_tokens 2) $(prompt_tokens 3)"

# EOF (no /exit) exits 0.
printf 'Hello\n' | "$DS41" chat --model "$tmp/m" --max-tokens 4 --effort off -q >"$tmp/out" 2>"$tmp/err" || die "EOF exit $?"

# Over HTTP, with a key; serve's stderr is not a terminal: plain progress lines ending at 100%.
"$DS41" serve --model "$tmp/m" --port 0 --api-key k1 >"$tmp/serve.out" 2>"$tmp/serve.err" &
srv=$!
for _ in $(seq 600); do grep -q 'ready on' "$tmp/serve.out" && break; sleep 0.1; done
url=$(grep -o 'http://[0-9.]*:[0-9]*' "$tmp/serve.out") || { cat "$tmp/serve.err"; die "serve not ready"; }
grep -q 'ds41 serve: weights: .*(100%)' "$tmp/serve.err" || { cat "$tmp/serve.err"; die "no load progress lines"; }
if grep -q $'\r' "$tmp/serve.err"; then die "progress redrawn (\\r) on a non-terminal"; fi
printf '%s' "$session" | "$DS41" chat --url "$url" --api-key k1 --max-tokens 8 --effort off >"$tmp/out" 2>"$tmp/err" || die "chat --url exit $?"
check_session "chat --url"
printf 'Hello\n' | "$DS41" chat --url "$url" --api-key wrong --max-tokens 8 >"$tmp/out" 2>"$tmp/err" || die "wrong key exit $?"
grep -q 'HTTP 401' "$tmp/err" || die "wrong key not reported"
echo ok
