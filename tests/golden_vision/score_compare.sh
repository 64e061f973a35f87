#!/usr/bin/env bash
# Golden (issue 16): `ds41 score --debug` on the public vision set's manifest (its images and
# prompts) and the set's own checker, make_goldens.py compare, on the output: every array it
# knows must pass (plans and resized_u8 exact, tower rows <= 1e-4, logits <= 5e-3, routing sets,
# Engram delta 0 on spans, hash ids at text positions).
#   score_compare.sh DS41_BINARY SHARED_DIR
set -euo pipefail
ds41=$1
shared=$2
set_dir=$shared/golden/v41-tiny-vision-public
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$ds41" score --model "$set_dir" --tokenizer "$shared/tokenizer-v41" --input "$set_dir/manifest.json" \
  --out "$out/vision.safetensors" --debug
# Debian's python3 carries NumPy (python3-numpy in .ci/packages.txt); a pyenv shim first on PATH may not.
py=/usr/bin/python3
[ -x "$py" ] || py=python3
"$py" "$shared/golden/tools/make_goldens.py" compare "$set_dir" "$out/vision.safetensors" | tee "$out/compare.txt"
grep -q '^OVERALL PASS' "$out/compare.txt"
n=$(grep -c 'PASS$' "$out/compare.txt" || true)
echo "vision golden compare: $n arrays PASS"
[ "$n" -ge 60 ]
