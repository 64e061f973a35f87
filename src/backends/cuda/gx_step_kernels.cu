// ds41 backends/cuda: the GPU executor's index-list kernels (gx_step_kernels.h).
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/fake_quant_device.cuh"
#include "backends/cuda/gx_step_kernels.h"
#include "backends/cuda/kv_rows_kernels.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/paged_rows.cuh"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/rows_norm_rope_quant_device.cuh"

namespace ds41::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;
constexpr int64_t kWideRows = 256;  // build_sparse_index: from this many rows, the three-launch form

using dev::paged_offset;

__global__ void paged_row_offsets_kernel(PagedRowsArgs p, const int64_t* seq_row_begin, int64_t n_seqs,
                                         int64_t total, int64_t* out) {
  dev::pdl_enter();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  if (i >= seq_row_begin[n_seqs]) {  // padding rows past the last sequence's entries
    out[i] = -1;
    return;
  }
  int64_t lo = 0, hi = n_seqs;  // last s with seq_row_begin[s] <= i
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (seq_row_begin[mid] <= i)
      lo = mid;
    else
      hi = mid;
  }
  out[i] = paged_offset(p, lo, i - seq_row_begin[lo]);
}

__global__ void selection_row_offsets_kernel(PagedRowsArgs p, const int32_t* sel, int64_t n, int64_t k,
                                             const int32_t* row_seq, int64_t* out) {
  dev::pdl_enter();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * k) return;
  const int32_t e = sel[i];
  out[i] = e < 0 ? -1 : paged_offset(p, row_seq[i / k], e);
}

// Row r's window entries copied to kv_index[begin ..) (lanes strided, four loads in flight per
// lane); returns their count. One warp.
__device__ __forceinline__ int64_t copy_window(int64_t r, int lane, int64_t begin, const int64_t* win_offsets,
                                               const int32_t* win_index, int32_t* kv_index) {
  const int64_t w0 = win_offsets[r], nw = win_offsets[r + 1] - w0;
  for (int64_t i0 = 0; i0 < nw; i0 += 4 * 32) {
    int32_t wv[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) wv[u] = i0 + 32 * u + lane < nw ? win_index[w0 + i0 + 32 * u + lane] : 0;
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (i0 + 32 * u + lane < nw) kv_index[begin + i0 + 32 * u + lane] = wv[u];
  }
  return nw;
}

// The decoded row of row r's selection j (value e) is base + (table ? e : j): per selection
// base = comp_base + r k, with a table comp_base + (first entry row of the row's sequence).
__device__ __forceinline__ int64_t selection_base(int64_t r, int64_t k, int64_t comp_base, const int32_t* row_seq,
                                                  const int64_t* seq_entry_begin) {
  return seq_entry_begin ? comp_base + seq_entry_begin[row_seq[r]] : comp_base + r * k;
}

// Row r's count (window length + its selections >= 0, lanes over j, 4 loads in flight) into
// kv_offsets[r + 1]. One warp.
__device__ __forceinline__ void count_row(int64_t r, int lane, const int64_t* win_offsets, const int32_t* sel,
                                          int64_t k, int64_t* kv_offsets) {
  int cnt = 0;
  if (sel) {
    const int32_t* sr = sel + r * k;
#pragma unroll 4
    for (int64_t j = lane; j < k; j += 32) cnt += sr[j] >= 0 ? 1 : 0;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
  if (lane == 0) kv_offsets[r + 1] = win_offsets[r + 1] - win_offsets[r] + cnt;
}

// An in-place inclusive scan of kv_offsets[1 .. n] by one block of kScanThreads, in chunks
// (Hillis-Steele, carried). The counts must be visible to the block on entry.
__device__ __forceinline__ void scan_counts(int64_t n, int64_t* kv_offsets) {
  __shared__ int64_t scan[kScanThreads];
  __shared__ int64_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t r0 = 0; r0 < n; r0 += kScanThreads) {
    const int64_t r = r0 + threadIdx.x;
    scan[threadIdx.x] = r < n ? kv_offsets[r + 1] : 0;
    __syncthreads();
    for (int off = 1; off < kScanThreads; off <<= 1) {
      const int64_t v = threadIdx.x >= off ? scan[threadIdx.x - off] : 0;
      __syncthreads();
      scan[threadIdx.x] += v;
      __syncthreads();
    }
    if (r < n) kv_offsets[r + 1] = carry + scan[threadIdx.x];
    __syncthreads();
    if (threadIdx.x == kScanThreads - 1) carry += scan[kScanThreads - 1];
    __syncthreads();
  }
}

// Row r's entry list at kv_index[begin ..): its window entries, then the decoded row of each
// selection >= 0 in j order, compacted 32 at a time (ballot + popcount of the lower lanes). One warp.
__device__ __forceinline__ void write_row_list(int64_t r, int lane, int64_t begin, const int64_t* win_offsets,
                                               const int32_t* win_index, const int32_t* sel, int64_t k,
                                               int64_t comp_base, int32_t* kv_index, const int32_t* row_seq,
                                               const int64_t* seq_entry_begin) {
  int64_t o = begin + copy_window(r, lane, begin, win_offsets, win_index, kv_index);
  if (!sel) return;
  const int32_t* sr = sel + r * k;
  const bool table = seq_entry_begin != nullptr;
  const int64_t cb = selection_base(r, k, comp_base, row_seq, seq_entry_begin);
  for (int64_t j0 = 0; j0 < k; j0 += 32) {
    const int64_t j = j0 + lane;
    const int32_t e = j < k ? sr[j] : -1;
    const bool keep = e >= 0;
    const unsigned mask = __ballot_sync(0xffffffffu, keep);
    if (keep) kv_index[o + __popc(mask & ((1u << lane) - 1u))] = static_cast<int32_t>(cb + (table ? e : j));
    o += __popc(mask);
  }
}

// Many rows (a prefill chunk): the counts, a one-block scan and the lists in three launches, every
// SM writing lists (one block wrote 10M entries of a 16K chunk in ~4.5 ms). The same lists.
__global__ void sparse_index_count_kernel(const int64_t* win_offsets, const int32_t* sel, int64_t n, int64_t k,
                                          int64_t* kv_offsets) {
  dev::pdl_enter();
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (r == 0 && lane == 0) kv_offsets[0] = 0;
  if (r < n) count_row(r, lane, win_offsets, sel, k, kv_offsets);
}

__global__ void __launch_bounds__(kScanThreads) sparse_index_scan_kernel(int64_t n, int64_t* kv_offsets) {
  dev::pdl_enter();
  scan_counts(n, kv_offsets);
}

__global__ void sparse_index_write_kernel(const int64_t* win_offsets, const int32_t* win_index, const int32_t* sel,
                                          int64_t n, int64_t k, int64_t comp_base, const int64_t* kv_offsets,
                                          int32_t* kv_index, const int32_t* row_seq,
                                          const int64_t* seq_entry_begin) {
  dev::pdl_enter();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (r >= n) return;
  write_row_list(r, threadIdx.x & 31, kv_offsets[r], win_offsets, win_index, sel, k, comp_base, kv_index, row_seq,
                 seq_entry_begin);
}

// One block of kScanThreads (a prefix sum over rows). Pass 1: one warp per row counts its entries
// into kv_offsets[r + 1]. Pass 2: scan_counts. Pass 3: one warp per row writes its list
// (write_row_list). v1 had one thread per row walk its whole list (~650 dependent loads at decode:
// ~50 us for one row).
// The body of build_sparse_index_kernel, also block 0 of selected_entries_kernel (kScanThreads threads).
__device__ __forceinline__ void build_index_block(const int64_t* win_offsets, const int32_t* win_index,
                                                  const int32_t* sel, int64_t n, int64_t k, int64_t comp_base,
                                                  int64_t* kv_offsets, int32_t* kv_index, const int32_t* row_seq,
                                                  const int64_t* seq_entry_begin) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kWarpsScan = kScanThreads / 32;
  // A decode step has at most one row per warp: the warp's selections (up to 32 x kCacheSel) are
  // loaded once, all in flight, and kept in registers for pass 3 (ncu: ~8 us per call when pass 3
  // made one dependent load round per 32 selections).
  constexpr int kCacheSel = 16;
  const bool cache = sel && n <= kWarpsScan && k <= 32 * kCacheSel;
  int32_t sc[kCacheSel];
  if (cache && warp < n) {
    const int32_t* sr = sel + warp * k;
#pragma unroll
    for (int u = 0; u < kCacheSel; ++u) sc[u] = lane + 32 * u < k ? sr[lane + 32 * u] : -1;
  }
  for (int64_t r = warp; r < n; r += kWarpsScan) {
    if (!cache) {
      count_row(r, lane, win_offsets, sel, k, kv_offsets);
      continue;
    }
    int cnt = 0;
#pragma unroll
    for (int u = 0; u < kCacheSel; ++u) cnt += sc[u] >= 0 ? 1 : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
    if (lane == 0) kv_offsets[r + 1] = win_offsets[r + 1] - win_offsets[r] + cnt;
  }
  __syncthreads();  // the counts (global memory, this block's writes) are visible
  scan_counts(n, kv_offsets);
  if (threadIdx.x == 0) kv_offsets[0] = 0;
  for (int64_t r = warp; r < n; r += kWarpsScan) {
    const int64_t begin = r == 0 ? 0 : kv_offsets[r];  // row 0's slot may not be written yet
    if (!cache) {
      write_row_list(r, lane, begin, win_offsets, win_index, sel, k, comp_base, kv_index, row_seq,
                     seq_entry_begin);
      continue;
    }
    int64_t o = begin + copy_window(r, lane, begin, win_offsets, win_index, kv_index);
    const bool table = seq_entry_begin != nullptr;
    const int64_t cb = selection_base(r, k, comp_base, row_seq, seq_entry_begin);
#pragma unroll
    for (int u = 0; u < kCacheSel; ++u) {
      const int64_t j = 32 * u + lane;
      const bool keep = sc[u] >= 0;  // -1 past k
      const unsigned mask = __ballot_sync(0xffffffffu, keep);
      if (keep)
        kv_index[o + __popc(mask & ((1u << lane) - 1u))] = static_cast<int32_t>(cb + (table ? sc[u] : j));
      o += __popc(mask);
    }
  }
}

__global__ void __launch_bounds__(kScanThreads)
    build_sparse_index_kernel(const int64_t* win_offsets, const int32_t* win_index, const int32_t* sel,
                              int64_t n, int64_t k, int64_t comp_base, int64_t* kv_offsets,
                              int32_t* kv_index, const int32_t* row_seq, const int64_t* seq_entry_begin) {
  dev::pdl_enter();
  build_index_block(win_offsets, win_index, sel, n, k, comp_base, kv_offsets, kv_index, row_seq, seq_entry_begin);
}

// run_selected_entries: block 0 builds the lists (build_index_block); blocks 1.. decode element
// e = (selection i, channel c) of the selected rows, selection_row_offsets_kernel's offset computed
// in place and decode_rows_gather_kernel's decode (zeros for padding selections).
template <int kOp>
__global__ void __launch_bounds__(kScanThreads) selected_entries_kernel(SelectedEntriesArgs a) {
  dev::pdl_enter();
  if (blockIdx.x == 0) {
    build_index_block(a.win_offsets, a.win_index, a.sel, a.n, a.k, a.comp_base, a.kv_offsets, a.kv_index, nullptr,
                      nullptr);
    return;
  }
  const int64_t e = static_cast<int64_t>(blockIdx.x - 1) * blockDim.x + threadIdx.x;
  if (e >= a.n * a.k * a.channels) return;
  const int64_t i = e / a.channels, c = e % a.channels;
  const int32_t sv = a.sel[i];
  const int64_t off = sv < 0 ? -1 : paged_offset(a.pages, a.row_seq[i / a.k], sv);
  a.rows[e] = off < 0 ? 0.0f : fq::decode_elem<kOp>(a.base + off, a.channels, c);
}

// run_window_kv_step (gx_step_kernels.h): blocks [0, rows) this call's rows (dev::norm_rope_quant_row,
// rows_norm_rope_quant_kernel's code; threads >= dim idle), then ring_blocks blocks decoding the earlier
// rows (decode_rows_gather_kernel's element e = (row, channel) per thread), then with kEntries
// selected_entries_kernel's blocks (the first builds the lists, the others decode the selections). The
// ring and entry blocks read nothing the previous launch writes, so their work comes before the PDL
// wait; every block waits before it triggers (launch.h contract 3).
template <int kWin, int kKv, bool kEntries>
__global__ void __launch_bounds__(kScanThreads)
    window_kv_step_kernel(WindowKvStepArgs a, SelectedEntriesArgs se, int sum_threads, int64_t ring_blocks,
                          bool pre_wait) {
  __shared__ float row[dev::kMaxNormRopeRowDim];
  __shared__ float cs[dev::kMaxNormRopeRowDim];
  __shared__ double scratch[32];
  const int64_t b = blockIdx.x, nr = a.rows.rows;
  if (b < nr) {
    if (!pre_wait) dev::pdl_enter();
    // pre_wait (launch.h pre_wait_enabled): the norm weight and the rotation table before the PDL wait.
    dev::norm_rope_quant_row<kWin>(a.rows, sum_threads, b, row, cs, scratch, [&] {
      if (pre_wait) dev::pdl_enter();
    });
    return;
  }
  const int64_t q = b - nr;
  if (q < ring_blocks) {
    const int64_t dim = a.rows.dim, e = q * blockDim.x + threadIdx.x;
    if (e < a.ring_rows * dim) {
      const int64_t r = e / dim, i = e % dim;
      const int64_t off = a.ring_read[r];
      a.ring_out[e] = off < 0 ? 0.0f : fq::decode_elem<kWin>(a.rows.base + off, dim, i);
    }
  } else if constexpr (kEntries) {
    if (q == ring_blocks) {
      build_index_block(se.win_offsets, se.win_index, se.sel, se.n, se.k, se.comp_base, se.kv_offsets, se.kv_index,
                        nullptr, nullptr);
    } else {
      const int64_t e = (q - ring_blocks - 1) * blockDim.x + threadIdx.x;
      if (e < se.n * se.k * se.channels) {
        const int64_t i = e / se.channels, c = e % se.channels;
        const int32_t sv = se.sel[i];
        const int64_t off = sv < 0 ? -1 : paged_offset(se.pages, se.row_seq[i / se.k], sv);
        se.rows[e] = off < 0 ? 0.0f : fq::decode_elem<kKv>(se.base + off, se.channels, c);
      }
    }
  }
  dev::pdl_enter();
}

unsigned blocks_for(int64_t total) { return static_cast<unsigned>((total + kThreads - 1) / kThreads); }

}  // namespace

Status check_paged_rows(const PagedRowsArgs& p) {
  if (p.entries_per_page <= 0 || p.page_bytes <= 0 || p.row_bytes <= 0)
    return invalid_argument("paged rows: entries_per_page, page_bytes and row_bytes must be > 0");
  if (p.offset_in_page < 0 || p.offset_in_page + p.entries_per_page * p.row_bytes > p.page_bytes)
    return invalid_argument("paged rows: offset_in_page + entries_per_page * row_bytes exceeds page_bytes");
  return ok_status();
}

Status run_paged_row_offsets(const PagedRowsArgs& p, const int64_t* seq_row_begin, int64_t n_seqs,
                             int64_t total, int64_t* out, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_paged_rows(p));
  if (total < 0 || n_seqs < 0) return invalid_argument("paged_row_offsets: total and n_seqs must be >= 0");
  if (total == 0) return ok_status();
  if (n_seqs == 0) return invalid_argument("paged_row_offsets: rows without sequences");
  launch(paged_row_offsets_kernel, blocks_for(total), kThreads, 0, stream, p, seq_row_begin, n_seqs, total, out);
  return last_launch_status("paged_row_offsets");
}

Status run_selection_row_offsets(const PagedRowsArgs& p, const int32_t* sel, int64_t n, int64_t k,
                                 const int32_t* row_seq, int64_t* out, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_paged_rows(p));
  if (n < 0 || k < 0) return invalid_argument("selection_row_offsets: n and k must be >= 0");
  if (n * k == 0) return ok_status();
  launch(selection_row_offsets_kernel, blocks_for(n * k), kThreads, 0, stream, p, sel, n, k, row_seq, out);
  return last_launch_status("selection_row_offsets");
}

Status run_build_sparse_index(const int64_t* win_offsets, const int32_t* win_index, const int32_t* sel,
                              int64_t n, int64_t k, int64_t comp_base, int64_t* kv_offsets, int32_t* kv_index,
                              cudaStream_t stream, const int32_t* row_seq, const int64_t* seq_entry_begin,
                              int64_t table_rows) {
  if (n < 0 || k < 0 || comp_base < 0 || table_rows < 0)
    return invalid_argument("build_sparse_index: n, k, comp_base, table_rows must be >= 0");
  if (seq_entry_begin && !row_seq) return invalid_argument("build_sparse_index: a table needs row_seq");
  if (comp_base + (seq_entry_begin ? table_rows : n * k) > INT32_MAX)
    return invalid_argument("build_sparse_index: entry rows exceed int32");
  if (n >= kWideRows) {  // a prefill chunk: counts, scan and lists over the whole GPU
    const unsigned blocks = static_cast<unsigned>((n + kThreads / 32 - 1) / (kThreads / 32));
    launch(sparse_index_count_kernel, blocks, kThreads, 0, stream, win_offsets, sel, n, k, kv_offsets);
    DS41_RETURN_IF_ERROR(last_launch_status("sparse_index_count"));
    launch(sparse_index_scan_kernel, 1, kScanThreads, 0, stream, n, kv_offsets);
    DS41_RETURN_IF_ERROR(last_launch_status("sparse_index_scan"));
    launch(sparse_index_write_kernel, blocks, kThreads, 0, stream, win_offsets, win_index, sel, n, k, comp_base,
           static_cast<const int64_t*>(kv_offsets), kv_index, row_seq, seq_entry_begin);
    return last_launch_status("sparse_index_write");
  }
  launch(build_sparse_index_kernel, 1, kScanThreads, 0, stream, win_offsets, win_index, sel, n, k, comp_base,
         kv_offsets, kv_index, row_seq, seq_entry_begin);
  return last_launch_status("build_sparse_index");
}

Status run_selected_entries(const SelectedEntriesArgs& a, int64_t* offsets_scratch, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_paged_rows(a.pages));
  const int iop = static_cast<int>(a.op);
  if (iop < 0 || iop > 2) return invalid_argument("selected_entries: op " + std::to_string(iop) + " unknown");
  if (a.channels <= 0 || a.channels % fq::block_of(iop) || a.channels > (int64_t{1} << 24))
    return invalid_argument("selected_entries: channels " + std::to_string(a.channels) +
                            " must be a positive multiple of the op's block (MODEL_SPEC 3.9)");
  if (a.n < 0 || a.k < 0 || a.comp_base < 0)
    return invalid_argument("selected_entries: n, k and comp_base must be >= 0");
  if (a.n >= kWideRows || a.n * a.k == 0) {  // a prefill chunk (or nothing selected): the three launches
    if (a.n * a.k > 0) {
      if (!offsets_scratch) return invalid_argument("selected_entries: a wide call needs the offsets scratch");
      DS41_RETURN_IF_ERROR(run_selection_row_offsets(a.pages, a.sel, a.n, a.k, a.row_seq, offsets_scratch, stream));
      DS41_RETURN_IF_ERROR(
          run_decode_rows_gather(a.op, a.channels, a.base, offsets_scratch, a.n * a.k, a.rows, stream));
    }
    return run_build_sparse_index(a.win_offsets, a.win_index, a.sel, a.n, a.k, a.comp_base, a.kv_offsets,
                                  a.kv_index, stream);
  }
  if (a.comp_base + a.n * a.k > INT32_MAX) return invalid_argument("selected_entries: entry rows exceed int32");
  const int64_t decode_blocks = (a.n * a.k * a.channels + kScanThreads - 1) / kScanThreads;
  if (decode_blocks + 1 > 0x7fffffff) return invalid_argument("selected_entries: n x k x channels too large");
  fq::dispatch_op(iop, [&]<int kOp>() {
    launch(selected_entries_kernel<kOp>, static_cast<unsigned>(decode_blocks + 1), kScanThreads, 0, stream, a);
  });
  return last_launch_status("selected_entries");
}

bool window_kv_step_fused(const WindowKvStepArgs& a) {
  const RowsNormRopeQuantArgs& r = a.rows;
  const int64_t win_block = fq::block_of(static_cast<int>(FakeQuantOp::kWin));
  if (!a.slots_disjoint || !r.quant || r.op != FakeQuantOp::kWin || !r.offsets || !r.base || !r.in) return false;
  if (r.rows <= 0 || r.rows >= kWideRows || r.dim <= 0 || r.dim > dev::kMaxNormRopeRowDim || r.dim % win_block)
    return false;
  if (r.rows_per_pos <= 0 || r.rows % r.rows_per_pos || r.n_freq < 0 || 2 * r.n_freq > r.dim ||
      (r.n_freq > 0 && (!r.pos || !r.inv_freq)))
    return false;
  if (a.ring_rows < 0 || (a.ring_rows > 0 && (!a.ring_read || !a.ring_out))) return false;
  int64_t blocks = r.rows + (a.ring_rows * r.dim + kScanThreads - 1) / kScanThreads;
  if (a.entries) {
    const SelectedEntriesArgs& e = *a.entries;
    if (e.op != FakeQuantOp::kKv || !check_paged_rows(e.pages).ok() || e.n <= 0 || e.n >= kWideRows || e.k <= 0 ||
        e.channels <= 0 || e.channels % fq::block_of(static_cast<int>(FakeQuantOp::kKv)) ||
        e.channels > (int64_t{1} << 24) || e.comp_base < 0 || e.comp_base + e.n * e.k > INT32_MAX)
      return false;
    blocks += 1 + (e.n * e.k * e.channels + kScanThreads - 1) / kScanThreads;
  }
  return blocks <= 0x7fffffff;
}

namespace {
int g_window_kv_step = -1;
}  // namespace

bool window_kv_step_enabled() {
  if (g_window_kv_step >= 0) return g_window_kv_step != 0;
  static const bool on = switch_on("DS41_WINDOW_KV_STEP");
  return on;
}

void set_window_kv_step_for_tests(int mode) { g_window_kv_step = mode < 0 ? -1 : (mode ? 1 : 0); }

Status run_window_kv_step(const WindowKvStepArgs& a, int64_t* offsets_scratch, cudaStream_t stream) {
  if (!window_kv_step_enabled() || !window_kv_step_fused(a)) {  // the sequence it stands for
    if (a.ring_rows != 0)
      DS41_RETURN_IF_ERROR(run_decode_rows_gather(a.rows.op, a.rows.dim, a.rows.base, a.ring_read, a.ring_rows,
                                                  a.ring_out, stream));
    DS41_RETURN_IF_ERROR(run_rows_norm_rope_quant(a.rows, stream));
    return a.entries ? run_selected_entries(*a.entries, offsets_scratch, stream) : ok_status();
  }
  const int64_t ring_blocks = (a.ring_rows * a.rows.dim + kScanThreads - 1) / kScanThreads;
  const int sum_threads = rms_norm_sum_threads(a.rows.rows, a.rows.dim);
  constexpr int kWin = static_cast<int>(FakeQuantOp::kWin), kKv = static_cast<int>(FakeQuantOp::kKv);
  if (a.entries) {
    const SelectedEntriesArgs& e = *a.entries;
    const int64_t blocks = a.rows.rows + ring_blocks + 1 + (e.n * e.k * e.channels + kScanThreads - 1) / kScanThreads;
    launch(window_kv_step_kernel<kWin, kKv, true>, static_cast<unsigned>(blocks), kScanThreads, 0, stream, a, e,
           sum_threads, ring_blocks, pre_wait_enabled());
  } else {
    launch(window_kv_step_kernel<kWin, kKv, false>, static_cast<unsigned>(a.rows.rows + ring_blocks), kScanThreads,
           0, stream, a, SelectedEntriesArgs{}, sum_threads, ring_blocks, pre_wait_enabled());
  }
  return last_launch_status("window_kv_step");
}

}  // namespace ds41::cuda
