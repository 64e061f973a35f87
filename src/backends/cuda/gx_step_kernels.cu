// ds41 backends/cuda: the GPU executor's index-list kernels (gx_step_kernels.h).
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/gx_step_kernels.h"

namespace ds41::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;

__device__ __forceinline__ int64_t paged_offset(const PagedRowsArgs& p, int64_t s, int64_t k) {
  const int64_t page = p.pages[p.seq_page_begin[s] + k / p.entries_per_page];
  return page * p.page_bytes + p.offset_in_page + (k % p.entries_per_page) * p.row_bytes;
}

__global__ void paged_row_offsets_kernel(PagedRowsArgs p, const int64_t* seq_row_begin, int64_t n_seqs,
                                         int64_t total, int64_t* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
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
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * k) return;
  const int32_t e = sel[i];
  out[i] = e < 0 ? -1 : paged_offset(p, row_seq[i / k], e);
}

__global__ void build_sparse_index_kernel(const int64_t* win_offsets, const int32_t* win_index,
                                          const int32_t* sel, int64_t n, int64_t k, int64_t comp_base,
                                          int64_t* kv_offsets, int32_t* kv_index) {
  __shared__ int64_t scan[kScanThreads];
  __shared__ int64_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t r0 = 0; r0 < n; r0 += kScanThreads) {
    const int64_t r = r0 + threadIdx.x;
    int64_t cnt = 0;
    if (r < n) {
      cnt = win_offsets[r + 1] - win_offsets[r];
      if (sel)
        for (int64_t j = 0; j < k; ++j) cnt += sel[r * k + j] >= 0 ? 1 : 0;
    }
    scan[threadIdx.x] = cnt;
    __syncthreads();
    for (int off = 1; off < kScanThreads; off <<= 1) {  // inclusive Hillis-Steele scan
      const int64_t v = threadIdx.x >= off ? scan[threadIdx.x - off] : 0;
      __syncthreads();
      scan[threadIdx.x] += v;
      __syncthreads();
    }
    const int64_t begin = carry + scan[threadIdx.x] - cnt;
    if (r < n) {
      kv_offsets[r] = begin;
      int64_t o = begin;
      for (int64_t e = win_offsets[r]; e < win_offsets[r + 1]; ++e) kv_index[o++] = win_index[e];
      if (sel)
        for (int64_t j = 0; j < k; ++j)
          if (sel[r * k + j] >= 0) kv_index[o++] = static_cast<int32_t>(comp_base + r * k + j);
    }
    __syncthreads();
    if (threadIdx.x == kScanThreads - 1) carry += scan[kScanThreads - 1];
    __syncthreads();
  }
  if (threadIdx.x == 0) kv_offsets[n] = carry;
}

unsigned blocks_for(int64_t total) { return static_cast<unsigned>((total + kThreads - 1) / kThreads); }

Status check_paged(const PagedRowsArgs& p) {
  if (p.entries_per_page <= 0 || p.page_bytes <= 0 || p.row_bytes <= 0)
    return invalid_argument("paged rows: entries_per_page, page_bytes and row_bytes must be > 0");
  if (p.offset_in_page < 0 || p.offset_in_page + p.entries_per_page * p.row_bytes > p.page_bytes)
    return invalid_argument("paged rows: offset_in_page + entries_per_page * row_bytes exceeds page_bytes");
  return ok_status();
}

}  // namespace

Status run_paged_row_offsets(const PagedRowsArgs& p, const int64_t* seq_row_begin, int64_t n_seqs,
                             int64_t total, int64_t* out, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_paged(p));
  if (total < 0 || n_seqs < 0) return invalid_argument("paged_row_offsets: total and n_seqs must be >= 0");
  if (total == 0) return ok_status();
  if (n_seqs == 0) return invalid_argument("paged_row_offsets: rows without sequences");
  paged_row_offsets_kernel<<<blocks_for(total), kThreads, 0, stream>>>(p, seq_row_begin, n_seqs, total, out);
  return last_launch_status("paged_row_offsets");
}

Status run_selection_row_offsets(const PagedRowsArgs& p, const int32_t* sel, int64_t n, int64_t k,
                                 const int32_t* row_seq, int64_t* out, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_paged(p));
  if (n < 0 || k < 0) return invalid_argument("selection_row_offsets: n and k must be >= 0");
  if (n * k == 0) return ok_status();
  selection_row_offsets_kernel<<<blocks_for(n * k), kThreads, 0, stream>>>(p, sel, n, k, row_seq, out);
  return last_launch_status("selection_row_offsets");
}

Status run_build_sparse_index(const int64_t* win_offsets, const int32_t* win_index, const int32_t* sel,
                              int64_t n, int64_t k, int64_t comp_base, int64_t* kv_offsets, int32_t* kv_index,
                              cudaStream_t stream) {
  if (n < 0 || k < 0 || comp_base < 0)
    return invalid_argument("build_sparse_index: n, k, comp_base must be >= 0");
  if (comp_base + n * k > INT32_MAX) return invalid_argument("build_sparse_index: entry rows exceed int32");
  build_sparse_index_kernel<<<1, kScanThreads, 0, stream>>>(win_offsets, win_index, sel, n, k, comp_base,
                                                            kv_offsets, kv_index);
  return last_launch_status("build_sparse_index");
}

}  // namespace ds41::cuda
