// ds41 backends/cuda: block-wide top-k selection of one row with the house tie order
// (src/ops/backend.h): larger score first, equal scores -> lower index first, -inf never selected,
// +inf selected. Used by topk_kernels.cu for the index top-k and the candidate pool.
//
// One CTA per row. Scores map to order-preserving 32-bit keys (-0 folded onto +0, since the CPU
// compares them equal). A radix select (4 passes of 8 bits, shared-memory histograms with
// warp-aggregated atomics) finds the key T of the k-th best entry and take_eq, the number of
// entries equal to T that are selected; the selection is then every entry with key > T plus the
// first take_eq entries with key == T in index order, emitted in ascending index order by a
// block-wide prefix count. NaN scores are never selected (the CPU's order with NaN is unspecified).
// When the row has at most k selectable entries, all of them are taken.
#pragma once

#include <cstdint>

namespace ds41::cuda::sel {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kBatch = 4;  // scores loaded per thread per histogram step

__device__ __forceinline__ bool selectable(float x) { return !isnan(x) && x != -INFINITY; }

// Larger float -> larger key; -0 and +0 share a key.
__device__ __forceinline__ uint32_t order_key(float x) {
  uint32_t u = __float_as_uint(x);
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct Threshold {
  uint32_t key;     // T
  int64_t take_eq;  // entries with key == T to take (lowest indices first)
  bool take_all;    // at most k selectable entries: take every one
};

// Shared memory of one CTA's selection.
struct SelectShared {
  uint32_t hist[256];
  uint32_t prefix, mask;
  int64_t remaining;
  int take_all;
  uint32_t warp_gt[32], warp_eq[32];
};

namespace detail {

// Radix passes over load(0..t) from the state in sh (prefix, mask, remaining, take_all): pass p
// counts key bits [shift, shift + 8) with shift = first_shift - 8p, the last digit narrower where
// that goes below bit 0 (first_shift 13: bits 20..13, 12..5, 4..0). can_take_all: the first pass's
// total <= k sets take_all (the selection starts there).
template <typename Load>
__device__ void radix_passes(const Load& load, int64_t t, int64_t k, SelectShared& sh, int first_shift, int npasses,
                             bool can_take_all) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nthreads = blockDim.x;
  for (int pass = 0; pass < npasses; ++pass) {
    const int s8 = first_shift - 8 * pass;
    const int shift = s8 > 0 ? s8 : 0;
    const uint32_t digit = s8 >= 0 ? 255u : (255u >> -s8);
    for (int b = tid; b < 256; b += nthreads) sh.hist[b] = 0u;
    __syncthreads();
    const uint32_t prefix = sh.prefix, mask = sh.mask;
    // kBatch independent loads per thread per step (memory-level parallelism), then the histogram
    // updates; the trip count is uniform over the CTA (full-warp intrinsics).
    for (int64_t base = 0; base < t; base += kBatch * nthreads) {
      float x[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t i = base + j * nthreads + tid;
        x[j] = i < t ? load(i) : -INFINITY;
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const uint32_t key = order_key(x[j]);
        const bool ok = selectable(x[j]) && (key & mask) == prefix;
        const int bin = ok ? static_cast<int>((key >> shift) & digit) : -1 - lane;  // unique when !ok
        const unsigned peers = __match_any_sync(kFull, bin);
        if (ok && lane == __ffs(peers) - 1) atomicAdd(&sh.hist[bin], static_cast<uint32_t>(__popc(peers)));
      }
    }
    __syncthreads();
    // Warp 0 picks the bin holding the remaining-th best entry: lane L owns the 8 bins
    // 255 - 8L .. 248 - 8L (lane 0 the highest), a warp prefix sum over lanes gives the count above
    // each lane's bins, the first lane whose inclusive count reaches `remaining` scans its 8 bins.
    if (warp == 0) {
      const int hi = 255 - 8 * lane;
      int64_t c[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) sum += (c[j] = sh.hist[hi - j]);
      int64_t incl = sum;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int64_t y = __shfl_up_sync(kFull, incl, off);
        if (lane >= off) incl += y;
      }
      const int64_t total = __shfl_sync(kFull, incl, 31);
      if (can_take_all && pass == 0 && total <= k) {
        if (lane == 0) sh.take_all = 1;
      } else {
        const int64_t remaining = sh.remaining;
        const unsigned reach = __ballot_sync(kFull, incl >= remaining);  // nonzero: total >= remaining
        if (lane == __ffs(reach) - 1) {
          int64_t cum = incl - sum;  // entries in higher bins
          int chosen = hi - 7;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            if (cum + c[j] >= remaining) {
              chosen = hi - j;
              break;
            }
            cum += c[j];
          }
          sh.remaining = remaining - cum;  // entries of the chosen bin still to take
          sh.prefix = prefix | (static_cast<uint32_t>(chosen) << shift);
          sh.mask = mask | (digit << shift);
        }
      }
    }
    __syncthreads();
    if (sh.take_all) break;  // uniform
  }
}

}  // namespace detail

// The threshold of the k best entries of load(0..t). All threads of the CTA call it (blockDim a
// multiple of 32, at most 1024); every thread gets the same result.
template <typename Load>
__device__ Threshold select_threshold(const Load& load, int64_t t, int64_t k, SelectShared& sh) {
  const int tid = threadIdx.x;
  if (k <= 0) return Threshold{0xffffffffu, 0, false};  // selects nothing (no selectable key is 2^32-1)
  if (tid == 0) {
    sh.prefix = 0u;
    sh.mask = 0u;
    sh.remaining = k;
    sh.take_all = 0;
  }
  detail::radix_passes(load, t, k, sh, 24, 4, true);
  Threshold th{sh.prefix, sh.remaining, sh.take_all != 0};
  if (th.take_all) {
    th.key = 0u;
    th.take_eq = 0;
  }
  __syncthreads();  // sh may be reused by the caller
  return th;
}

// select_threshold from a known key prefix: the entries whose key bits 31..21 equal bin11 hold the
// `remaining` best still to take (remaining >= 1, and at least that many such entries); the other 21
// bits in three passes over the row (8 + 8 + 5 bits). The wide select's fallback: it resumes where
// its first pass stopped instead of starting over.
template <typename Load>
__device__ Threshold select_threshold_resume(const Load& load, int64_t t, int64_t k, SelectShared& sh,
                                             uint32_t bin11, int64_t remaining) {
  if (threadIdx.x == 0) {
    sh.prefix = bin11 << 21;
    sh.mask = 0xffe00000u;
    sh.remaining = remaining;
    sh.take_all = 0;
  }
  detail::radix_passes(load, t, k, sh, 13, 3, false);
  const Threshold th{sh.prefix, sh.remaining, false};
  __syncthreads();  // sh may be reused by the caller
  return th;
}

// ---- The wide selection: the same Threshold in two passes over the row --------------------------
// select_threshold reads the whole row in each of its 4 passes (8 bits each), though after the first
// one or two only the entries sharing the chosen prefix still count. select_threshold_wide takes the
// first 11 bits in one pass over the row (2048 bins), then copies the keys of the chosen bin (their
// count is that bin's histogram entry) into shared memory, and resolves the remaining 11 + 10 bits
// over those keys only: two passes over the row (a histogram, then the copy) instead of four. Radix
// select with any digit widths finds the same k-th key T and the same number of entries equal to T
// still to take, so the Threshold (and the emit after it) is the same, bit for bit. A chosen bin of
// more than kWideCand keys (mass ties, e.g. a row of zeros) resolves the other 21 bits with three
// passes over the row (select_threshold_resume): four passes in all, as the four-pass select.
constexpr int kWideBins = 2048;  // first digit: key bits 31..21
constexpr int kWideCand = 2048;  // keys of the chosen bin kept in shared memory

struct WideShared {
  uint32_t hist[kWideBins];
  uint32_t cand[kWideCand];
  uint32_t ncand;
  uint32_t prefix, bin_count;
  int64_t remaining;
  int take_all;
  uint32_t warp_sum[32];
  SelectShared fallback;
};

namespace wide {

// The bin of hist[0, nbins) holding the remaining-th best entry (bins scanned from the highest):
// thread j owns the nbins / blockDim bins below nbins - j * per; a block-wide exclusive scan of the
// owners' sums finds the owner, which writes sh.prefix = (prefix << bits) | bin, sh.remaining -= the
// entries in higher bins, sh.bin_count = the bin's entries. pass0: a total <= k sets take_all.
// blockDim: 256, 512 or 1024 (nbins a multiple of it). Ends with a barrier.
__device__ void pick_bin(WideShared& sh, int nbins, int bits, int64_t k, bool pass0) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nwarps = blockDim.x / 32;
  const int per = nbins / static_cast<int>(blockDim.x);
  const int hi = nbins - 1 - tid * per;
  // Read before the barrier: the owner rewrites it after (another thread reading the new value
  // could take itself for the owner).
  const int64_t remaining = sh.remaining;
  uint32_t sum = 0;
  for (int j = 0; j < per; ++j) sum += sh.hist[hi - j];
  uint32_t incl = sum;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t y = __shfl_up_sync(kFull, incl, off);
    if (lane >= off) incl += y;
  }
  if (lane == 31) sh.warp_sum[warp] = incl;
  __syncthreads();
  uint64_t before = 0, total = 0;
  for (int w = 0; w < nwarps; ++w) {
    if (w < warp) before += sh.warp_sum[w];
    total += sh.warp_sum[w];
  }
  if (pass0 && total <= static_cast<uint64_t>(k)) {
    if (tid == 0) sh.take_all = 1;
  } else {
    const uint64_t cum_hi = before + incl - sum;  // entries in bins above this thread's
    if (cum_hi < static_cast<uint64_t>(remaining) && cum_hi + sum >= static_cast<uint64_t>(remaining)) {
      uint64_t cum = cum_hi;
      for (int j = 0; j < per; ++j) {
        const uint32_t c = sh.hist[hi - j];
        if (cum + c >= static_cast<uint64_t>(remaining)) {
          sh.prefix = (sh.prefix << bits) | static_cast<uint32_t>(hi - j);
          sh.remaining = remaining - static_cast<int64_t>(cum);
          sh.bin_count = c;
          break;
        }
        cum += c;
      }
    }
  }
  __syncthreads();
}

// hist[bin(key)] += 1 for every key of get(0..m) that `ok` admits, warp-aggregated (kBatch loads
// per thread per step, as select_threshold). Starts after a barrier that follows the clear.
template <typename Get, typename Ok, typename Bin>
__device__ void histogram(WideShared& sh, int64_t m, const Get& get, const Ok& ok, const Bin& bin) {
  const int tid = threadIdx.x, lane = tid % 32, nthreads = blockDim.x;
  for (int64_t base = 0; base < m; base += kBatch * nthreads) {
    uint32_t key[kBatch];
    bool in[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t i = base + j * nthreads + tid;
      in[j] = i < m && get(i, &key[j]);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const bool take = in[j] && ok(key[j]);
      const int b = take ? bin(key[j]) : -1 - lane;  // unique when not taken
      const unsigned peers = __match_any_sync(kFull, b);
      if (take && lane == __ffs(peers) - 1) atomicAdd(&sh.hist[b], static_cast<uint32_t>(__popc(peers)));
    }
  }
  __syncthreads();
}

__device__ inline void clear_hist(WideShared& sh, int nbins) {
  for (int b = threadIdx.x; b < nbins; b += blockDim.x) sh.hist[b] = 0u;
  __syncthreads();
}

}  // namespace wide

// select_threshold's result for load(0..t), k (see above). All threads of the CTA call it; blockDim
// 256, 512 or 1024.
template <typename Load>
__device__ Threshold select_threshold_wide(const Load& load, int64_t t, int64_t k, WideShared& sh) {
  const int tid = threadIdx.x, lane = tid % 32, nthreads = blockDim.x;
  if (k <= 0) return Threshold{0xffffffffu, 0, false};
  if (tid == 0) {
    sh.prefix = 0u;
    sh.remaining = k;
    sh.take_all = 0;
    sh.ncand = 0u;
  }
  wide::clear_hist(sh, kWideBins);
  // Pass 1: bits 31..21 over the row.
  auto row_key = [&](int64_t i, uint32_t* key) {
    const float x = load(i);
    *key = order_key(x);
    return selectable(x);
  };
  wide::histogram(sh, t, row_key, [](uint32_t) { return true; }, [](uint32_t key) { return static_cast<int>(key >> 21); });
  wide::pick_bin(sh, kWideBins, 11, k, true);
  if (sh.take_all) {  // uniform
    __syncthreads();
    return Threshold{0u, 0, true};
  }
  const uint32_t bin1 = sh.prefix;
  if (sh.bin_count > static_cast<uint32_t>(kWideCand)) {  // uniform: mass ties, the other 21 bits over the row
    const int64_t remaining = sh.remaining;
    __syncthreads();
    return select_threshold_resume(load, t, k, sh.fallback, bin1, remaining);
  }
  // The chosen bin's keys into shared memory (any order: only counts follow).
  for (int64_t base = 0; base < t; base += nthreads) {
    const int64_t i = base + tid;
    uint32_t key = 0;
    const bool in = i < t && row_key(i, &key) && (key >> 21) == bin1;
    const unsigned b = __ballot_sync(kFull, in);
    uint32_t slot = 0;
    if (lane == 0 && b) slot = atomicAdd(&sh.ncand, static_cast<uint32_t>(__popc(b)));
    slot = __shfl_sync(kFull, slot, 0);
    if (in) sh.cand[slot + __popc(b & ((1u << lane) - 1u))] = key;
  }
  wide::clear_hist(sh, kWideBins);  // its barrier also publishes cand / ncand
  const int64_t m = sh.ncand;
  auto cand_key = [&](int64_t i, uint32_t* key) {
    *key = sh.cand[i];
    return true;
  };
  // Pass 2: bits 20..10 over the chosen bin's keys.
  wide::histogram(sh, m, cand_key, [](uint32_t) { return true; },
                  [](uint32_t key) { return static_cast<int>((key >> 10) & 2047u); });
  wide::pick_bin(sh, kWideBins, 11, k, false);
  const uint32_t p2 = sh.prefix;  // bits 31..10
  wide::clear_hist(sh, 1024);
  // Pass 3: bits 9..0 over the keys that share bits 31..10.
  wide::histogram(sh, m, cand_key, [p2](uint32_t key) { return (key >> 10) == p2; },
                  [](uint32_t key) { return static_cast<int>(key & 1023u); });
  wide::pick_bin(sh, 1024, 10, k, false);
  const Threshold th{sh.prefix, sh.remaining, false};
  __syncthreads();  // sh may be reused by the caller
  return th;
}

// Calls emit(i, selected, pos) for every i < t in index order chunks (pos = the entry's rank among
// the selected ones in ascending index order; meaningful when selected). Returns the number
// selected. All threads of the CTA call it.
template <typename Load, typename Emit>
__device__ int64_t select_emit(const Load& load, int64_t t, const Threshold& th, SelectShared& sh,
                               const Emit& emit) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nwarps = blockDim.x / 32;
  const uint32_t lt_mask = (1u << lane) - 1u;
  int64_t run_gt = 0, run_eq = 0;
  float next = tid < t ? load(tid) : -INFINITY;  // the next chunk's score, loaded one chunk ahead
  for (int64_t base = 0; base < t; base += blockDim.x) {
    const int64_t i = base + tid;
    const float x = next;
    if (i + blockDim.x < t) next = load(i + blockDim.x);
    bool gt = false, eq = false;
    if (i < t) {
      if (selectable(x)) {
        const uint32_t key = order_key(x);
        gt = th.take_all || key > th.key;
        eq = !th.take_all && key == th.key;
      }
    }
    const unsigned gt_b = __ballot_sync(kFull, gt), eq_b = __ballot_sync(kFull, eq);
    if (lane == 0) {
      sh.warp_gt[warp] = __popc(gt_b);
      sh.warp_eq[warp] = __popc(eq_b);
    }
    __syncthreads();
    int64_t gt_before = run_gt + __popc(gt_b & lt_mask), eq_before = run_eq + __popc(eq_b & lt_mask);
    int64_t tot_gt = 0, tot_eq = 0;
    for (int w = 0; w < nwarps; ++w) {
      if (w == warp) {
        gt_before += tot_gt;
        eq_before += tot_eq;
      }
      tot_gt += sh.warp_gt[w];
      tot_eq += sh.warp_eq[w];
    }
    if (i < t) {
      const bool s = gt || (eq && eq_before < th.take_eq);
      emit(i, s, gt_before + min(eq_before, th.take_eq));
    }
    run_gt += tot_gt;
    run_eq += tot_eq;
    __syncthreads();  // warp_gt / warp_eq are rewritten by the next chunk
  }
  return run_gt + min(run_eq, th.take_eq);
}

// select_emit's emit calls and return value with one barrier instead of two per blockDim entries (for loads
// from shared memory: the entries are read twice). Warp w owns the contiguous entries [w P, (w + 1) P),
// P = 32 ceil(t / (32 nwarps)); at step j lane l has entry w P + 32 j + l, so a warp walks its entries in
// index order. Pass 1 counts the warp's entries > T and == T (ballots, no barrier); one barrier publishes
// the warps' counts; pass 2 reads the entries again and emits each with select_emit's rank (entries > T and
// the first take_eq entries == T, in index order). The same calls with the same arguments, so the same
// outputs. All threads of the CTA call it.
template <typename Load, typename Emit>
__device__ int64_t select_emit_runs(const Load& load, int64_t t, const Threshold& th, SelectShared& sh,
                                    const Emit& emit) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nwarps = blockDim.x / 32;
  const uint32_t lt_mask = (1u << lane) - 1u;
  const int64_t per_warp = (t + 32 * nwarps - 1) / (32 * nwarps) * 32;
  const int64_t b0 = warp * per_warp, b1 = min(t, b0 + per_warp);  // b1 <= b0: no entries (uniform per warp)
  auto flags = [&](int64_t i, bool& gt, bool& eq) {
    gt = eq = false;
    if (i < b1) {
      const float x = load(i);
      if (selectable(x)) {
        const uint32_t key = order_key(x);
        gt = th.take_all || key > th.key;
        eq = !th.take_all && key == th.key;
      }
    }
  };
  int64_t cnt_gt = 0, cnt_eq = 0;
  for (int64_t base = b0; base < b1; base += 32) {
    bool gt, eq;
    flags(base + lane, gt, eq);
    cnt_gt += __popc(__ballot_sync(kFull, gt));
    cnt_eq += __popc(__ballot_sync(kFull, eq));
  }
  if (lane == 0) {
    sh.warp_gt[warp] = static_cast<uint32_t>(cnt_gt);
    sh.warp_eq[warp] = static_cast<uint32_t>(cnt_eq);
  }
  __syncthreads();
  int64_t run_gt = 0, run_eq = 0, tot_gt = 0, tot_eq = 0;
  for (int w = 0; w < nwarps; ++w) {
    if (w < warp) {
      run_gt += sh.warp_gt[w];
      run_eq += sh.warp_eq[w];
    }
    tot_gt += sh.warp_gt[w];
    tot_eq += sh.warp_eq[w];
  }
  for (int64_t base = b0; base < b1; base += 32) {
    const int64_t i = base + lane;
    bool gt, eq;
    flags(i, gt, eq);
    const unsigned gt_b = __ballot_sync(kFull, gt), eq_b = __ballot_sync(kFull, eq);
    if (i < b1) {
      const int64_t gt_before = run_gt + __popc(gt_b & lt_mask), eq_before = run_eq + __popc(eq_b & lt_mask);
      const bool s = gt || (eq && eq_before < th.take_eq);
      emit(i, s, gt_before + min(eq_before, th.take_eq));
    }
    run_gt += __popc(gt_b);
    run_eq += __popc(eq_b);
  }
  __syncthreads();  // warp_gt / warp_eq may be rewritten by the caller
  return tot_gt + min(tot_eq, th.take_eq);
}

}  // namespace ds41::cuda::sel
