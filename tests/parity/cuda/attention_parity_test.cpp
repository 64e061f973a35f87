// Parity of the attention-side launchers with the CPU reference (backends/cpu): sparse attention
// (MODEL_SPEC 3.4.7), indexer scores (3.4.6) and the compressor's softmax pool (3.4.4). One table of
// cases per op, including the released widths (64 heads x 512, index 64/32 heads x 128) and lengths
// past the limits (> 128 window rows + > 512 selected entries per row, > 16,384 keys), seeded inputs,
// one line per case: op shape err tol reason. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/attention_kernels.h"
#include "backends/cuda/compressor_kernels.h"
#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/indexer_kernels.h"
#include "backends/cuda/indexer_tc_kernels.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/sparse_attention_tc_kernels.h"
#include "core/thread_pool.h"
#include "parity/cuda/kc_parity_util.h"
#include "quant/fake_quant.h"

namespace ds41::cuda {
namespace {

using namespace kc_test;

int pool_threads() {
  return static_cast<int>(std::max(1u, std::min(16u, std::thread::hardware_concurrency())));
}

// ---------------------------------------------------------------------------------------------
// Rows <= 16 take the decode kernel (entries split over warps, and at 1..4 rows of 64 heads over
// several CTAs with a combine: flash-decoding), more rows the tiled kernel (attention_kernels.cu):
// the tables cover both at the released width and with odd shapes.
struct AttnCase {
  const char* name;
  int64_t n, heads, dim, kv_rows;
  int64_t min_entries, max_entries;  // per row, uniform; with n >= 3 row 0 has none, row 1 exactly one
  float q_scale, sink_scale;
};
const AttnCase kAttnCases[] = {
    {"released decode", 6, 64, 512, 4096, 640, 640, 1.0f, 1.0f},  // 128 window + 512 selected
    {"released prefill", 48, 64, 512, 6000, 0, 700, 1.0f, 1.0f},  // past 128 + 512
    {"peaky scores", 24, 16, 512, 3000, 100, 640, 4.0f, 1.0f},
    {"sink dominates", 12, 8, 512, 1000, 1, 200, 0.2f, 8.0f},
    {"odd heads/dim", 20, 5, 100, 500, 0, 300, 1.0f, 1.0f},
    {"odd heads/dim decode", 4, 5, 100, 500, 0, 300, 1.0f, 1.0f},
    {"small dim", 33, 3, 32, 200, 0, 40, 1.0f, 1.0f},
    {"released decode n=1", 1, 64, 512, 4096, 640, 640, 1.0f, 1.0f},  // 8 splits of 80 entries
    {"released decode n=2", 2, 64, 512, 4096, 600, 640, 1.0f, 1.0f},  // 4 splits
    {"released decode n=3", 3, 64, 512, 4096, 500, 641, 1.0f, 1.0f},  // 2 splits, odd length
};
// Small shapes of the split decode path (cheap enough for the host emulator): many splits per row,
// lists not divisible by the split, splits past a row's end, rows without entries, the sink.
const AttnCase kAttnSplitCases[] = {
    {"split n=1", 1, 3, 100, 300, 77, 77, 1.0f, 1.0f},           // 3 splits of 26, 26, 25
    {"split n=2", 2, 5, 64, 300, 33, 161, 1.0f, 1.0f},           // 6 splits
    {"split n=3 empty rows", 3, 5, 100, 500, 0, 300, 1.0f, 1.0f},  // row 0: 0 entries, row 1: 1
    {"split sink dominates", 2, 8, 64, 200, 1, 90, 0.2f, 8.0f},
    {"split peaky", 1, 4, 32, 100, 200, 200, 6.0f, 1.0f},
    {"split n=16 few heads", 16, 3, 32, 200, 0, 70, 1.0f, 1.0f},  // 2 splits (32 CTAs)
    // Widths of 128 k: the vector kernel (float4 lanes), each of its instantiations below 512.
    {"split vec 128 empty rows", 3, 5, 128, 400, 0, 200, 1.0f, 1.0f},  // half head group, empty row
    {"split vec 256 peaky", 2, 4, 256, 300, 100, 170, 5.0f, 1.0f},
    {"split vec 384 sink dominates", 1, 3, 384, 200, 90, 90, 0.2f, 8.0f},
    // Even head counts on the vector kernel: the fused combine (counters) takes them; a row without
    // entries and rows of one entry (splits past the row's end count too).
    {"split vec 128 fused empty rows", 3, 4, 128, 400, 0, 200, 1.0f, 1.0f},
    {"split vec 256 fused n=4", 4, 6, 256, 300, 1, 120, 1.0f, 1.0f},
};

// Tensor-core kernel (more than 16 rows, entries on the bf16 grid: sparse_attention_tc_kernels.cu):
// the released width past every limit (> 128 + 512 entries, rows of 0 and 1 entries), Q_kv-grid
// entries (E2M1 x E4M3) as well as Q_win, head counts that leave a partial 16-head group, the two
// smaller instantiated widths, lists not divisible by the 16-entry tile, peaky scores and a sink
// that dominates.
const AttnCase kAttnTcCases[] = {
    {"tc released prefill", 48, 64, 512, 6000, 0, 700, 1.0f, 1.0f},
    {"tc released prefill q_kv grid", 40, 64, 512, 6000, 500, 640, 1.0f, 1.0f},
    {"tc peaky scores", 24, 16, 512, 3000, 100, 640, 4.0f, 1.0f},
    {"tc sink dominates", 20, 8, 512, 1000, 1, 200, 0.2f, 8.0f},
};
// The smaller widths (cheap enough for the host emulator).
const AttnCase kAttnTcSmallCases[] = {
    {"tc partial head group", 20, 20, 128, 500, 0, 300, 1.0f, 1.0f},
    {"tc small q_kv grid", 17, 5, 64, 200, 0, 45, 1.0f, 1.0f},
    {"tc small peaky", 18, 16, 64, 300, 30, 70, 6.0f, 1.0f},
    {"tc 24 heads", 18, 24, 64, 300, 0, 60, 1.0f, 1.0f},  // a full and a half 16-head group
};

// The CPU op over the rows' entry lists (kv rows by index): the oracle of the sparse attention tables.
std::vector<float> cpu_sparse_attention(backends::cpu::CpuBackend& cpu, const std::vector<float>& q,
                                        const std::vector<float>& kv, const std::vector<int64_t>& offs,
                                        const std::vector<int32_t>& index, const std::vector<float>& sink,
                                        int64_t n, int64_t H, int64_t D) {
  std::vector<const float*> ptrs(index.size());
  for (size_t j = 0; j < index.size(); ++j) ptrs[j] = &kv[static_cast<int64_t>(index[j]) * D];
  std::vector<float> out(n * H * D);
  ops::AttentionArgs ca;
  ca.n = n;
  ca.n_heads = H;
  ca.head_dim = D;
  ca.q = q.data();
  ca.kv_offsets = offs.data();
  ca.kv = ptrs.data();
  ca.sink = sink.data();
  ca.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  ca.out = out.data();
  cpu.attention(ca);
  return out;
}

// A sparse attention call's host inputs on the device and the arguments over them (out, the workspace and
// the switches are the caller's).
struct DeviceAttention {
  std::unique_ptr<DevBuf<float>> q, kv, sink;
  std::unique_ptr<DevBuf<int64_t>> offs;
  std::unique_ptr<DevBuf<int32_t>> index;
  SparseAttentionArgs args;
  bool ok() const { return q->p && kv->p && sink->p && offs->p && index->p; }
};
DeviceAttention upload_attention(const std::vector<float>& q, const std::vector<float>& kv,
                                 const std::vector<float>& sink, const std::vector<int64_t>& offs,
                                 const std::vector<int32_t>& index, int64_t n, int64_t H, int64_t D, int64_t max_e) {
  DeviceAttention d{upload(q), upload(kv), upload(sink), upload(offs), upload(index), {}};
  d.args.n = n;
  d.args.n_heads = H;
  d.args.head_dim = D;
  d.args.q = d.q->p;
  d.args.kv_offsets = d.offs->p;
  d.args.kv_index = d.index->p;
  d.args.kv = d.kv->p;
  d.args.sink = d.sink->p;
  d.args.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  d.args.max_entries_per_row = max_e;
  return d;
}

void check_sparse_attention(const AttnCase& c, backends::cpu::CpuBackend& cpu, bool tc = false) {
  const bool grid_promise = tc;
  std::mt19937 rng(static_cast<uint32_t>(c.n * 131 + c.heads * 7 + c.dim));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t H = c.heads, D = c.dim;
  std::vector<float> q(c.n * H * D), kv(c.kv_rows * D), sink(H);
  for (float& v : q) v = nd(rng) * c.q_scale;
  for (float& v : kv) v = nd(rng);
  for (float& v : sink) v = nd(rng) * c.sink_scale;
  if (tc && std::string(c.name).find("q_kv") != std::string::npos)
    quant::q_kv_inplace(kv.data(), static_cast<int64_t>(kv.size()));  // compressed-entry grid (blocks of 16)
  else
    quant::q_win_inplace(kv.data(), static_cast<int64_t>(kv.size()) / 32 * 32);  // window-grid values (D % 32
                                                                                 // may leave a raw tail)
  std::vector<int64_t> offs(c.n + 1, 0);
  std::vector<int32_t> index;
  int64_t max_e = 0;
  for (int64_t r = 0; r < c.n; ++r) {
    int64_t e = c.min_entries + static_cast<int64_t>(rng() % (c.max_entries - c.min_entries + 1));
    if (c.n >= 3 && r == 0) e = 0;
    if (c.n >= 3 && r == 1) e = 1;
    for (int64_t j = 0; j < e; ++j) index.push_back(static_cast<int32_t>(rng() % c.kv_rows));
    offs[r + 1] = static_cast<int64_t>(index.size());
    max_e = std::max(max_e, e);
  }
  const std::vector<float> want = cpu_sparse_attention(cpu, q, kv, offs, index, sink, c.n, H, D);

  if (index.empty()) index.push_back(0);
  const DeviceAttention da = upload_attention(q, kv, sink, offs, index, c.n, H, D, max_e);
  DevBuf<float> dout(want.size());
  ASSERT_TRUE(da.ok() && dout.p);
  SparseAttentionArgs ga = da.args;
  ga.out = dout.p;
  ga.entries_on_bf16_grid = grid_promise;
  tc = tc && sparse_attention_tc_supported(ga);  // else run_sparse_attention falls back
  if (tc) ASSERT_GT(c.n, 16) << c.name << ": the tensor-core kernel serves calls of more than 16 rows";
  // Sized as the engine does: for the largest step (more rows, longer lists) than this call.
  ga.workspace_bytes = sparse_attention_workspace_bytes(c.n + 64, H, D, max_e + 100);
  ASSERT_GE(ga.workspace_bytes, sparse_attention_workspace_bytes(c.n, H, D, max_e));
  DevBuf<uint8_t> dws(std::max<size_t>(ga.workspace_bytes, 1));
  ga.workspace = dws.p;
  KC_OK(run_sparse_attention(ga, nullptr));
  auto got = from_dev(dout.p, want.size());
  KC_OK(run_sparse_attention(ga, nullptr));
  EXPECT_EQ(bit_mismatches(from_dev(dout.p, want.size()), got), 0)
      << c.name << ": sparse attention must be bit-identical run to run";
  // The split combine fused into the split kernel's last CTA per (row, head pair) (counters given):
  // the two launches' bits, and the counters left zeroed (the next call reuses them), twice.
  {
    const int64_t nc = sparse_attention_counter_count(c.n + 64, H);
    ASSERT_GE(nc, sparse_attention_counter_count(c.n, H));
    auto dcnt = upload(std::vector<uint32_t>(static_cast<size_t>(nc), 0u));
    DevBuf<float> dfused(want.size());
    SparseAttentionArgs fa = ga;
    fa.counters = dcnt->p;
    fa.counters_size = nc;
    fa.out = dfused.p;
    int64_t differ = 0, left = 0;
    for (int rep = 0; rep < 2; ++rep) {
      KC_OK(run_sparse_attention(fa, nullptr));
      differ += bit_mismatches(from_dev(dfused.p, want.size()), got);
      for (uint32_t v : from_dev(dcnt->p, static_cast<size_t>(nc))) left += v != 0u;
    }
    report(tc ? "sparse_attention_tc" : "sparse_attention",
           std::string(c.name) + " with counters (fused split combine) vs without: bits differing, counters left",
           static_cast<double>(differ + left), 0, "the combine kernel's operations in the last CTA of each group");
    EXPECT_EQ(differ, 0) << c.name;
    EXPECT_EQ(left, 0) << c.name << ": the counters must be zero again after every call";
  }
  // Row 0 has no entries: exact zeros.
  bool zeros = true;
  for (int64_t i = 0; i < H * D && c.n >= 3; ++i) zeros = zeros && bits(got[i]) == 0u;
  EXPECT_TRUE(zeros) << c.name << ": a row without entries must yield +0";
  const double err = rel_err(got, want, max_abs(kv));
  const double tol = 1e-4;
  report(tc ? "sparse_attention_tc" : "sparse_attention",
         std::string(c.name) + " n=" + std::to_string(c.n) + " " + std::to_string(H) + "x" +
             std::to_string(D) + " <=" + std::to_string(max_e) + " entries",
         err, tol,
         tc ? "q and p split in 3 bf16 parts (exact products), float sums: as the float kernel"
            : "float vs double sums of <= 700 convex weights: <= 700*2^-24 ~ 4e-5 of max|v| worst case");
  EXPECT_LE(err, tol) << c.name;
}

TEST(AttentionParity, SparseAttention) {
  KC_SKIP_WITHOUT_GPU();
  ThreadPool pool(pool_threads());
  backends::cpu::CpuBackend cpu(&pool);
  for (const AttnCase& c : kAttnCases) check_sparse_attention(c, cpu);
}

TEST(AttentionParity, SparseAttentionTensorCores) {
  KC_SKIP_WITHOUT_GPU();
  ThreadPool pool(pool_threads());
  backends::cpu::CpuBackend cpu(&pool);
  for (const AttnCase& c : kAttnTcCases) check_sparse_attention(c, cpu, true);
}

TEST(AttentionParity, SparseAttentionTensorCoresSmall) {
  KC_SKIP_WITHOUT_GPU();
  ThreadPool pool(pool_threads());
  backends::cpu::CpuBackend cpu(&pool);
  for (const AttnCase& c : kAttnTcSmallCases) check_sparse_attention(c, cpu, true);
}

// The decode vector kernel's prefetch ring (DS41_ATTN_PREFETCH = 2 / 4: each warp's entries streamed
// through cp.async slots of shared memory) against one entry in flight: the same bits at every depth, with
// and without the fused combine. Cases: the released decode shapes (8 splits of 10 entries per warp at one
// row; at 6 rows one split of 640 entries, 80 per warp: the entry indices are fetched 32 per lane, so
// several refills), and small shapes of every vector width for the host emulator, one of them past 32
// entries per warp too (16 rows x 17 head pairs: one split).
struct PrefetchCase {
  const char* name;
  int64_t n, heads, dim, kv_rows, entries;
};
void check_prefetch_bits(const PrefetchCase& c) {
  std::mt19937 rng(static_cast<uint32_t>(c.n * 977 + c.heads * 13 + c.dim + c.entries));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t H = c.heads, D = c.dim;
  std::vector<float> q(c.n * H * D), kv(c.kv_rows * D), sink(H);
  for (float& v : q) v = nd(rng) * 2.0f;
  for (float& v : kv) v = nd(rng);
  for (float& v : sink) v = nd(rng);
  quant::q_win_inplace(kv.data(), static_cast<int64_t>(kv.size()));
  std::vector<int64_t> offs(c.n + 1, 0);
  std::vector<int32_t> index;
  for (int64_t r = 0; r < c.n; ++r) {
    const int64_t e = r == 1 && c.n > 2 ? 1 : c.entries - static_cast<int64_t>(rng() % 7);  // a row of one entry
    for (int64_t j = 0; j < e; ++j) index.push_back(static_cast<int32_t>(rng() % c.kv_rows));
    offs[r + 1] = static_cast<int64_t>(index.size());
  }
  const DeviceAttention da = upload_attention(q, kv, sink, offs, index, c.n, H, D, c.entries);
  const size_t outs = static_cast<size_t>(c.n * H * D);
  DevBuf<float> dout(outs);
  ASSERT_TRUE(da.ok() && dout.p);
  SparseAttentionArgs ga = da.args;
  ga.out = dout.p;
  ga.workspace_bytes = sparse_attention_workspace_bytes(c.n, H, D, c.entries);
  DevBuf<uint8_t> dws(std::max<size_t>(ga.workspace_bytes, 1));
  ga.workspace = dws.p;
  const int64_t nc = sparse_attention_counter_count(c.n, H);
  auto dcnt = upload(std::vector<uint32_t>(static_cast<size_t>(std::max<int64_t>(nc, 1)), 0u));
  for (const bool fused : {false, true}) {
    SparseAttentionArgs a = ga;
    if (fused) {
      a.counters = dcnt->p;
      a.counters_size = nc;
    }
    set_attention_prefetch_for_tests(0);
    KC_OK(run_sparse_attention(a, nullptr));
    const std::vector<float> want = from_dev(dout.p, outs);
    for (const int depth : {2, 4}) {
      set_attention_prefetch_for_tests(depth);
      KC_OK(run_sparse_attention(a, nullptr));
      const int64_t differ = bit_mismatches(from_dev(dout.p, outs), want);
      report("sparse_attention prefetch",
             std::string(c.name) + " n=" + std::to_string(c.n) + " " + std::to_string(H) + "x" + std::to_string(D) +
                 " ~" + std::to_string(c.entries) + " entries, depth " + std::to_string(depth) +
                 (fused ? ", fused combine" : "") + ": bits differing from depth 0",
             static_cast<double>(differ), 0, "the same rows reach the same arithmetic in the same order");
      EXPECT_EQ(differ, 0) << c.name << " depth " << depth << (fused ? " fused" : "");
    }
    set_attention_prefetch_for_tests(0);
    // The warp merge's weights per thread (DS41_ATTN_MERGE_SHARED=0) and every thread's fence around the
    // fused combine's count (DS41_ONE_FENCE=0): the defaults' bits.
    for (const int variant : {0, 1}) {
      if (variant == 0) set_attention_merge_shared_for_tests(0);
      if (variant == 1) set_one_fence_for_tests(0);
      KC_OK(run_sparse_attention(a, nullptr));
      const int64_t differ = bit_mismatches(from_dev(dout.p, dout.n), want);
      report("sparse_attention merge / fence",
             std::string(c.name) + " n=" + std::to_string(c.n) + " " + std::to_string(H) + "x" + std::to_string(D) +
                 (variant == 0 ? ", merge weights per thread" : ", every thread's fence") +
                 (fused ? ", fused combine" : "") + ": bits differing from the defaults",
             static_cast<double>(differ), 0, "the same expressions of the same values; the same CTA finishes");
      EXPECT_EQ(differ, 0) << c.name << " variant " << variant << (fused ? " fused" : "");
      set_attention_merge_shared_for_tests(-1);
      set_one_fence_for_tests(-1);
    }
  }
  set_attention_prefetch_for_tests(-1);
}

TEST(AttentionParity, SparseAttentionPrefetchKeepsTheBits) {
  KC_SKIP_WITHOUT_GPU();
  const PrefetchCase cases[] = {
      {"released decode", 1, 64, 512, 4096, 640},
      {"released decode, 6 rows", 6, 64, 512, 4096, 640},
      {"released window", 1, 64, 512, 4096, 128},
  };
  for (const PrefetchCase& c : cases) check_prefetch_bits(c);
}

TEST(AttentionParity, SparseAttentionPrefetchKeepsTheBitsSmall) {
  KC_SKIP_WITHOUT_GPU();
  const PrefetchCase cases[] = {
      {"vec 128 splits", 1, 4, 128, 300, 200},
      {"vec 256 two rows", 2, 6, 256, 300, 90},
      {"vec 384", 3, 2, 384, 200, 70},
      {"vec 128 one split, > 32 entries a warp", 16, 34, 128, 500, 300},
  };
  for (const PrefetchCase& c : cases) check_prefetch_bits(c);
}

// SparseAttentionArgs::row_invariant (decode steps and DSpark verification forwards): a row gets the
// same bits alone as in a call of 80 rows (two passes of the workspace's 64), with the inverse
// rotation fused into the combine, and those of a plain one-row decode call; the released width
// (64 heads x 512, up to 128 + 512 entries) and within the float kernels' tolerance of the CPU.
TEST(AttentionParity, SparseAttentionRowInvariant) {
  KC_SKIP_WITHOUT_GPU();
  ThreadPool pool(pool_threads());
  backends::cpu::CpuBackend cpu(&pool);
  const bool emu = std::getenv("DS41_PARITY_SMALL") != nullptr;  // the host emulator: small sizes
  const int64_t n = emu ? 6 : 80, H = emu ? 4 : 64, D = emu ? 128 : 512, kv_rows = emu ? 300 : 4000;
  const int64_t max_e = emu ? 100 : 640, n_freq = D / 8;
  std::mt19937 rng(4242);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(n * H * D), kv(kv_rows * D), sink(H), inv(n_freq);
  for (float& v : q) v = nd(rng);
  for (float& v : kv) v = nd(rng);
  for (float& v : sink) v = nd(rng);
  for (int64_t i = 0; i < n_freq; ++i) inv[i] = std::pow(10000.0f, -static_cast<float>(i) / n_freq);
  quant::q_win_inplace(kv.data(), static_cast<int64_t>(kv.size()));
  std::vector<int64_t> offs(n + 1, 0), pos(n);
  std::vector<int32_t> index;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t e = r == 3 ? 0 : r == 4 ? 1 : r % 7 == 0 ? max_e : 1 + static_cast<int64_t>(rng() % max_e);
    for (int64_t j = 0; j < e; ++j) index.push_back(static_cast<int32_t>(rng() % kv_rows));
    offs[r + 1] = static_cast<int64_t>(index.size());
    pos[r] = 5000 + 3 * r;
  }
  auto dq = upload(q);
  auto dkv = upload(kv);
  auto dsink = upload(sink);
  auto doffs = upload(offs);
  auto dindex = upload(index);
  auto dpos = upload(pos);
  auto dinv = upload(inv);
  DevBuf<float> dall(n * H * D), done(H * D), dplain(H * D);
  SparseAttentionArgs ga;
  ga.n_heads = H;
  ga.head_dim = D;
  ga.kv_index = dindex->p;
  ga.kv = dkv->p;
  ga.sink = dsink->p;
  ga.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  ga.max_entries_per_row = max_e;
  ga.rope_inv_freq = dinv->p;
  ga.rope_n_freq = n_freq;
  ga.workspace_bytes = sparse_attention_workspace_bytes(n + 64, H, D, max_e);
  DevBuf<uint8_t> dws(std::max<size_t>(ga.workspace_bytes, 1));
  ga.workspace = dws.p;
  ga.row_invariant = true;
  ga.n = n;
  ga.q = dq->p;
  ga.kv_offsets = doffs->p;
  ga.rope_pos = dpos->p;
  ga.out = dall.p;
  KC_OK(run_sparse_attention(ga, nullptr));
  const std::vector<float> all = from_dev(dall.p, dall.n);
  {  // the fused split combine (counters), with the inverse rotation, over the passes: the same bits
    const int64_t nc = sparse_attention_counter_count(n, H);
    auto dcnt = upload(std::vector<uint32_t>(static_cast<size_t>(nc), 0u));
    SparseAttentionArgs fa = ga;
    fa.counters = dcnt->p;
    fa.counters_size = nc;
    DevBuf<float> dfused(n * H * D);
    fa.out = dfused.p;
    KC_OK(run_sparse_attention(fa, nullptr));
    int64_t left = 0;
    for (uint32_t v : from_dev(dcnt->p, static_cast<size_t>(nc))) left += v != 0u;
    const int64_t d = bit_mismatches(from_dev(dfused.p, dfused.n), all);
    report("sparse_attention row_invariant", "with counters (fused split combine, rotated back): bits differing",
           static_cast<double>(d + left), 0, "the combine kernel's operations in the last CTA of each group");
    EXPECT_EQ(d, 0);
    EXPECT_EQ(left, 0);
  }
  int64_t differ = 0, differ_plain = 0;
  for (int64_t r = 0; r < n; ++r) {
    SparseAttentionArgs one = ga;
    one.n = 1;
    one.q = dq->p + r * H * D;
    one.kv_offsets = doffs->p + r;
    one.rope_pos = dpos->p + r;
    one.out = done.p;
    KC_OK(run_sparse_attention(one, nullptr));
    one.row_invariant = false;  // a plain one-row decode call: the same splits
    one.out = dplain.p;
    KC_OK(run_sparse_attention(one, nullptr));
    const std::vector<float> a = from_dev(done.p, done.n), b = from_dev(dplain.p, dplain.n);
    for (int64_t i = 0; i < H * D; ++i) {
      differ += bits(a[i]) != bits(all[r * H * D + i]);
      differ_plain += bits(b[i]) != bits(a[i]);
    }
  }
  report("sparse_attention row_invariant",
         "n=" + std::to_string(n) + " " + std::to_string(H) + "x" + std::to_string(D) + " <=" + std::to_string(max_e) +
             " entries, rows alone vs in the call: bits differing",
         static_cast<double>(differ), 0, "one-row splits for every row: the row's order does not depend on n");
  EXPECT_EQ(differ, 0);
  EXPECT_EQ(differ_plain, 0) << "row_invariant must give a one-row decode call's bits";
  // Against the CPU (without the rotation: the CPU op has none).
  ga.rope_n_freq = 0;
  ga.rope_pos = nullptr;
  KC_OK(run_sparse_attention(ga, nullptr));
  const std::vector<float> want = cpu_sparse_attention(cpu, q, kv, offs, index, sink, n, H, D);
  const double err = rel_err(from_dev(dall.p, dall.n), want, max_abs(kv));
  report("sparse_attention row_invariant", "n=" + std::to_string(n) + " vs CPU", err, 1e-4,
         "float vs double sums of <= 700 convex weights: <= 700*2^-24 ~ 4e-5 of max|v| worst case");
  EXPECT_LE(err, 1e-4);
}

// SparseAttentionArgs::rotate_q: the query's forward rotation (MODEL_SPEC 3.4.2) inside the decode
// kernel's load of q, or a run_rope launch on the other paths, gives the bits of run_rope(q) followed
// by the unrotated call, on every path: split decode (several splits and one), row_invariant in two
// passes, the float kernel past 16 rows, the tensor-core kernel (released width, not on the
// emulator), an odd rope offset (the pairs straddle lanes: run_rope first) and a rope region that
// starts inside a lane's 32-channel slice. The decode path leaves q as it was.
TEST(AttentionParity, SparseAttentionRotatesQ) {
  KC_SKIP_WITHOUT_GPU();
  const bool emu = std::getenv("DS41_PARITY_SMALL") != nullptr;
  struct RotCase {
    const char* name;
    int64_t n, H, D, n_freq, max_e;
    bool row_invariant, grid;
  };
  std::vector<RotCase> cases = {
      {"decode splits", 2, 4, 128, 32, 300, false, false},
      {"decode one split", 3, 40, 100, 10, 20, false, false},
      {"odd rope offset", 2, 3, 63, 8, 50, false, false},
      {"row_invariant two passes", 70, 2, 64, 16, 90, true, false},
      {"float kernel", 20, 3, 96, 24, 60, false, false},
  };
  if (!emu) {
    cases.push_back({"released width decode", 1, 64, 512, 32, 640, false, true});
    cases.push_back({"released width tensor cores", 40, 64, 512, 32, 640, false, true});
  }
  std::mt19937 rng(777);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const RotCase& c : cases) {
    const int64_t kv_rows = 4 * c.max_e;
    std::vector<float> q(c.n * c.H * c.D), kv(kv_rows * c.D), sink(c.H), inv(c.n_freq);
    for (float& v : q) v = nd(rng);
    for (float& v : kv) v = nd(rng);
    for (float& v : sink) v = nd(rng);
    for (int64_t i = 0; i < c.n_freq; ++i) inv[i] = std::pow(10000.0f, -static_cast<float>(i) / c.n_freq);
    quant::q_win_inplace(kv.data(), static_cast<int64_t>(kv.size()));
    std::vector<int64_t> offs(c.n + 1, 0), pos(c.n);
    std::vector<int32_t> index;
    for (int64_t r = 0; r < c.n; ++r) {
      const int64_t e = r == 1 ? 0 : r % 3 == 0 ? c.max_e : 1 + static_cast<int64_t>(rng() % c.max_e);
      for (int64_t j = 0; j < e; ++j) index.push_back(static_cast<int32_t>(rng() % kv_rows));
      offs[r + 1] = static_cast<int64_t>(index.size());
      pos[r] = 37 + 1001 * r;
    }
    auto dq = upload(q), dq_ref = upload(q), dkv = upload(kv), dsink = upload(sink), dinv = upload(inv);
    auto doffs = upload(offs), dpos = upload(pos);
    auto dindex = upload(index.empty() ? std::vector<int32_t>{0} : index);
    DevBuf<float> dout(c.n * c.H * c.D), dref(c.n * c.H * c.D);
    SparseAttentionArgs a;
    a.n = c.n;
    a.n_heads = c.H;
    a.head_dim = c.D;
    a.kv_offsets = doffs->p;
    a.kv_index = dindex->p;
    a.kv = dkv->p;
    a.sink = dsink->p;
    a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.D)));
    a.max_entries_per_row = c.max_e;
    a.entries_on_bf16_grid = c.grid;
    a.row_invariant = c.row_invariant;
    a.rope_pos = dpos->p;
    a.rope_inv_freq = dinv->p;
    a.rope_n_freq = c.n_freq;
    a.workspace_bytes = sparse_attention_workspace_bytes(c.n, c.H, c.D, c.max_e);
    DevBuf<uint8_t> dws(std::max<size_t>(a.workspace_bytes, 1));
    a.workspace = dws.p;
    SparseAttentionArgs ref = a;
    KC_OK(run_rope(dq_ref->p, c.n, c.H, c.D, dpos->p, dinv->p, c.n_freq, false, nullptr));
    ref.q = dq_ref->p;
    ref.out = dref.p;
    KC_OK(run_sparse_attention(ref, nullptr));
    a.q = dq->p;
    a.out = dout.p;
    a.rotate_q = true;
    for (const int early : {1, 0}) {  // the split kernels' table before / after their PDL wait
      set_pre_wait_for_tests(early);
      // q afresh: the paths that rotate with a run_rope launch first rotate it in place.
      to_dev(dq->p, q);
      KC_OK(run_sparse_attention(a, nullptr));
      const int64_t differ = bit_mismatches(from_dev(dout.p, dout.n), from_dev(dref.p, dref.n));
      report("sparse_attention rotate_q",
             std::string(c.name) + " n=" + std::to_string(c.n) + " " + std::to_string(c.H) + "x" + std::to_string(c.D) +
                 " freq " + std::to_string(c.n_freq) + (early ? ", table before the wait" : ", table after the wait") +
                 ": bits differing from run_rope + the call",
             static_cast<double>(differ), 0, "run_rope's arithmetic on the loaded pairs");
      EXPECT_EQ(differ, 0) << c.name << " early " << early;
    }
    set_pre_wait_for_tests(-1);
    const bool decode_path = c.row_invariant || c.n <= 16;
    if (decode_path && (c.D - 2 * c.n_freq) % 2 == 0)
      EXPECT_EQ(bit_mismatches(from_dev(dq->p, dq->n), q), 0) << c.name << ": the decode path leaves q unchanged";
  }
  SparseAttentionArgs bad;
  bad.n = 1;
  bad.n_heads = 1;
  bad.head_dim = 8;
  bad.rotate_q = true;
  const Status st = run_sparse_attention(bad, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("rotate_q"), std::string::npos) << st.message();
}

// A call whose width the tensor-core kernel does not take falls back to the float kernel, even
// with the grid promise; without the promise the kernel refuses it.
TEST(AttentionParity, SparseAttentionTensorCoreFallback) {
  KC_SKIP_WITHOUT_GPU();
  ThreadPool pool(pool_threads());
  backends::cpu::CpuBackend cpu(&pool);
  const AttnCase c{"tc fallback odd dim", 20, 5, 96, 300, 0, 100, 1.0f, 1.0f};
  SparseAttentionArgs a;
  a.head_dim = 96;
  a.n_heads = 5;
  a.entries_on_bf16_grid = true;
  EXPECT_FALSE(sparse_attention_tc_supported(a));
  a.head_dim = 512;
  a.entries_on_bf16_grid = false;
  EXPECT_FALSE(sparse_attention_tc_supported(a));
  EXPECT_FALSE(run_sparse_attention_tc(a, nullptr).ok());
  check_sparse_attention(c, cpu, true);  // the promise, a width the kernel does not take
}

TEST(AttentionParity, SparseAttentionSplitDecode) {
  KC_SKIP_WITHOUT_GPU();
  ThreadPool pool(pool_threads());
  backends::cpu::CpuBackend cpu(&pool);
  for (const AttnCase& c : kAttnSplitCases) check_sparse_attention(c, cpu);
}

// ---------------------------------------------------------------------------------------------
struct IdxCase {
  const char* name;
  int64_t heads, dim;
  std::vector<int64_t> seq_keys;  // keys per sequence (concatenated in the key buffer)
  int64_t rows_per_seq, t_stride_extra;
};

// Rows of the tensor-core tables: every `raw_every`-th key and query row left off the Q_idx grid
// (raw floats: not exact in bf16, so the certificate must send them to the CPU-order dot), and
// block 3 of every `spread_every`-th key scaled by 2^`spread` (a span the certificate refuses, while
// the values stay on the grid).
// packed: the keys as packed Q_idx rows (run_indexer_scores' key_base / key_offsets) at scattered
// 4-byte-aligned offsets, as pages place them, every 41st key's offset -1 (a zero key).
// w_scale (packed only): the kernel gets the weights unscaled and IndexerDeviceArgs::w_scale, the CPU the weights
// scaled first (run_scale's float product): the same bits expected.
struct IdxTcKnobs {
  bool tc = false;
  int raw_every = 0, spread_every = 0, spread = 0;
  bool packed = false;
  float w_scale = 1.0f;
  // paged (with packed): the keys in pages of 16 rows (68 bytes each, 12 bytes of other data before them and 20
  // after), each sequence's pages at shuffled page ids, addressed through key_pages / row_seq instead of
  // key_offsets (no zero keys: every listed entry has a page).
  bool paged = false;
};

void check_indexer(const IdxCase& c, backends::cpu::CpuBackend& cpu, const IdxTcKnobs& k = {}) {
  {
    std::mt19937 rng(static_cast<uint32_t>(c.heads * 1000 + c.dim + (k.tc ? 7 : 0)));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t H = c.heads, D = c.dim, S = static_cast<int64_t>(c.seq_keys.size());
    int64_t total_keys = 0, t_max = 0;
    for (int64_t k : c.seq_keys) total_keys += k, t_max = std::max(t_max, k);
    const int64_t T = t_max + c.t_stride_extra, n = S * c.rows_per_seq;
    std::vector<float> keys(total_keys * D), q(n * H * D), w(n * H);
    for (float& v : keys) v = nd(rng);
    for (float& v : q) v = nd(rng);
    for (float& v : w) v = nd(rng) / std::sqrt(static_cast<float>(H));
    if (D % 32 == 0) {  // values on the Q_idx grid, as the model stores them
      quant::q_idx_inplace(keys.data(), static_cast<int64_t>(keys.size()));
      quant::q_idx_inplace(q.data(), static_cast<int64_t>(q.size()));
    }
    if (k.raw_every > 0) {
      for (int64_t r = 0; r < total_keys; r += k.raw_every)
        for (int64_t i = 0; i < D; ++i) keys[r * D + i] = nd(rng);
      for (int64_t r = 0; r < n * H; r += k.raw_every)
        for (int64_t i = 0; i < D; ++i) q[r * D + i] = nd(rng);
    }
    if (k.spread_every > 0)
      for (int64_t r = 1; r < total_keys; r += k.spread_every)
        for (int64_t i = std::min<int64_t>(96, D); i < D; ++i) keys[r * D + i] = std::ldexp(keys[r * D + i], k.spread);
    std::vector<int64_t> key_off;  // packed: each key's byte offset (-1: a zero key)
    std::vector<uint8_t> packed;
    PagedRowsArgs pg;  // paged: the geometry (device pointers set at the upload)
    std::vector<int32_t> page_ids, row_seq(S * c.rows_per_seq);
    std::vector<int64_t> seq_page_begin;
    if (k.paged) {
      const int64_t rb = quant::idx_row_bytes(D), E = 16;
      pg.entries_per_page = E;
      pg.offset_in_page = 12;
      pg.row_bytes = rb;
      pg.page_bytes = 12 + E * rb + 20;
      int64_t n_pages = 0;
      for (int64_t cnt : c.seq_keys) n_pages += (cnt + E - 1) / E;
      std::vector<int32_t> ids(n_pages);
      for (int64_t i = 0; i < n_pages; ++i) ids[i] = static_cast<int32_t>(i);
      std::shuffle(ids.begin(), ids.end(), rng);
      packed.assign(n_pages * pg.page_bytes, 0xa5);
      int64_t kb2 = 0;
      for (int64_t s2 = 0; s2 < S; ++s2) {
        seq_page_begin.push_back(static_cast<int64_t>(page_ids.size()));
        const int64_t cnt = c.seq_keys[s2];
        for (int64_t e = 0; e < (cnt + E - 1) / E; ++e) page_ids.push_back(ids[page_ids.size()]);
        for (int64_t e = 0; e < cnt; ++e) {
          const int64_t off = page_ids[seq_page_begin.back() + e / E] * pg.page_bytes + pg.offset_in_page + (e % E) * rb;
          quant::q_idx_encode(&keys[(kb2 + e) * D], D, packed.data() + off);
        }
        for (int64_t j = 0; j < c.rows_per_seq; ++j) row_seq[s2 * c.rows_per_seq + j] = static_cast<int32_t>(s2);
        kb2 += cnt;
      }
    } else if (k.packed) {
      const int64_t rb = quant::idx_row_bytes(D);
      for (int64_t r = 0; r < total_keys; ++r) {
        if (r % 41 == 40) {
          key_off.push_back(-1);
          std::fill(&keys[r * D], &keys[(r + 1) * D], 0.0f);
          continue;
        }
        // A page's other bytes; an odd count now and then leaves the rows after it off the 4-byte grid
        // (the kernel's staging then reads them a byte at a time).
        if (r % 13 == 0) packed.resize(packed.size() + 4 * (1 + r % 5) + (r % 39 == 0 ? 1 : 0), 0xa5);
        key_off.push_back(static_cast<int64_t>(packed.size()));
        packed.resize(packed.size() + rb);
        quant::q_idx_encode(&keys[r * D], D, packed.data() + key_off.back());
      }
    }
    std::vector<int64_t> begin(n), vis(n);
    std::vector<float> want(n * T, -INFINITY);
    int64_t kb = 0;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t Ts = c.seq_keys[s];
      for (int64_t j = 0; j < c.rows_per_seq; ++j) {
        const int64_t r = s * c.rows_per_seq + j;
        begin[r] = kb;
        vis[r] = j == 0 ? Ts : j == 1 ? 0 : static_cast<int64_t>(rng() % (Ts + 1));
      }
      // CPU: this sequence's rows against its keys (row stride Ts), copied into the wide table.
      const int64_t r0 = s * c.rows_per_seq;
      std::vector<float> out(c.rows_per_seq * Ts);
      ops::IndexerArgs ia;
      ia.n = c.rows_per_seq;
      ia.n_heads = H;
      ia.head_dim = D;
      ia.n_keys = Ts;
      std::vector<float> ws(&w[r0 * H], &w[(r0 + c.rows_per_seq) * H]);
      for (float& v : ws) v *= k.w_scale;  // 1: unchanged
      ia.q = &q[r0 * H * D];
      ia.w = ws.data();
      ia.keys = &keys[kb * D];
      ia.visible = &vis[r0];
      ia.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
      ia.out = out.data();
      cpu.indexer_scores(ia);
      for (int64_t j = 0; j < c.rows_per_seq; ++j)
        std::copy(&out[j * Ts], &out[(j + 1) * Ts], &want[(r0 + j) * T]);
      kb += Ts;
    }
    auto dkeys = upload(keys);
    auto dq = upload(q);
    auto dw = upload(w);
    auto dbegin = upload(begin);
    auto dvis = upload(vis);
    DevBuf<float> dout(n * T);
    ASSERT_TRUE(dkeys->p && dq->p && dw->p && dbegin->p && dvis->p && dout.p);
    IndexerDeviceArgs ga;
    ga.n = n;
    ga.n_heads = H;
    ga.head_dim = D;
    ga.t_stride = T;
    ga.q = dq->p;
    ga.w = dw->p;
    ga.keys = dkeys->p;
    ga.key_begin = dbegin->p;
    ga.visible = dvis->p;
    ga.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    ga.out = dout.p;
    std::unique_ptr<DevBuf<uint8_t>> dpacked;
    std::unique_ptr<DevBuf<int64_t>> doff;
    std::unique_ptr<DevBuf<int32_t>> dpages, drow_seq;
    std::unique_ptr<DevBuf<int64_t>> dspb;
    if (k.paged) {
      dpacked = upload(packed);
      dpages = upload(page_ids);
      dspb = upload(seq_page_begin);
      drow_seq = upload(row_seq);
      ASSERT_TRUE(dpacked->p && dpages->p && dspb->p && drow_seq->p);
      ga.keys = nullptr;
      ga.key_base = dpacked->p;
      pg.pages = dpages->p;
      pg.seq_page_begin = dspb->p;
      ga.key_pages = pg;
      ga.row_seq = drow_seq->p;
      ga.w_scale = k.w_scale;
      ASSERT_TRUE(indexer_scores_packed_supported(ga)) << c.name;
    } else if (k.packed) {
      dpacked = upload(packed);
      doff = upload(key_off);
      ASSERT_TRUE(dpacked->p && doff->p);
      ga.keys = nullptr;
      ga.key_base = dpacked->p;
      ga.key_offsets = doff->p;
      ga.w_scale = k.w_scale;
      ASSERT_TRUE(indexer_scores_packed_supported(ga)) << c.name;
    }
    if (k.tc) {
      ASSERT_TRUE(indexer_scores_tc_supported(ga)) << c.name;
      KC_OK(run_indexer_scores_tc(ga, nullptr));
    } else {
      KC_OK(run_indexer_scores(ga, nullptr));
    }
    auto got = from_dev(dout.p, want.size());
    const int64_t bad = bit_mismatches(got, want);
    report(k.tc       ? "indexer_scores_tc"
           : k.paged  ? "indexer_scores packed keys through pages"
           : k.packed ? "indexer_scores packed keys"
                      : "indexer_scores",
           std::string(c.name) + " n=" + std::to_string(n) + " T=" + std::to_string(T) + " " +
               std::to_string(H) + "x" + std::to_string(D),
           static_cast<double>(bad), 0,
           "mismatching bits: the kernel repeats dot_f32's lane order and the double head sum");
    EXPECT_EQ(bad, 0) << c.name << " (max rel err " << rel_err(got, want, max_abs(want)) << ")";
  }
}

TEST(AttentionParity, IndexerScores) {
  KC_SKIP_WITHOUT_GPU();
  ThreadPool pool(pool_threads());
  backends::cpu::CpuBackend cpu(&pool);
  const IdxCase cases[] = {
      {"released idx 64x128", 64, 128, {17000, 3000}, 6, 5},  // > 2048 blocks of 8
      {"released idx 32x128", 32, 128, {33000}, 4, 0},
      {"small generic dim", 8, 64, {900, 50, 1}, 5, 130},
      {"dim with tail", 3, 100, {600}, 9, 1},
      // >= 32 rows: run_indexer_scores hands these to the tensor-core kernel.
      {"released idx 32x128 prefill rows", 32, 128, {5000}, 40, 3},
      // A DSpark verification of 8 sequences (6 rows each, 48 >= 32: the tensor-core kernel with
      // several sequences per 16-row tile, key tiles split over the grid).
      {"released idx 32x128 verification rows", 32, 128, {4100, 4097, 4200, 3000, 4096, 4090, 129, 4099}, 6, 0},
  };
  for (const IdxCase& c : cases) check_indexer(c, cpu);
}

// The tensor-core kernel, bit for bit against the CPU: the released 32 heads past 16 384 keys, a
// partial last 16-row tile, rows of two and of up to six sequences in one tile (runs of rows, each
// over its own keys), raw rows and wide block spreads (the certificate refuses them), few heads.
TEST(AttentionParity, IndexerScoresTensorCores) {
  KC_SKIP_WITHOUT_GPU();
  ThreadPool pool(pool_threads());
  backends::cpu::CpuBackend cpu(&pool);
  check_indexer({"tc released 32x128", 32, 128, {17000}, 37, 0}, cpu, {true, 0, 0, 0});
  check_indexer({"tc two sequences per tile", 32, 128, {3000, 2000}, 20, 70}, cpu, {true, 0, 0, 0});
  check_indexer({"tc raw rows", 32, 128, {4000}, 33, 1}, cpu, {true, 7, 0, 0});
  check_indexer({"tc block spread", 16, 128, {3000}, 48, 0}, cpu, {true, 0, 3, 20});
  check_indexer({"tc small heads", 8, 128, {700, 300}, 17, 5}, cpu, {true, 5, 4, 9});
  check_indexer({"tc verification 6 rows x 7 sequences", 32, 128, {2100, 2000, 1, 2050, 900, 2200, 2048}, 6, 3}, cpu,
                {true, 0, 0, 0});
  check_indexer({"tc 3 rows per sequence, raw rows", 32, 128, {1000, 1100, 1200, 700, 1300, 1001}, 3, 0}, cpu,
                {true, 11, 0, 0});
}

// Cheap enough for the host emulator.
TEST(AttentionParity, IndexerScoresTensorCoresSmall) {
  KC_SKIP_WITHOUT_GPU();
  ThreadPool pool(pool_threads());
  backends::cpu::CpuBackend cpu(&pool);
  check_indexer({"tc emu", 4, 128, {300, 150}, 20, 9}, cpu, {true, 5, 2, 20});
  check_indexer({"tc emu verification rows", 4, 128, {260, 129, 300, 1, 200}, 6, 2}, cpu, {true, 7, 3, 20});
}

// Decode-shaped calls over the packed Q_idx rows (no float copy of the keys): bit for bit against the
// CPU over the decoded keys. The released 32 heads past 2,048 blocks of 8 keys, a DSpark verification's
// rows, 8 and 5 heads (head groups of unequal size), zero keys (offset -1) and scattered rows.
TEST(AttentionParity, IndexerScoresPackedKeys) {
  KC_SKIP_WITHOUT_GPU();
  ThreadPool pool(pool_threads());
  backends::cpu::CpuBackend cpu(&pool);
  IdxTcKnobs packed;
  packed.packed = true;
  check_indexer({"packed released 32x128", 32, 128, {17000, 3000}, 6, 5}, cpu, packed);
  check_indexer({"packed verification 6 rows x 3 sequences", 32, 128, {4100, 129, 1}, 6, 3}, cpu, packed);
  check_indexer({"packed 8 heads", 8, 128, {2100, 700}, 3, 40}, cpu, packed);
  IdxTcKnobs scaled = packed;  // the engine's decode: the weights' 1 / sqrt(32) applied as they are read
  scaled.w_scale = static_cast<float>(1.0 / std::sqrt(32.0));
  check_indexer({"packed released 32x128, w_scale", 32, 128, {4097, 2049}, 2, 3}, cpu, scaled);
  IdxTcKnobs paged = scaled;  // the engine's decode with DS41_INDEX_PAGED=1: offsets from the pages in the kernel
  paged.paged = true;
  check_indexer({"paged released 32x128, w_scale", 32, 128, {4097, 2049, 17}, 2, 3}, cpu, paged);
}

// Cheap enough for the host emulator.
TEST(AttentionParity, IndexerScoresPackedKeysSmall) {
  KC_SKIP_WITHOUT_GPU();
  ThreadPool pool(pool_threads());
  backends::cpu::CpuBackend cpu(&pool);
  IdxTcKnobs packed;
  packed.packed = true;
  check_indexer({"packed emu 8 heads", 8, 128, {300, 70}, 3, 9}, cpu, packed);
  check_indexer({"packed emu 5 heads", 5, 128, {130, 1}, 2, 1}, cpu, packed);
  IdxTcKnobs scaled = packed;  // the weights' 1 / sqrt(heads) applied as they are read (the engine's decode)
  scaled.w_scale = static_cast<float>(1.0 / std::sqrt(8.0));
  check_indexer({"packed emu 8 heads, w_scale", 8, 128, {300, 70}, 3, 9}, cpu, scaled);
  IdxTcKnobs paged = scaled;  // keys through pages of 16 rows at shuffled page ids (DS41_INDEX_PAGED)
  paged.paged = true;
  check_indexer({"paged emu 8 heads, w_scale", 8, 128, {300, 70, 1}, 3, 9}, cpu, paged);
  {  // pages whose rows overflow the page: a clear error, nothing launched
    IndexerDeviceArgs pb;
    pb.n = 1;
    pb.n_heads = 8;
    pb.head_dim = 128;
    pb.t_stride = 4;
    pb.key_base = reinterpret_cast<const uint8_t*>(16);
    pb.q = pb.w = reinterpret_cast<const float*>(16);
    pb.key_begin = pb.visible = reinterpret_cast<const int64_t*>(16);
    pb.out = reinterpret_cast<float*>(16);
    pb.row_seq = reinterpret_cast<const int32_t*>(16);
    pb.key_pages.pages = reinterpret_cast<const int32_t*>(16);
    pb.key_pages.seq_page_begin = reinterpret_cast<const int64_t*>(16);
    pb.key_pages.entries_per_page = 16;
    pb.key_pages.row_bytes = 68;
    pb.key_pages.page_bytes = 16 * 68 - 1;
    const Status st = run_indexer_scores(pb, nullptr);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("page geometry"), std::string::npos) << st.message();
  }
  {  // the float-key paths take no w_scale: a clear error, nothing launched
    IndexerDeviceArgs fl;
    fl.n = 1;
    fl.n_heads = 8;
    fl.head_dim = 128;
    fl.t_stride = 4;
    fl.q = fl.w = fl.keys = reinterpret_cast<const float*>(16);
    fl.key_begin = fl.visible = reinterpret_cast<const int64_t*>(16);
    fl.out = reinterpret_cast<float*>(16);
    fl.w_scale = 0.5f;
    const Status st = run_indexer_scores(fl, nullptr);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("w_scale"), std::string::npos) << st.message();
  }
  IndexerDeviceArgs bad;  // packed keys of another width: a clear error, nothing launched
  bad.n = 1;
  bad.n_heads = 8;
  bad.head_dim = 64;
  bad.t_stride = 4;
  bad.key_base = reinterpret_cast<const uint8_t*>(16);
  bad.key_offsets = reinterpret_cast<const int64_t*>(16);
  bad.q = bad.w = reinterpret_cast<const float*>(16);
  bad.key_begin = bad.visible = reinterpret_cast<const int64_t*>(16);
  bad.out = reinterpret_cast<float*>(16);
  EXPECT_FALSE(indexer_scores_packed_supported(bad));
  const Status st = run_indexer_scores(bad, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("head_dim 128"), std::string::npos) << st.message();
}

// ---------------------------------------------------------------------------------------------
TEST(AttentionParity, SoftmaxPool) {
  KC_SKIP_WITHOUT_GPU();
  backends::cpu::CpuBackend cpu(nullptr);
  struct Case {
    int64_t groups, r, dim;
    float b_scale;
  };
  const Case cases[] = {{600, 2, 512, 1.0f}, {300, 4, 512, 3.0f}, {50, 2, 512, 40.0f}, {7, 3, 33, 1.0f}};
  for (const Case& c : cases) {
    std::mt19937 rng(static_cast<uint32_t>(c.groups * 10 + c.r));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> a(c.groups * c.r * c.dim), b(a.size()), want(c.groups * c.dim);
    for (float& v : a) v = nd(rng);
    for (float& v : b) v = nd(rng) * c.b_scale;
    for (int64_t g = 0; g < c.groups; ++g)
      cpu.softmax_pool(&a[g * c.r * c.dim], &b[g * c.r * c.dim], c.r, c.dim, &want[g * c.dim]);
    auto da = upload(a);
    auto db = upload(b);
    DevBuf<float> dout(want.size());
    ASSERT_TRUE(da->p && db->p && dout.p);
    KC_OK(run_softmax_pool(da->p, db->p, c.groups, c.r, c.dim, dout.p, nullptr));
    auto got = from_dev(dout.p, want.size());
    const double err = rel_err(got, want, max_abs(a));
    const double tol = 1e-6;
    report("softmax_pool",
           "groups=" + std::to_string(c.groups) + " r=" + std::to_string(c.r) + " dim=" +
               std::to_string(c.dim) + " bit-mismatches=" + std::to_string(bit_mismatches(got, want)),
           err, tol, "same steps as the CPU; only CUDA's double exp may differ by 1 ulp (double)");
    EXPECT_LE(err, tol);
  }
}

TEST(AttentionParity, LaunchersRejectBadShapes) {
  SparseAttentionArgs a;
  a.n = 1;
  a.n_heads = 4;
  a.head_dim = 1024;  // above the kernel's limit
  EXPECT_FALSE(run_sparse_attention(a, nullptr).ok());
  a.head_dim = 512;
  a.n = 0;
  EXPECT_TRUE(run_sparse_attention(a, nullptr).ok());
  // A decode call that splits its rows needs the workspace (checked on the host, before any
  // pointer is read).
  float dummy[4] = {};
  int64_t offs[2] = {0, 640};
  int32_t idx[1] = {0};
  a.n = 1;
  a.n_heads = 64;
  a.max_entries_per_row = 640;
  a.q = a.kv = a.sink = dummy;
  a.out = dummy;
  a.kv_offsets = offs;
  a.kv_index = idx;
  EXPECT_GT(sparse_attention_workspace_bytes(1, 64, 512, 640), 0u);
  EXPECT_FALSE(run_sparse_attention(a, nullptr).ok());
  a.workspace = dummy;
  a.workspace_bytes = sparse_attention_workspace_bytes(1, 64, 512, 640) - 4;
  EXPECT_FALSE(run_sparse_attention(a, nullptr).ok());
  // Past 64 rows the need stays: row_invariant calls run in passes of 64 rows (64 x 8 one-row
  // splits at 64 heads of 512), other calls of more than 16 rows take the tiled kernels.
  EXPECT_EQ(sparse_attention_workspace_bytes(65, 64, 512, 640), sparse_attention_workspace_bytes(64, 64, 512, 640));
  EXPECT_EQ(sparse_attention_workspace_bytes(4096, 64, 512, 640),
            size_t{64} * 8 * 64 * (512 + 2) * sizeof(float));
  IndexerDeviceArgs i;
  i.n = 1;
  i.n_heads = 128;
  i.head_dim = 128;  // query tile too large for shared memory
  i.t_stride = 10;
  EXPECT_FALSE(run_indexer_scores(i, nullptr).ok());
  EXPECT_FALSE(run_softmax_pool(nullptr, nullptr, 1, 0, 4, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace ds41::cuda
