// Parity of the GPU executor's index-list kernels (backends/cuda/gx_step_kernels.h) with host
// loops written from their contract: exact (integers), compared element for element. Cases cross
// the one-block scan's 1024-row chunks, empty sequences, -1 padding in the middle of a selection
// row and pages in scrambled order. Skips without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/gx_step_kernels.h"
#include "backends/cuda/kv_rows_kernels.h"
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
    Paged p;
    p.E = 16;
    p.row = quant::kv_row_bytes(hd);
    p.off = 48;
    p.page_bytes = p.off + p.E * p.row + 16;
    int32_t next = 0;
    for (int64_t s = 0; s < seqs; ++s) {
      const int64_t c = (s % 3 == 2) ? 0 : 1 + static_cast<int64_t>(g() % 700);
      p.counts.push_back(c);
      p.page_begin.push_back(static_cast<int64_t>(p.pages.size()));
      for (int64_t i = 0; i < (c + p.E - 1) / p.E; ++i) p.pages.push_back(next++);
    }
    std::shuffle(p.pages.begin(), p.pages.end(), g);
    std::vector<uint8_t> pool(static_cast<size_t>(std::max<int32_t>(next, 1) * p.page_bytes));
    for (auto& b : pool) b = static_cast<uint8_t>(g());
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

}  // namespace
}  // namespace ds41::cuda
