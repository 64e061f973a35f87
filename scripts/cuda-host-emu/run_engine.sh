#!/usr/bin/env bash
# ds41 scripts/cuda-host-emu/run_engine.sh: the GPU engine's test binaries (tests/gpu/engine or
# tests/gpu/model) linked against every kernel of src/backends/cuda run by the host SIMT emulator
# (simt_emu.h), a host CUDA runtime (runtime_host.cpp: device memory is host memory, everything
# synchronous) and a host cuBLAS (cublas_host.cpp), so the executor's logic — step plan, buffer
# layouts and strides, the vision tower, image spans — runs against the goldens on a machine
# without a GPU. It checks logic, not the device: timing, occupancy, races, real cuBLAS / libdevice
# rounding are not emulated. Needs a configured ./build (or DS41_BUILD_DIR) with DS41_CUDA=ON and the test targets
# built (ninja -C build ds41_gpu_engine_tests ds41_gpu_model_tests), g++ >= 12, the CUDA headers.
# Slow: a forward of the golden tiny model takes tens of seconds (GpuVision.* about 10 minutes).
#   scripts/cuda-host-emu/run_engine.sh engine|model ['--gtest_filter=GpuVision.*']
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
which=${1:?engine or model}
shift
out=${DS41_EMU_DIR:-$root/build/cuda-host-emu-engine}
mkdir -p "$out"
emu=$root/scripts/cuda-host-emu
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
fl=(-std=c++20 -O1 -ffp-contract=off -w -I"$root/src" -I"$root/tests" -I"$cuda_inc")
# Every kernel file, rewritten for the emulator (rebuilt when the .cu or the emulator changed).
for cu in "$root"/src/backends/cuda/*.cu; do
  k=$(basename "$cu" .cu)
  o=$out/${k}_emu.o
  if [ ! -f "$o" ] || [ "$cu" -nt "$o" ] || [ "$emu/simt_emu.h" -nt "$o" ] || [ "$emu/rewrite_launches.py" -nt "$o" ]; then
    python3 "$emu/rewrite_launches.py" "$cu" "$out/${k}_emu.cpp"
    g++ "${fl[@]}" -include "$emu/simt_emu.h" -c "$out/${k}_emu.cpp" -o "$o" &
  fi
done
g++ -std=c++20 -O2 -I"$cuda_inc" -c "$emu/runtime_host.cpp" -o "$out/runtime_host.o" &
g++ -std=c++20 -O2 -I"$cuda_inc" -c "$emu/cublas_host.cpp" -o "$out/cublas_host.o" &
g++ "${fl[@]}" -c "$root/src/backends/cuda/cuda_status.cpp" -o "$out/cuda_status.o" &
g++ "${fl[@]}" -c "$root/src/backends/cuda/launch.cpp" -o "$out/launch.o" &  # the PDL switch, launch errors and counts
for p in $(jobs -p); do wait "$p"; done
bdir=${DS41_BUILD_DIR:-$root/build}  # a configured CUDA tree with the test target built
b=$bdir/src
libs=("$b/gpu/libds41_gpu.a" "$b/engine/libds41_engine.a" "$b/model/libds41_model.a"
      "$b/backends/cpu/libds41_backend_cpu.a" "$b/ops/libds41_ops.a" "$b/kvcache/libds41_kvcache.a"
      "$b/engram/libds41_engram.a" "$b/text/libds41_text.a" "$b/image/libds41_image.a"
      "$b/quant/libds41_quant.a" "$b/core/libds41_core.a")
# The test objects, unity batches included (CMakeLists.txt "Unity builds": .../Unity/unity_N_cxx.cxx.o).
mapfile -t tobjs < <(find "$bdir/tests/gpu/$which/CMakeFiles/ds41_gpu_${which}_tests.dir" -name "*.o")
g++ -o "$out/gpu_${which}_tests_emu" "${tobjs[@]}" \
  -Wl,--start-group "${libs[@]}" "$out"/*.o -Wl,--end-group -lgtest -lgtest_main -lgmock -lxxhash -lhiredis \
  -luring -lpcre2-8 -lutf8proc -lpng16 -ljpeg -lwebpdemux -lwebp -lgif -lpthread -ldl 2>&1 | grep -v "warning:" || true
cd "$bdir"
exec "$out/gpu_${which}_tests_emu" "$@"
