// ds41 backends/cuda: device helpers of `ds41 bench kernels` (bench_support.h).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "backends/cuda/bench_support.h"
#include "backends/cuda/cuda_status.h"

namespace ds41::cuda {
namespace {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over `items`: at most 8 waves of a 132-SM device.
unsigned grid_for(int64_t items) {
  return static_cast<unsigned>(std::clamp<int64_t>((items + kThreads - 1) / kThreads, 1, 132 * 8 * 4));
}

__device__ __forceinline__ uint64_t mix(uint64_t seed, uint64_t i) {  // splitmix64 of (seed, i)
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ float uniform_sym(uint64_t seed, uint64_t i, float scale) {
  return (static_cast<float>(mix(seed, i) >> 40) * 0x1p-23f - 1.0f) * scale;
}

__global__ void copy_vec_kernel(const float4* __restrict__ src, float4* __restrict__ dst, int64_t n4) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n4;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = __ldcs(src + i);
}

__global__ void copy_kernel(const float* __restrict__ src, float* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = src[i];
}

__global__ void fill_bytes_kernel(uint8_t* p, int64_t n, uint64_t seed, uint8_t base, uint8_t mask) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    p[i] = static_cast<uint8_t>(base + (static_cast<uint8_t>(mix(seed, i)) & mask));
}

__global__ void fill_f32_kernel(float* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    p[i] = uniform_sym(seed, i, scale);
}

__global__ void fill_bf16_kernel(__nv_bfloat16* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    p[i] = __float2bfloat16_rn(uniform_sym(seed, i, scale));
}

__global__ void to_bf16_kernel(const float* __restrict__ s, __nv_bfloat16* __restrict__ d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    d[i] = __float2bfloat16_rn(s[i]);
}

__global__ void to_e4m3_kernel(const float* __restrict__ s, uint8_t* __restrict__ d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    d[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(s[i], __NV_SATFINITE, __NV_E4M3));
}

Status check(int64_t n, const void* p, const char* fn) {
  if (n < 0) return invalid_argument(std::string(fn) + ": negative count");
  if (n > 0 && !p) return invalid_argument(std::string(fn) + ": null pointer");
  return ok_status();
}

}  // namespace

Status run_copy_f32(const float* src, float* dst, int64_t n, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check(n, src && dst ? src : nullptr, "copy_f32"));
  if (n == 0) return ok_status();
  const bool vec =
      n % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  if (vec)
    copy_vec_kernel<<<grid_for(n / 4), kThreads, 0, stream>>>(reinterpret_cast<const float4*>(src),
                                                              reinterpret_cast<float4*>(dst), n / 4);
  else
    copy_kernel<<<grid_for(n), kThreads, 0, stream>>>(src, dst, n);
  return last_launch_status("copy_f32");
}

Status run_fill_bytes(uint8_t* p, int64_t n, uint64_t seed, uint8_t base, uint8_t mask, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check(n, p, "fill_bytes"));
  if (n == 0) return ok_status();
  fill_bytes_kernel<<<grid_for(n), kThreads, 0, stream>>>(p, n, seed, base, mask);
  return last_launch_status("fill_bytes");
}

Status run_fill_uniform_f32(float* p, int64_t n, uint64_t seed, float scale, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check(n, p, "fill_uniform_f32"));
  if (n == 0) return ok_status();
  fill_f32_kernel<<<grid_for(n), kThreads, 0, stream>>>(p, n, seed, scale);
  return last_launch_status("fill_uniform_f32");
}

Status run_fill_uniform_bf16(uint16_t* p, int64_t n, uint64_t seed, float scale, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check(n, p, "fill_uniform_bf16"));
  if (n == 0) return ok_status();
  fill_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(p), n, seed, scale);
  return last_launch_status("fill_uniform_bf16");
}

Status run_f32_to_bf16(const float* src, uint16_t* dst, int64_t n, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check(n, src && dst ? src : nullptr, "f32_to_bf16"));
  if (n == 0) return ok_status();
  to_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(src, reinterpret_cast<__nv_bfloat16*>(dst), n);
  return last_launch_status("f32_to_bf16");
}

Status run_f32_to_e4m3(const float* src, uint8_t* dst, int64_t n, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check(n, src && dst ? src : nullptr, "f32_to_e4m3"));
  if (n == 0) return ok_status();
  to_e4m3_kernel<<<grid_for(n), kThreads, 0, stream>>>(src, dst, n);
  return last_launch_status("f32_to_e4m3");
}

}  // namespace ds41::cuda
