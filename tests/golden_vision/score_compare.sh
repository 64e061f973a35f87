#!/usr/bin/env bash
# Golden (issue 16): `ds41 score --debug` on the public vision set's manifest (its images and
# prompts) and the set's own checker, make_goldens.py compare, on the output: every array it
# knows must pass (plans and resized_u8 exact, tower rows <= 1e-4, logits <= 5e-3, routing sets,
# Engram delta 0 on spans, hash ids at text positions).
# With DEVICE cuda the GPU engine runs it (its tower through Engine::encode_images, so the output
# holds span_embeds but not vit_out / aligner_out / pixel_values / inputs_embeds / engram_delta_rms);
# exit 77 (ctest: skipped) when this ds41 has no CUDA or no GPU is visible, or python3 has no NumPy.
#   score_compare.sh DS41_BINARY SHARED_DIR [DEVICE]
set -euo pipefail
ds41=$1
shared=$2
device=${3:-cpu}
set_dir=$shared/golden/v41-tiny-vision-public
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if ! "$ds41" score --model "$set_dir" --tokenizer "$shared/tokenizer-v41" --input "$set_dir/manifest.json" \
  --out "$out/vision.safetensors" --debug --device "$device" 2> "$out/err.txt"; then
  cat "$out/err.txt" >&2
  if grep -q -e 'no CUDA device found' -e 'built without CUDA' "$out/err.txt"; then exit 77; fi
  exit 1
fi
cat "$out/err.txt" >&2
# Debian's python3 carries NumPy (python3-numpy in .ci/packages.txt); a pyenv shim first on PATH may not.
py=/usr/bin/python3
[ -x "$py" ] || py=python3
# DS41_SCORE_KEEP=DIR keeps the score output (to compare it on another machine).
[ -n "${DS41_SCORE_KEEP:-}" ] && cp "$out/vision.safetensors" "$DS41_SCORE_KEEP/vision_$device.safetensors"
# A GPU host without NumPy (no package access) cannot run the checker: skipped, saying so.
if ! "$py" -c 'import numpy' 2> /dev/null; then
  echo "score_compare: $py has no NumPy: the compare is skipped (run it where NumPy is, e.g. with DS41_SCORE_KEEP)" >&2
  exit 77
fi
"$py" "$shared/golden/tools/make_goldens.py" compare "$set_dir" "$out/vision.safetensors" | tee "$out/compare.txt"
grep -q '^OVERALL PASS' "$out/compare.txt"
n=$(grep -c 'PASS$' "$out/compare.txt" || true)
echo "vision golden compare ($device): $n arrays PASS"
[ "$n" -ge 60 ]
