#!/usr/bin/env bash
# ds41 scripts/cuda-host-emu/run.sh: builds the attention / indexer / selection / KV-row / mHC / index-list /
# linear / vision / fused-row / Engram / tensor-core-prep parity tests
# (tests/parity/cuda/{cuda,kv_rows,attention,selection,mhc,gx_step,tc_prep,expert_gemm,linear,vision,fused_rows,engram,moe}_parity_test.cpp)
# against the kernels of
# src/backends/cuda run by the host SIMT emulator (simt_emu.h), and runs them with an optional gtest
# filter. Needs a configured ./build with ds41_backend_cpu built (ninja -C build ds41_backend_cpu),
# g++ >= 12, the CUDA headers (/usr/local/cuda/include) and gtest. Slow (a ucontext switch per
# barrier and warp intrinsic): the selection, indexer and KV-row tables take minutes, the sparse
# attention table about an hour (filter it out: --gtest_filter=-AttentionParity.SparseAttention; the small
# split-decode table AttentionParity.SparseAttentionSplitDecode takes seconds), the mHC map table minutes.
# The linear tables at the released widths are far too large for it: run the small-shape table only
# (--gtest_filter='LinearParity.Small*:LinearParity.*Errors'). The vision table (VisionParity.*) takes
# about ten minutes (the image-sized attention and RoPE cases).
#   scripts/cuda-host-emu/run.sh ['--gtest_filter=KvRows*:*Reject*']
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=${DS41_EMU_DIR:-$root/build/cuda-host-emu}
mkdir -p "$out"
emu=$root/scripts/cuda-host-emu
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
fl=(-std=c++20 -O1 -ffp-contract=off -w -I"$root/src" -I"$root/tests" -I"$cuda_inc" -DDS41_SOURCE_DIR="\"$root\"")
kernels=(fake_quant argmax tc_prep expert_gemm kv_rows attention sparse_attention_tc indexer indexer_tc topk compressor mhc gx_step linear tc_gemv rope_2d dense_attention space_to_depth vision_pointwise elementwise fused_rows moe fused_moe engram)
extra=(weight_dequant)  # sources not named *_kernels.cu (the Engram gather's row dequantizer)
# An object newer than its source, every backends/cuda header and the emulator is kept (2-core hosts).
fresh() {  # fresh OBJ SRC...
  [[ -f $1 ]] || return 1
  local o=$1; shift
  [[ -z $(find "$@" "$root"/src/backends/cuda/*.h "$root"/src/backends/cuda/*.cuh "$emu/simt_emu.h" -newer "$o" 2>/dev/null) ]]
}
for k in "${kernels[@]}"; do
  fresh "$out/${k}_kernels_emu.o" "$root/src/backends/cuda/${k}_kernels.cu" && continue
  python3 "$emu/rewrite_launches.py" "$root/src/backends/cuda/${k}_kernels.cu" "$out/${k}_kernels_emu.cpp"
  g++ "${fl[@]}" -include "$emu/simt_emu.h" -c "$out/${k}_kernels_emu.cpp" -o "$out/${k}_kernels_emu.o" &
done
for k in "${extra[@]}"; do
  fresh "$out/${k}_emu.o" "$root/src/backends/cuda/${k}.cu" && continue
  python3 "$emu/rewrite_launches.py" "$root/src/backends/cuda/${k}.cu" "$out/${k}_emu.cpp"
  g++ "${fl[@]}" -include "$emu/simt_emu.h" -c "$out/${k}_emu.cpp" -o "$out/${k}_emu.o" &
done
for t in cuda kv_rows attention selection mhc gx_step tc_prep expert_gemm linear vision fused_rows engram moe; do
  fresh "$out/${t}_parity_test.o" "$root/tests/parity/cuda/${t}_parity_test.cpp" "$root/tests/parity/cuda"/*.h && continue
  g++ "${fl[@]}" -c "$root/tests/parity/cuda/${t}_parity_test.cpp" -o "$out/${t}_parity_test.o" &
done
g++ "${fl[@]}" -c "$emu/runtime_stubs.cpp" -o "$out/runtime_stubs.o"
for p in $(jobs -p); do wait "$p"; done
b=$root/build/src
g++ -o "$out/emu_parity_tests" "$out"/*.o "$b/backends/cpu/libds41_backend_cpu.a" "$b/ops/libds41_ops.a" \
  "$b/quant/libds41_quant.a" "$b/core/libds41_core.a" -lgtest -lgtest_main -lpthread
exec "$out/emu_parity_tests" "$@"
