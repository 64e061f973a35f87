// ds41 backends/cuda: fused row kernels of the decode step (fused_rows_kernels.h).
//
// rows_norm_rope_quant: one CTA per row, one thread per channel (blockDim = dim rounded up to 32,
//   dim <= 1024), the row's code in rows_norm_rope_quant_device.cuh (shared with the window KV step
//   of gx_step_kernels.cu). Bit-identical to the unfused sequence; other shapes run it.
// hc_site: the grid is the hc_map split-K blocks (hc::hc_map_partial_block, the same geometry as
//   run_hc_map) followed by one block per row for the collapse (hc_collapse_kernel's fp32 order per
//   element, into shared memory) and the RMSNorm (rms_norm_device.cuh plays run_rms_norm's
//   rms_norm_sum_threads(n, h) threads with these 256). Each split-K block writes its partials,
//   fences and counts itself on its group's counter; the block that completes the group resets the
//   counter and finishes the group's rows (partials read through L2): at C = 4 one warp per row
//   (hc::hc_map_finish_row_warp4: the rows in parallel), else row after row with
//   hc::hc_map_finish_row, hc_map_finish_kernel's code. Bit-identical to run_hc_map +
//   run_hc_collapse + run_rms_norm.
#include <algorithm>
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/fake_quant_device.cuh"
#include "backends/cuda/hc_collapse_device.cuh"
#include "backends/cuda/hc_site_map_device.cuh"
#include "backends/cuda/fused_rows_kernels.h"
#include "backends/cuda/kv_rows_kernels.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/mhc_device.cuh"
#include "backends/cuda/mhc_kernels.h"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/rms_norm_device.cuh"
#include "backends/cuda/rope_table.cuh"
#include "backends/cuda/rows_norm_rope_quant_device.cuh"

namespace ds41::cuda {
namespace {

constexpr int64_t kMaxRowDim = dev::kMaxNormRopeRowDim;

// kOp: fq::kWin / kKv / kIdx, or -1 (no quantization). One CTA per row (rows_norm_rope_quant_device.cuh).
template <int kOp>
__global__ void __launch_bounds__(kMaxRowDim)
    rows_norm_rope_quant_kernel(RowsNormRopeQuantArgs a, int sum_threads, bool pre_wait) {
  if (!pre_wait) dev::pdl_enter();
  __shared__ float row[kMaxRowDim];
  __shared__ float cs[kMaxRowDim];
  __shared__ double scratch[32];
  // pre_wait (launch.h pre_wait_enabled): the norm weight and the rotation table before the PDL wait.
  dev::norm_rope_quant_row<kOp>(a, sum_threads, blockIdx.x, row, cs, scratch, [&] {
    if (pre_wait) dev::pdl_enter();
  });
}

constexpr int64_t kMaxSiteH = 10240;  // the collapsed row in dynamic shared memory: <= 40 KB (no opt-in)

template <int kJ, bool kVec, int kC>
__global__ void __launch_bounds__(hc::kThreads)
    hc_site_kernel(HcSiteArgs s, int64_t splits, int64_t steps, int64_t map_blocks, int sum_threads) {
  dev::pdl_enter();
  extern __shared__ float smem[];
  __shared__ double scratch[32];
  const HcMapDeviceArgs& a = s.map;
  const int64_t b = blockIdx.x;
  if (b >= map_blocks) {  // collapse + norm of row r
    // The critical path of a one-row call (ncu SASS: the loops below with a load per round made
    // 20 dependent L2 round trips for the collapse and 20 more for the norm weight at h = 5120,
    // ~40 K cycles, while the map blocks and their finisher were done sooner): the C weights once,
    // then kCollapseBatch elements per thread with all their loads in flight before the arithmetic.
    constexpr int kCollapseBatch = 8;
    constexpr int kCs = kC > 0 ? kC : static_cast<int>(hc::kMaxC);  // streams held per element
    const int64_t r = b - map_blocks, C = a.c, H = a.h, T = blockDim.x;
    const float* S = a.streams + r * C * H;
    float w[kCs];
#pragma unroll
    for (int j = 0; j < kCs; ++j) w[j] = j < C ? s.collapse_w[r * C + j] : 0.0f;
    for (int64_t base = threadIdx.x; base < H; base += kCollapseBatch * T) {
      float sv[kCollapseBatch][kCs];
#pragma unroll
      for (int q = 0; q < kCollapseBatch; ++q) {
        const int64_t i = base + q * T;
#pragma unroll
        for (int j = 0; j < kCs; ++j) sv[q][j] = (i < H && j < C) ? S[j * H + i] : 0.0f;
      }
#pragma unroll
      for (int q = 0; q < kCollapseBatch; ++q) {
        const int64_t i = base + q * T;
        if (i >= H) break;
        float v = 0.0f;
#pragma unroll
        for (int j = 0; j < kCs; ++j)
          if (j < C) v = __fadd_rn(v, __fmul_rn(w[j], sv[q][j]));
        smem[i] = v;
      }
    }
    __syncthreads();
    const float inv =
        dev::rms_inv_like_rms_norm([&](int64_t i) { return smem[i]; }, H, sum_threads, s.eps, scratch);
    float* xr = s.x + r * H;
    for (int64_t base = threadIdx.x; base < H; base += kCollapseBatch * T) {
      float nw[kCollapseBatch];
#pragma unroll
      for (int q = 0; q < kCollapseBatch; ++q) {
        const int64_t i = base + q * T;
        nw[q] = (i < H && s.norm_weight) ? s.norm_weight[i] : 1.0f;
      }
#pragma unroll
      for (int q = 0; q < kCollapseBatch; ++q) {
        const int64_t i = base + q * T;
        if (i < H) xr[i] = __fmul_rn(smem[i], inv) * nw[q];
      }
    }
    return;
  }
  dev::hc_site_map_block<kJ, kVec, kC>(s, splits, steps, b);
}

// The collapse + norm part alone at C = 4 with float4 columns (h % 1024 == 0, 16-byte aligned
// streams / x / norm weight; hc_site_collapse_quads): one block per row as the kernel's collapse
// blocks, the same operations per element in the same order (v = 0 + w0 s0 + w1 s1 + w2 s2 + w3 s3
// in fp32, rms_inv_like_rms_norm, fl(fl(v inv) weight)), so the same bits. Why: ncu (H100, --set full)
// put the scalar collapse block at 12.4 us, 19.6 K warp instructions over its 8 warps, most of them
// the 64-bit addressing and bounds checks of one scalar load per stream and element; here a thread
// issues 4 x kQ 16-byte loads with 32-bit offsets before it adds.
// The collapse + norm part alone at C = 4 with float4 columns (h % 1024 == 0, 16-byte aligned
// streams / x / norm weight; hc_site_collapse_quads): one block per row as the kernel's collapse
// blocks, the same operations per element in the same order (dev::collapse_norm_quads,
// hc_collapse_device.cuh), so the same bits. Why: ncu (H100, --set full) put the scalar collapse
// block at 12.4 us, 19.6 K warp instructions over its 8 warps, most of them the 64-bit addressing and
// bounds checks of one scalar load per stream and element; here a thread issues 4 x kCollapseQ
// 16-byte loads with 32-bit offsets before it adds.
__global__ void __launch_bounds__(hc::kThreads)
    hc_collapse_norm_quads_kernel(HcSiteArgs s, int sum_threads, bool pre_wait) {
  if (!pre_wait) dev::pdl_enter();
  extern __shared__ __align__(16) float smem[];
  __shared__ double scratch[32];
  const HcMapDeviceArgs& a = s.map;
  const int64_t r = blockIdx.x;
  // pre_wait (launch.h pre_wait_enabled): the norm weights' loads before the PDL wait.
  dev::collapse_norm_quads(a.streams + r * 4 * a.h, s.collapse_w + r * 4, a.h, s.norm_weight, s.eps, sum_threads,
                           smem, scratch, s.x + r * a.h, false, [&] {
                             if (pre_wait) dev::pdl_enter();
                           });
}

Status bad(const std::string& what) { return invalid_argument("rows_norm_rope_quant: " + what); }

// The unfused sequence (shapes the kernel does not take).
Status unfused(const RowsNormRopeQuantArgs& a, cudaStream_t s) {
  const int64_t n = a.rows;
  float* x = a.out;
  if (!x) return bad("shape without a fused kernel needs out");
  if (a.norm) {
    DS41_RETURN_IF_ERROR(run_rms_norm(a.in, n, a.dim, a.norm_weight, a.eps, a.normed ? a.normed : x, s));
    if (a.normed)
      DS41_RETURN_IF_ERROR(
          cuda_status(copy_async(x, a.normed, static_cast<size_t>(n * a.dim) * sizeof(float),
                                      cudaMemcpyDeviceToDevice, s),
                      "rows_norm_rope_quant copy"));
  } else if (a.in != x) {
    DS41_RETURN_IF_ERROR(cuda_status(
        copy_async(x, a.in, static_cast<size_t>(n * a.dim) * sizeof(float), cudaMemcpyDeviceToDevice, s),
        "rows_norm_rope_quant copy"));
  }
  if (a.n_freq > 0)
    DS41_RETURN_IF_ERROR(
        run_rope(x, n / a.rows_per_pos, a.rows_per_pos, a.dim, a.pos, a.inv_freq, a.n_freq, a.inverse, s));
  if (a.quant && a.offsets)
    DS41_RETURN_IF_ERROR(run_encode_rows_scatter(a.op, a.dim, x, n, a.base, a.offsets, s));
  if (a.quant && a.quant_inplace) DS41_RETURN_IF_ERROR(run_fake_quant_inplace(a.op, a.dim, x, n, s));
  return ok_status();
}

}  // namespace

RowsNormRopeQuantArgs window_kv_rows(int64_t rows, int64_t dim, float* kv, const float* kv_norm, float eps,
                                     const int64_t* pos, const float* inv_freq, int64_t n_freq, uint8_t* ring_base,
                                     const int64_t* ring_offsets, bool inplace) {
  RowsNormRopeQuantArgs a;
  a.rows = rows;
  a.dim = dim;
  a.in = kv;
  a.out = kv;
  a.norm = true;
  a.norm_weight = kv_norm;
  a.eps = eps;
  a.pos = pos;
  a.inv_freq = inv_freq;
  a.n_freq = n_freq;
  a.quant = true;
  a.op = FakeQuantOp::kWin;
  a.base = ring_base;
  a.offsets = ring_offsets;
  a.quant_inplace = inplace;
  return a;
}

Status run_rows_norm_rope_quant(const RowsNormRopeQuantArgs& a, cudaStream_t stream) {
  if (a.rows < 0 || a.rows > 0x7fffffff) return bad("rows " + std::to_string(a.rows) + " out of range");
  if (a.dim <= 0) return bad("dim must be positive");
  if (a.rows_per_pos <= 0 || a.rows % a.rows_per_pos) return bad("rows not a multiple of rows_per_pos");
  if (a.n_freq < 0 || 2 * a.n_freq > a.dim) return bad("n_freq " + std::to_string(a.n_freq) + " > dim / 2");
  if (a.n_freq > 0 && (!a.pos || !a.inv_freq)) return bad("rope without pos / inv_freq");
  if (!a.in) return bad("in is null");
  if (a.quant) {
    const int64_t block = fq::block_of(static_cast<int>(a.op));
    if (a.dim % block) return bad("dim not a multiple of the quantization block");
    if (a.offsets && !a.base) return bad("offsets without base");
  }
  if (a.rows == 0) return ok_status();
  if (a.dim > kMaxRowDim) return unfused(a, stream);
  const int threads = static_cast<int>((a.dim + 31) / 32 * 32);
  const int sum_threads = rms_norm_sum_threads(a.rows, a.dim);
  const dim3 grid(static_cast<unsigned>(a.rows));
  if (!a.quant) {
    launch(rows_norm_rope_quant_kernel<-1>, grid, dim3(threads), 0, stream, a, sum_threads, pre_wait_enabled());
  } else {
    fq::dispatch_op(static_cast<int>(a.op), [&]<int kOp>() {
      launch(rows_norm_rope_quant_kernel<kOp>, grid, dim3(threads), 0, stream, a, sum_threads, pre_wait_enabled());
    });
  }
  return last_launch_status("rows_norm_rope_quant");
}

int64_t hc_site_counter_count(int64_t n) { return std::max<int64_t>(1, (n + hc::kHcRows - 1) / hc::kHcRows); }

bool hc_site_fused(const HcSiteArgs& s) {
  const HcMapDeviceArgs& a = s.map;
  return s.collapse_w && s.x && s.counters && s.counters_size >= hc_site_counter_count(a.n) && a.h <= kMaxSiteH &&
         a.c >= 1 && a.c <= hc::kMaxC && a.n > 0 && a.n <= 0x7fffffff && a.sinkhorn_iters >= 1 &&
         s.collapse_w != a.pre && s.collapse_w != a.post && s.collapse_w != a.comb && a.streams && a.fn &&
         a.scale && a.base && a.pre && a.post && a.comb &&
         reinterpret_cast<uintptr_t>(a.workspace) % alignof(double) == 0 && a.workspace &&
         a.workspace_bytes >= hc_map_workspace_bytes(a.n, a.c, a.h);
}

namespace {
int g_collapse_quads = -1;
}  // namespace

bool hc_site_collapse_quads(const HcSiteArgs& s) {
  // On unless DS41_HC_COLLAPSE_QUADS=0 (measured on an H100, docs/perf/README.md, session of 2026-12-05
  // 17:29 UTC: 6.8 us per call against the scalar block's 11.6-12.0).
  static const bool env = switch_on("DS41_HC_COLLAPSE_QUADS");
  const bool on = g_collapse_quads >= 0 ? g_collapse_quads != 0 : env;
  const auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return on && hc_site_fused(s) && s.map.c == 4 && s.map.h % (4 * hc::kThreads) == 0 && al(s.map.streams) &&
         al(s.x) && al(s.norm_weight);
}
void set_hc_collapse_quads_for_tests(int mode) { g_collapse_quads = mode; }

namespace {
TestableSwitch g_map_fold{"DS41_HC_MAP_FOLD", false};
}  // namespace
bool hc_map_fold_enabled() { return g_map_fold.enabled(); }
void set_hc_map_fold_for_tests(int mode) { g_map_fold.set(mode); }

bool hc_site_map_fold(const HcSiteArgs& s, HcMapFold* f) {
  const HcMapDeviceArgs& a = s.map;
  if (f == nullptr || !hc_map_fold_enabled() || !hc_site_fused(s) || a.c != 4 ||
      (reinterpret_cast<uintptr_t>(a.fn) | reinterpret_cast<uintptr_t>(a.streams)) % 16 != 0)
    return false;  // run_hc_site's kernel for these is hc_site_kernel<3, true, 4>: the carriers' one form
  const hc::HcSplit sp = hc::hc_split(a.n, a.c, a.h);
  f->site = s;
  f->splits = sp.splits;
  f->steps = sp.steps;
  f->blocks = sp.groups * sp.splits;
  f->folded = false;
  return f->blocks > 0 && f->blocks <= 65535;
}

Status run_hc_site(const HcSiteArgs& s, cudaStream_t stream, HcSitePart part) {
  const HcMapDeviceArgs& a = s.map;
  if (!s.collapse_w || !s.x) return invalid_argument("hc_site: collapse_w / x is null");
  if (!hc_site_fused(s)) {
    if (part != HcSitePart::kBoth) return invalid_argument("hc_site: a part alone needs the fused shape");
    DS41_RETURN_IF_ERROR(run_hc_map(a, stream));
    DS41_RETURN_IF_ERROR(run_hc_collapse(a.streams, s.collapse_w, a.n, a.c, a.h, s.x, stream));
    return run_rms_norm(s.x, a.n, a.h, s.norm_weight, s.eps, s.x, stream);
  }
  if (part == HcSitePart::kCollapse && hc_site_collapse_quads(s)) {
    launch(hc_collapse_norm_quads_kernel, dim3(static_cast<unsigned>(a.n)), dim3(hc::kThreads),
           static_cast<size_t>(a.h) * sizeof(float), stream, s, rms_norm_sum_threads(a.n, a.h), pre_wait_enabled());
    return last_launch_status("hc_site collapse");
  }
  const hc::HcSplit sp = hc::hc_split(a.n, a.c, a.h);
  // The kernel's blocks [0, map_blocks) are the map's, the rest one collapse block per row: a part
  // alone is the grid of its blocks (the collapse alone: map_blocks 0, so every block collapses).
  const int64_t map_blocks = part == HcSitePart::kCollapse ? 0 : sp.groups * sp.splits;
  const dim3 grid(static_cast<unsigned>(part == HcSitePart::kMap ? map_blocks : map_blocks + a.n));
  const size_t smem = static_cast<size_t>(a.h) * sizeof(float);
  const int sum_threads = rms_norm_sum_threads(a.n, a.h);
  const bool vec = (a.c * a.h) % 4 == 0 &&
                   ((reinterpret_cast<uintptr_t>(a.fn) | reinterpret_cast<uintptr_t>(a.streams)) % 16 == 0);
  auto go = [&](auto kernel) {
    launch(kernel, grid, dim3(hc::kThreads), smem, stream, s, sp.splits, sp.steps, map_blocks, sum_threads);
  };
  if (a.c == 4)
    vec ? go(hc_site_kernel<3, true, 4>) : go(hc_site_kernel<3, false, 4>);
  else if (a.c < 4)
    vec ? go(hc_site_kernel<3, true, 0>) : go(hc_site_kernel<3, false, 0>);
  else
    vec ? go(hc_site_kernel<10, true, 0>) : go(hc_site_kernel<10, false, 0>);
  return last_launch_status("hc_site");
}

}  // namespace ds41::cuda
