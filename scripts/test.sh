#!/usr/bin/env bash
# The README's test command: install dependencies, build, run every test that needs no GPU.
# GPU tests carry the label "gpu" and skip themselves when no device is present.
#
#   scripts/test.sh                    plain build (./build), every test, then a short ThreadSanitizer
#                                      run of the thread pool and the async writer (./build-tsan-ci)
#   scripts/test.sh --sanitize asan    ASan+UBSan build (./build-asan, CUDA off), every non-gpu test
#   scripts/test.sh --sanitize tsan    TSan build (./build-tsan, CUDA off), every non-gpu test
#   scripts/test.sh --no-tsan          plain build and tests only
# Environment: DS41_NO_DEPS=1 skips the apt step (an offline host: source the prefix's env.sh from
# scripts/build-offline.sh first); DS41_TEST_JOBS sets ctest's parallelism (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=""
short_tsan=1
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize="${2:-}"; shift 2 ;;
    --sanitize=*) sanitize="${1#--sanitize=}"; shift ;;
    --no-tsan) short_tsan=0; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "scripts/test.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

[ "${DS41_NO_DEPS:-0}" = 1 ] || scripts/deps.sh
jobs=${DS41_TEST_JOBS:-2}

# Flags of a sanitizer build (the build type's -O2 -g1 follows and wins); frame pointers give readable stacks; -g1
# (line tables) is all a report's file:line needs and builds faster than -g.
san_flags() {
  case "$1" in
    asan) echo "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g1" ;;
    tsan) echo "-fsanitize=thread -fno-omit-frame-pointer -O1 -g1" ;;
    *) echo "scripts/test.sh: --sanitize takes asan or tsan, got '$1'" >&2; exit 2 ;;
  esac
}

# configure_san DIR KIND [CMAKE ARGS...]: a CUDA-off build tree with the sanitizer's flags.
configure_san() {
  local dir=$1 flags
  flags=$(san_flags "$2")
  shift 2
  # The build type's -O2 -g1 follows these flags and wins. Cutting it to -DNDEBUG (sanitizer trees
  # at -O1) made GCC 12 crash in IPA constant propagation (internal compiler error) on the CPU
  # backend's -O3 files compiled against the -O1 precompiled header: CI of 2026-12-03 failed so.
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDS41_CUDA=OFF \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="${flags%% *}" "$@" >/dev/null
}

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"

if [ -n "$sanitize" ]; then
  san_flags "$sanitize" >/dev/null
  dir="build-$sanitize"
  configure_san "$dir" "$sanitize"
  ninja -C "$dir"
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" --timeout 1800 -LE "${DS41_TEST_EXCLUDE:-gpu}"
  exit 0
fi

scripts/build.sh
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 900

if [ "$short_tsan" = 1 ]; then
  # The short TSan job CI keeps (the full TSan run is `--sanitize tsan`): the thread pool's
  # concurrent callers, the kvcache async writer and the engine loop (parallel sampling, streams
  # read by server threads, the prefix cache's block reads off the loop thread: BlockPrefetcher,
  # image encoding off the loop thread: ImageEncoder, CpuEngine::encode_images during step()),
  # the places shared by many threads.
  # ds41 itself too: this tree is configured without CUDA, so it checks that the binary still
  # builds for users without the CUDA toolkit (the plain build above has CUDA on when nvcc exists).
  # Nothing of it runs here, so its own sources build at -O0 -g0 (tools/CMakeLists.txt).
  # ds41_tsan_ci_tests holds only the test files run below (tests/tsan/CMakeLists.txt).
  configure_san build-tsan-ci tsan "-DDS41_TOOL_COMPILE_OPTIONS=-O0;-g0"
  ninja -C build-tsan-ci ds41_tsan_ci_tests ds41
  build-tsan-ci/tests/tsan/ds41_tsan_ci_tests \
    --gtest_filter='ThreadPool.*:AsyncWriter*:KvStore*:EngineLoop*:BlockPrefetcher*:ImageEncoder*:CpuEngineConcurrency*'
fi
