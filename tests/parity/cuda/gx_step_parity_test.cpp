// Parity of the GPU executor's index-list kernels (backends/cuda/gx_step_kernels.h) with host
// loops written from their contract: exact (integers), compared element for element. Cases cross
// the one-block scan's 1024-row chunks, empty sequences, -1 padding in the middle of a selection
// row and pages in scrambled order. Skips without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/launch.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/fused_rows_kernels.h"
#include "backends/cuda/gx_step_kernels.h"
#include "backends/cuda/kv_rows_kernels.h"
#include "parity/cuda/switch_forms.h"
#include "quant/fake_quant.h"

namespace ds41::cuda {
namespace {

template <class T>
T* to_device(const std::vector<T>& v) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(v.size(), 1) * sizeof(T)), cudaSuccess);
  if (!v.empty()) {
    EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return static_cast<T*>(p);
}
template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> v(n);
  if (n) {
    EXPECT_EQ(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return v;
}

struct Paged {
  std::vector<int32_t> pages;
  std::vector<int64_t> page_begin, counts;
  int64_t E = 0, page_bytes = 0, off = 0, row = 0;
  int64_t offset(int64_t s, int64_t k) const {
    return pages[page_begin[s] + k / E] * page_bytes + off + (k % E) * row;
  }
};

Paged make_paged(std::mt19937& g, int64_t seqs, int64_t max_count, int64_t E) {
  Paged p;
  p.E = E;
  p.row = 68;
  p.off = E * 288;
  p.page_bytes = E * (288 + 68);
  int32_t next = 0;
  std::vector<int32_t> all;
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t c = (s % 3 == 1) ? 0 : static_cast<int64_t>(g() % (max_count + 1));
    p.counts.push_back(c);
    p.page_begin.push_back(static_cast<int64_t>(p.pages.size()));
    for (int64_t i = 0; i < (c + E - 1) / E; ++i) p.pages.push_back(next++);
  }
  std::shuffle(p.pages.begin(), p.pages.end(), g);  // scrambled physical pages
  return p;
}

// Q_kv pages (16 entries each, rows of kv_row_bytes(hd) after a 48-byte header) for sequences of `counts`
// entries, in scrambled physical order, and a pool of random bytes holding them.
Paged make_kv_pages(std::mt19937& g, const std::vector<int64_t>& counts, int64_t hd, std::vector<uint8_t>* pool) {
  Paged p;
  p.E = 16;
  p.row = quant::kv_row_bytes(hd);
  p.off = 48;
  p.page_bytes = p.off + p.E * p.row + 16;
  int32_t next = 0;
  for (const int64_t c : counts) {
    p.counts.push_back(c);
    p.page_begin.push_back(static_cast<int64_t>(p.pages.size()));
    for (int64_t i = 0; i < (c + p.E - 1) / p.E; ++i) p.pages.push_back(next++);
  }
  std::shuffle(p.pages.begin(), p.pages.end(), g);
  pool->assign(static_cast<size_t>(std::max<int32_t>(next, 1) * p.page_bytes), 0);
  for (auto& b : *pool) b = static_cast<uint8_t>(g());
  return p;
}

TEST(GxStepKernels, PagedAndSelectionOffsets) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 g(7);
  for (auto [seqs, max_count, E] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 5, 64}, {5, 700, 64}, {17, 3000, 16}}) {
    Paged p = make_paged(g, seqs, max_count, E);
    std::vector<int64_t> row_begin{0};
    for (int64_t c : p.counts) row_begin.push_back(row_begin.back() + c);
    const int64_t real = row_begin.back(), total = real + 37;  // 37 padding rows: -1
    std::vector<int64_t> want(total, -1);
    for (int64_t s = 0; s < seqs; ++s)
      for (int64_t k = 0; k < p.counts[s]; ++k) want[row_begin[s] + k] = p.offset(s, k);
    int32_t* d_pages = to_device(p.pages);
    int64_t* d_pb = to_device(p.page_begin);
    int64_t* d_rb = to_device(row_begin);
    int64_t* d_out = to_device(std::vector<int64_t>(total, -7));
    PagedRowsArgs a{d_pages, d_pb, p.E, p.page_bytes, p.off, p.row};
    ASSERT_TRUE(run_paged_row_offsets(a, d_rb, seqs, total, d_out, nullptr).ok());
    EXPECT_EQ(to_host(d_out, total), want);
    std::printf("paged_row_offsets seqs %lld rows %lld (+37 padding) E %lld exact\n", (long long)seqs, (long long)real,
                (long long)E);
    // Selections: rows of each sequence pick entries < count, -1 anywhere.
    const int64_t n = 300, k = 24;
    std::vector<int32_t> sel(n * k), row_seq(n);
    std::vector<int64_t> swant(n * k);
    for (int64_t r = 0; r < n; ++r) {
      row_seq[r] = static_cast<int32_t>(g() % seqs);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t c = p.counts[row_seq[r]];
        const int32_t e = (c == 0 || g() % 5 == 0) ? -1 : static_cast<int32_t>(g() % c);
        sel[r * k + j] = e;
        swant[r * k + j] = e < 0 ? -1 : p.offset(row_seq[r], e);
      }
    }
    int32_t* d_sel = to_device(sel);
    int32_t* d_rs = to_device(row_seq);
    int64_t* d_so = to_device(std::vector<int64_t>(n * k, -7));
    ASSERT_TRUE(run_selection_row_offsets(a, d_sel, n, k, d_rs, d_so, nullptr).ok());
    EXPECT_EQ(to_host(d_so, n * k), swant);
    std::printf("selection_row_offsets n %lld k %lld exact\n", (long long)n, (long long)k);
    for (void* q :
         {(void*)d_pages, (void*)d_pb, (void*)d_rb, (void*)d_out, (void*)d_sel, (void*)d_rs, (void*)d_so})
      cudaFree(q);
  }
}

TEST(GxStepKernels, SparseIndexLists) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 g(11);
  for (auto [n, k, W, with_sel] : {std::tuple<int64_t, int64_t, int64_t, bool>{1, 8, 8, true},
                                   {0, 8, 8, true},
                                   {1, 512, 128, true},  // released decode: 128 window + 512 selected
                                   {3, 37, 5, true},     // k not a multiple of the warp
                                   {40, 3, 2, true},
                                   {300, 0, 128, false},
                                   {2500, 64, 32, true},
                                   {1024, 512, 128, true}}) {
    std::vector<int64_t> win_off{0};
    std::vector<int32_t> win_idx;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t c = 1 + static_cast<int64_t>(g() % W);
      for (int64_t i = 0; i < c; ++i) win_idx.push_back(static_cast<int32_t>(g() % 100000));
      win_off.push_back(static_cast<int64_t>(win_idx.size()));
    }
    std::vector<int32_t> sel(n * k);
    for (auto& v : sel) v = g() % 4 == 0 ? -1 : static_cast<int32_t>(g() % 1000);
    for (int64_t r = 5; r < n; r += 7)  // rows without any selection
      for (int64_t j = 0; j < k; ++j) sel[r * k + j] = -1;
    const int64_t comp_base = n + 77;
    std::vector<int64_t> want_off{0};
    std::vector<int32_t> want_idx;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t e = win_off[r]; e < win_off[r + 1]; ++e) want_idx.push_back(win_idx[e]);
      if (with_sel)
        for (int64_t j = 0; j < k; ++j)
          if (sel[r * k + j] >= 0) want_idx.push_back(static_cast<int32_t>(comp_base + r * k + j));
      want_off.push_back(static_cast<int64_t>(want_idx.size()));
    }
    int64_t* d_wo = to_device(win_off);
    int32_t* d_wi = to_device(win_idx);
    int32_t* d_sel = to_device(sel);
    int64_t* d_off = to_device(std::vector<int64_t>(n + 1, -7));
    int32_t* d_idx = to_device(std::vector<int32_t>(win_idx.size() + n * k + 1, -7));
    ASSERT_TRUE(
        run_build_sparse_index(d_wo, d_wi, with_sel ? d_sel : nullptr, n, k, comp_base, d_off, d_idx, nullptr)
            .ok());
    EXPECT_EQ(to_host(d_off, n + 1), want_off);
    EXPECT_EQ(to_host(d_idx, want_idx.size()), want_idx);
    std::printf("build_sparse_index n %lld k %lld W %lld sel %d entries %zu exact\n", (long long)n,
                (long long)k, (long long)W, int(with_sel), want_idx.size());
    // The table form: rows of 3 sequences (row r in sequence r % 3), each sequence's entries
    // decoded once at comp_base + seq_begin[s] + e.
    if (with_sel && n > 0) {
      const std::vector<int64_t> seq_begin{0, 1000, 1500, 2600};
      std::vector<int32_t> row_seq(n);
      for (int64_t r = 0; r < n; ++r) row_seq[r] = static_cast<int32_t>(r % 3);
      std::vector<int32_t> want_t;
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t e = win_off[r]; e < win_off[r + 1]; ++e) want_t.push_back(win_idx[e]);
        for (int64_t j = 0; j < k; ++j)
          if (sel[r * k + j] >= 0)
            want_t.push_back(static_cast<int32_t>(comp_base + seq_begin[row_seq[r]] + sel[r * k + j]));
      }
      int32_t* d_rs = to_device(row_seq);
      int64_t* d_sb = to_device(seq_begin);
      ASSERT_TRUE(run_build_sparse_index(d_wo, d_wi, d_sel, n, k, comp_base, d_off, d_idx, nullptr, d_rs, d_sb,
                                         seq_begin.back())
                      .ok());
      EXPECT_EQ(to_host(d_off, n + 1), want_off);
      EXPECT_EQ(to_host(d_idx, want_t.size()), want_t);
      std::printf("build_sparse_index (table) n %lld k %lld exact\n", (long long)n, (long long)k);
      cudaFree(d_rs);
      cudaFree(d_sb);
    }
    for (void* q : {(void*)d_wo, (void*)d_wi, (void*)d_sel, (void*)d_off, (void*)d_idx}) cudaFree(q);
  }
}

// run_selected_entries (one launch) against the three launches it replaces: the decoded rows bit for
// bit (random pool bytes: every scale and code pattern, NaNs included), the offsets and the lists
// exactly. Sequences with no entries, -1 padding, scrambled pages, k not a multiple of the warp, the
// released decode shape (512 selections of 512 channels), several rows per sequence, and a wide call
// (the three launches through the scratch) and k = 0.
TEST(GxStepKernels, SelectedEntriesEqualTheThreeLaunches) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 g(23);
  for (auto [n, k, hd, seqs] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 512, 512, 1},
                                {3, 37, 64, 2},
                                {40, 8, 128, 5},
                                {300, 16, 64, 7},
                                {2, 0, 64, 1}}) {
    std::vector<int64_t> counts;
    for (int64_t s = 0; s < seqs; ++s) counts.push_back((s % 3 == 2) ? 0 : 1 + static_cast<int64_t>(g() % 700));
    std::vector<uint8_t> pool;
    const Paged p = make_kv_pages(g, counts, hd, &pool);
    std::vector<int32_t> sel(n * k), row_seq(n);
    for (int64_t r = 0; r < n; ++r) {
      row_seq[r] = static_cast<int32_t>(g() % seqs);
      const int64_t c = p.counts[row_seq[r]];
      for (int64_t j = 0; j < k; ++j) sel[r * k + j] = (c == 0 || g() % 5 == 0) ? -1 : static_cast<int32_t>(g() % c);
    }
    std::vector<int64_t> win_off{0};
    std::vector<int32_t> win_idx;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t w = 1 + static_cast<int64_t>(g() % 128);
      for (int64_t i = 0; i < w; ++i) win_idx.push_back(static_cast<int32_t>(g() % 100000));
      win_off.push_back(static_cast<int64_t>(win_idx.size()));
    }
    const int64_t comp_base = n + 129, rows = std::max<int64_t>(n * k, 1);
    int32_t* d_pages = to_device(p.pages);
    int64_t* d_pb = to_device(p.page_begin);
    uint8_t* d_pool = to_device(pool);
    int32_t* d_sel = to_device(sel);
    int32_t* d_rs = to_device(row_seq);
    int64_t* d_wo = to_device(win_off);
    int32_t* d_wi = to_device(win_idx);
    int64_t* d_so = to_device(std::vector<int64_t>(rows, -7));
    float* d_ref = to_device(std::vector<float>(rows * hd, 3.0f));
    float* d_got = to_device(std::vector<float>(rows * hd, 5.0f));
    int64_t* d_off_ref = to_device(std::vector<int64_t>(n + 1, -7));
    int64_t* d_off_got = to_device(std::vector<int64_t>(n + 1, -9));
    int32_t* d_idx_ref = to_device(std::vector<int32_t>(win_idx.size() + n * k + 1, -7));
    int32_t* d_idx_got = to_device(std::vector<int32_t>(win_idx.size() + n * k + 1, -9));
    const PagedRowsArgs a{d_pages, d_pb, p.E, p.page_bytes, p.off, p.row};
    if (n * k > 0) {
      ASSERT_TRUE(run_selection_row_offsets(a, d_sel, n, k, d_rs, d_so, nullptr).ok());
      ASSERT_TRUE(run_decode_rows_gather(FakeQuantOp::kKv, hd, d_pool, d_so, n * k, d_ref, nullptr).ok());
    }
    ASSERT_TRUE(run_build_sparse_index(d_wo, d_wi, d_sel, n, k, comp_base, d_off_ref, d_idx_ref, nullptr).ok());
    SelectedEntriesArgs se;
    se.pages = a;
    se.sel = d_sel;
    se.n = n;
    se.k = k;
    se.row_seq = d_rs;
    se.op = FakeQuantOp::kKv;
    se.channels = hd;
    se.base = d_pool;
    se.rows = d_got;
    se.win_offsets = d_wo;
    se.win_index = d_wi;
    se.comp_base = comp_base;
    se.kv_offsets = d_off_got;
    se.kv_index = d_idx_got;
    int64_t* d_scratch = to_device(std::vector<int64_t>(rows, -7));
    ASSERT_TRUE(run_selected_entries(se, d_scratch, nullptr).ok());
    const std::vector<float> ref = to_host(d_ref, rows * hd), got = to_host(d_got, rows * hd);
    int64_t differ = 0;
    for (int64_t i = 0; i < n * k * hd; ++i) differ += std::memcmp(&ref[i], &got[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0) << "n " << n << " k " << k;
    EXPECT_EQ(to_host(d_off_got, n + 1), to_host(d_off_ref, n + 1));
    const size_t entries = static_cast<size_t>(to_host(d_off_ref + n, 1)[0]);
    EXPECT_EQ(to_host(d_idx_got, entries), to_host(d_idx_ref, entries));
    std::printf("selected_entries n %lld k %lld channels %lld: %lld of %lld decoded floats differ, %zu entries\n",
                (long long)n, (long long)k, (long long)hd, (long long)differ, (long long)(n * k * hd), entries);
    for (void* q : {(void*)d_pages, (void*)d_pb, (void*)d_pool, (void*)d_sel, (void*)d_rs, (void*)d_wo, (void*)d_wi,
                    (void*)d_so, (void*)d_ref, (void*)d_got, (void*)d_off_ref, (void*)d_off_got, (void*)d_idx_ref,
                    (void*)d_idx_got, (void*)d_scratch})
      cudaFree(q);
  }
  SelectedEntriesArgs bad;
  bad.pages = PagedRowsArgs{nullptr, nullptr, 16, 1000, 0, 68};
  bad.channels = 100;  // not a multiple of Q_kv's block
  bad.n = 1;
  bad.k = 1;
  EXPECT_FALSE(run_selected_entries(bad, nullptr, nullptr).ok());
}

// run_window_kv_step (one launch for the ring's decode, the new rows' norm / RoPE / Q_win packing and, for a
// layer that scores no keys, the selected entries) against the three launches it stands for: every output
// bit for bit (the decoded ring rows, the new rows in place, the ring bytes, the selected rows, the lists).
// Random ring and pool bytes (every code and scale pattern, NaNs included); the released decode shape (512
// channels, 127 earlier rows, 512 selections with -1 padding) at one and five sequences; no entries; an
// empty ring; and a call whose written slots are also read, which must run the sequence (slots_disjoint
// false): with a written slot read back after its packing, a fused launch would decode new bytes there.
void window_kv_step_cases();
// Both placements of the row blocks' constant loads (launch.h pre_wait_enabled: before / after the PDL
// wait) give the same bits.
TEST(GxStepKernels, WindowKvStepEqualsTheThreeLaunches) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  parity::for_both_forms(set_pre_wait_for_tests, "constants before the PDL wait", "constants after the PDL wait",
                 window_kv_step_cases);
}

void window_kv_step_cases() {
  std::mt19937 g(41);
  struct Case {
    const char* what;
    int64_t seqs, dim, ring_per_seq, k, n_freq;
    bool entries, overlap;
  };
  for (const Case& c : {Case{"released decode, 1 sequence", 1, 512, 127, 512, 32, true, false},
                        Case{"released decode, 5 sequences", 5, 512, 127, 512, 32, true, false},
                        Case{"no entries (index layer)", 3, 512, 127, 0, 32, false, false},
                        Case{"empty ring", 2, 256, 0, 48, 16, true, false},
                        Case{"slots read and written", 4, 128, 100, 24, 8, true, true}}) {
    const int64_t n = c.seqs, d = c.dim, R = c.seqs * c.ring_per_seq, k = c.k;
    const int64_t win_row = d + d / 32;
    // The ring: seqs x 128 slots; sequence s's earlier rows in slots [0, ring_per_seq) of its own 128,
    // shuffled; its new row in slot 127 (or, overlapping, in one of the slots read).
    const int64_t slots = 128;
    std::vector<uint8_t> ring(static_cast<size_t>(n * slots * win_row));
    for (auto& b : ring) b = static_cast<uint8_t>(g());
    std::vector<int64_t> ring_read, ring_write(n);
    for (int64_t s = 0; s < n; ++s) {
      std::vector<int64_t> own;
      for (int64_t i = 0; i < c.ring_per_seq; ++i) own.push_back((s * slots + i) * win_row);
      std::shuffle(own.begin(), own.end(), g);
      ring_read.insert(ring_read.end(), own.begin(), own.end());
      ring_write[s] = c.overlap ? own[g() % own.size()] : (s * slots + slots - 1) * win_row;
    }
    std::vector<float> kv(static_cast<size_t>(n * d)), kv_norm(static_cast<size_t>(d));
    std::vector<float> inv(std::max<int64_t>(c.n_freq, 1));
    std::normal_distribution<float> nd(0.0f, 2.0f);
    for (auto& v : kv) v = nd(g);
    for (auto& v : kv_norm) v = 1.0f + 0.1f * nd(g);
    for (int64_t i = 0; i < c.n_freq; ++i) inv[i] = std::pow(10000.0f, -static_cast<float>(i) / c.n_freq);
    std::vector<int64_t> pos(n);
    for (int64_t s = 0; s < n; ++s) pos[s] = 4096 + 977 * s;
    // The KV owner's pages and the selections (as SelectedEntriesEqualTheThreeLaunches).
    std::vector<int64_t> counts;
    for (int64_t s = 0; s < n; ++s) counts.push_back(600 + static_cast<int64_t>(g() % 700));
    std::vector<uint8_t> pool;
    const Paged p = make_kv_pages(g, counts, d, &pool);
    std::vector<int32_t> sel(std::max<int64_t>(n * k, 1), -1), row_seq(n);
    for (int64_t r = 0; r < n; ++r) {
      row_seq[r] = static_cast<int32_t>(r);
      for (int64_t j = 0; j < k; ++j) sel[r * k + j] = g() % 7 == 0 ? -1 : static_cast<int32_t>(g() % p.counts[r]);
    }
    std::vector<int64_t> win_off{0};
    std::vector<int32_t> win_idx;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < c.ring_per_seq; ++i) win_idx.push_back(static_cast<int32_t>(n + r * c.ring_per_seq + i));
      win_idx.push_back(static_cast<int32_t>(r));
      win_off.push_back(static_cast<int64_t>(win_idx.size()));
    }
    const int64_t comp_base = n + R, kvf_rows = comp_base + std::max<int64_t>(n * k, 1);
    int32_t* d_pages = to_device(p.pages);
    int64_t* d_pb = to_device(p.page_begin);
    uint8_t* d_pool = to_device(pool);
    int32_t* d_sel = to_device(sel);
    int32_t* d_rs = to_device(row_seq);
    int64_t* d_wo = to_device(win_off);
    int32_t* d_wi = to_device(win_idx);
    int64_t* d_read = to_device(ring_read);
    int64_t* d_write = to_device(ring_write);
    int64_t* d_pos = to_device(pos);
    float* d_norm = to_device(kv_norm);
    float* d_inv = to_device(inv);
    int64_t* d_scratch = to_device(std::vector<int64_t>(std::max<int64_t>(n * k, 1), -7));
    // Two copies of every output: [0] the sequence, [1] the step.
    uint8_t* d_ring[2];
    float* d_kvf[2];
    int64_t* d_off[2];
    int32_t* d_idx[2];
    WindowKvStepArgs wk[2];
    SelectedEntriesArgs se[2];
    for (int v = 0; v < 2; ++v) {
      d_ring[v] = to_device(ring);
      std::vector<float> kvf(static_cast<size_t>(kvf_rows * d), v ? 5.0f : 3.0f);
      std::copy(kv.begin(), kv.end(), kvf.begin());
      d_kvf[v] = to_device(kvf);
      d_off[v] = to_device(std::vector<int64_t>(n + 1, v ? -9 : -7));
      d_idx[v] = to_device(std::vector<int32_t>(win_idx.size() + n * k + 1, v ? -9 : -7));
      se[v].pages = PagedRowsArgs{d_pages, d_pb, p.E, p.page_bytes, p.off, p.row};
      se[v].sel = d_sel;
      se[v].n = n;
      se[v].k = k;
      se[v].row_seq = d_rs;
      se[v].op = FakeQuantOp::kKv;
      se[v].channels = d;
      se[v].base = d_pool;
      se[v].rows = d_kvf[v] + comp_base * d;
      se[v].win_offsets = d_wo;
      se[v].win_index = d_wi;
      se[v].comp_base = comp_base;
      se[v].kv_offsets = d_off[v];
      se[v].kv_index = d_idx[v];
      wk[v].rows = window_kv_rows(n, d, d_kvf[v], d_norm, 1e-6f, d_pos, d_inv, c.n_freq, d_ring[v], d_write, true);
      wk[v].ring_read = d_read;
      wk[v].ring_rows = R;
      wk[v].ring_out = d_kvf[v] + n * d;
      wk[v].entries = c.entries ? &se[v] : nullptr;
      wk[v].slots_disjoint = !c.overlap;
    }
    // The sequence: the three launches.
    if (R > 0) {
      ASSERT_TRUE(run_decode_rows_gather(FakeQuantOp::kWin, d, d_ring[0], d_read, R, wk[0].ring_out, nullptr).ok());
    }
    ASSERT_TRUE(run_rows_norm_rope_quant(wk[0].rows, nullptr).ok());
    if (c.entries) {
      ASSERT_TRUE(run_selected_entries(se[0], d_scratch, nullptr).ok());
    }
    // The step.
    EXPECT_EQ(window_kv_step_fused(wk[1]), !c.overlap) << c.what;
    const Status st = run_window_kv_step(wk[1], d_scratch, nullptr);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const int64_t used = (comp_base + (c.entries ? n * k : 0)) * d;
    const std::vector<float> a = to_host(d_kvf[0], used), b = to_host(d_kvf[1], used);
    int64_t differ = 0;
    for (int64_t i = 0; i < used; ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0) << c.what;
    EXPECT_EQ(to_host(d_ring[0], ring.size()), to_host(d_ring[1], ring.size())) << c.what;
    if (c.entries) {
      EXPECT_EQ(to_host(d_off[0], n + 1), to_host(d_off[1], n + 1)) << c.what;
      const size_t entries = static_cast<size_t>(to_host(d_off[0] + n, 1)[0]);
      EXPECT_EQ(entries, win_idx.size() + static_cast<size_t>(std::count_if(sel.begin(), sel.begin() + n * k,
                                                                               [](int32_t e) { return e >= 0; })));
      EXPECT_EQ(to_host(d_idx[0], entries), to_host(d_idx[1], entries)) << c.what;
    }
    std::printf("window_kv_step %s: %lld rows of %lld, %lld ring rows, %lld selections: %s, %lld of %lld floats "
                "differ\n",
                c.what, (long long)n, (long long)d, (long long)R, (long long)(c.entries ? n * k : 0),
                window_kv_step_fused(wk[1]) ? "one launch" : "the sequence", (long long)differ, (long long)used);
    for (void* q : {(void*)d_pages, (void*)d_pb, (void*)d_pool, (void*)d_sel, (void*)d_rs, (void*)d_wo, (void*)d_wi,
                    (void*)d_read, (void*)d_write, (void*)d_pos, (void*)d_norm, (void*)d_inv, (void*)d_scratch,
                    (void*)d_ring[0], (void*)d_ring[1], (void*)d_kvf[0], (void*)d_kvf[1], (void*)d_off[0],
                    (void*)d_off[1], (void*)d_idx[0], (void*)d_idx[1]})
      cudaFree(q);
  }
  // The switch off: the sequence, the same outputs (checked above through the fallback case); bad input is
  // the sequence's error.
  WindowKvStepArgs bad;
  float dummy[64] = {};
  bad.rows.in = bad.rows.out = dummy;
  bad.rows.rows = 1;
  bad.rows.dim = 48;  // not a multiple of Q_win's block
  bad.rows.quant = true;
  bad.slots_disjoint = true;
  EXPECT_FALSE(window_kv_step_fused(bad));
  EXPECT_FALSE(run_window_kv_step(bad, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace ds41::cuda
