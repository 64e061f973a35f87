#!/usr/bin/env bash
# On a connected Debian machine: gathers the project's library build and runtime dependencies
# (.ci/bundle-packages.txt) as .deb files into a bundle folder (default ./deps-bundle), with a
# SHA256SUMS file. Copy the folder to the GPU host and run scripts/build-offline.sh there.
#   scripts/bundle-deps.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-deps-bundle}
mkdir -p "$out"
out=$(cd "$out" && pwd)
pkgs=$(grep -v '^#' .ci/bundle-packages.txt | grep -v '^$')
missing=0
for p in $pkgs; do
  if ! (cd "$out" && apt-get download "$p" >/dev/null 2>&1); then
    echo "bundle-deps: apt-get download $p failed (run 'apt-get update' first?)" >&2
    missing=1
  fi
done
[ "$missing" = 0 ] || exit 1
(cd "$out" && sha256sum ./*.deb > SHA256SUMS)
echo "bundle-deps: $(ls "$out"/*.deb | wc -l) packages, $(du -sh "$out" | cut -f1) in $out"
