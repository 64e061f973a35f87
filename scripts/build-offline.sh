#!/usr/bin/env bash
# On a GPU host without package access (CUDA toolkit, a C++20 compiler, CMake >= 3.25 and ninja
# present): unpacks the bundle made by scripts/bundle-deps.sh into a prefix (no root needed) and
# configures + builds ds41 against it (CUDA on when nvcc is found), into ./build unless told.
#   scripts/build-offline.sh BUNDLE_DIR [PREFIX] [-- extra cmake args]
# Afterwards `source PREFIX/env.sh` sets LD_LIBRARY_PATH for running the binaries and tests.
# DS41_DEPS_ONLY=1: only unpack the bundle and write env.sh (then e.g. `source PREFIX/env.sh;
# DS41_NO_DEPS=1 scripts/test.sh --sanitize tsan`).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/build-offline.sh BUNDLE_DIR [PREFIX] [-- cmake args]" >&2; exit 2; }
bundle=$(cd "$1" && pwd); shift
prefix=${DS41_DEPS_PREFIX:-$PWD/.deps-prefix}
if [ $# -ge 1 ] && [ "$1" != "--" ]; then prefix=$1; shift; fi
[ $# -ge 1 ] && [ "$1" = "--" ] && shift
build_dir=${DS41_BUILD_DIR:-build}
ls "$bundle"/*.deb >/dev/null 2>&1 || { echo "build-offline: no .deb files in $bundle" >&2; exit 1; }
if [ -f "$bundle/SHA256SUMS" ]; then (cd "$bundle" && sha256sum --quiet -c SHA256SUMS) || { echo "build-offline: bundle checksum mismatch" >&2; exit 1; }; fi
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
for f in "$bundle"/*.deb; do dpkg-deb -x "$f" "$prefix"; done
arch_lib="$prefix/usr/lib/x86_64-linux-gnu"
cat > "$prefix/env.sh" <<ENV
export PKG_CONFIG_PATH="$arch_lib/pkgconfig:$prefix/usr/share/pkgconfig:$prefix/usr/lib/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$prefix"
export PKG_CONFIG_LIBDIR="$arch_lib/pkgconfig:$prefix/usr/share/pkgconfig"
export LD_LIBRARY_PATH="$arch_lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export CMAKE_PREFIX_PATH="$prefix/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
export PATH="$prefix/usr/bin:\$PATH"
ENV
# shellcheck disable=SC1091
source "$prefix/env.sh"
if [ "${DS41_DEPS_ONLY:-0}" = 1 ]; then echo "build-offline: dependencies in $prefix (source $prefix/env.sh)"; exit 0; fi
pkgconf_bin="$prefix/usr/bin/pkgconf"
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then export PATH=/usr/local/cuda/bin:$PATH; fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPKG_CONFIG_EXECUTABLE="$pkgconf_bin" -DCMAKE_PREFIX_PATH="$prefix/usr" "$@"
ninja -C "$build_dir"
echo "build-offline: built into $build_dir; run 'source $prefix/env.sh' before running tests"
