// KV block pool bookkeeping (no device needed): the page allocator's free list and refcounts, and
// the bytes per token of the pool's page layout equal the CPU's KvLayout (890 B/token for the
// released config, MODEL_SPEC 5.3); the GPU engine's byte accounting equals the CPU engine's.
#include "gpu/kv_block_pool.h"

#include <gtest/gtest.h>

#include "engine/cpu_engine.h"
#include "gpu/engine/gpu_test_util.h"
#include "model/kv_layout.h"
#include "model/layer_schedule.h"

namespace ds41::testing {
namespace {

TEST(PageAllocator, FreeListAndRefcounts) {
  gpu::PageAllocator a(3);
  EXPECT_EQ(a.free_pages(), 3);
  auto p0 = a.allocate(), p1 = a.allocate(), p2 = a.allocate();
  ASSERT_TRUE(p0.ok() && p1.ok() && p2.ok());
  EXPECT_EQ(*p0, 0);
  EXPECT_EQ(a.free_pages(), 0);
  auto none = a.allocate();
  EXPECT_EQ(none.status().code(), StatusCode::kResourceExhausted);
  a.retain(*p1);  // shared by a fork
  EXPECT_EQ(a.refcount(*p1), 2);
  a.release(*p1);
  EXPECT_EQ(a.free_pages(), 0);
  a.release(*p1);
  EXPECT_EQ(a.free_pages(), 1);
  auto again = a.allocate();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *p1);  // most recently freed first
  EXPECT_EQ(a.used_pages(), 3);
}

TEST(KvBlockPool, BytesPerTokenEqualTheCpuLayout) {
  for (const char* name : {"tiny", "small", "v41-flash"}) {
    auto c = model::preset_config(name);
    ASSERT_TRUE(c.ok());
    auto s = model::derive_layer_schedule(*c);
    ASSERT_TRUE(s.ok());
    auto l = model::make_kv_layout(*c, *s);
    ASSERT_TRUE(l.ok());
    gpu::KvPageGeometry g;
    g.entries_per_page = 64;
    g.kv_row_bytes = l->sources.at(0).kv_row_bytes;
    g.key_row_bytes = l->sources.at(0).key_row_bytes;
    EXPECT_DOUBLE_EQ(gpu::KvBlockPool::bytes_per_token(*l, g), l->global_bytes_per_token()) << name;
    if (std::string(name) == "v41-flash") {
      EXPECT_DOUBLE_EQ(gpu::KvBlockPool::bytes_per_token(*l, g), 890.0);
      EXPECT_EQ(g.page_bytes(), 64 * (288 + 68));
    }
    // Pages for 1000 tokens: per source ceil(entries / 64).
    int64_t want = 0;
    for (const auto& src : l->sources) want += (1000 / src.ratio + 63) / 64;
    EXPECT_EQ(gpu::KvBlockPool::pages_for_tokens(*l, 1000, 64), want);
  }
}

TEST(CudaEngineBytes, EqualTheCpuEngine) {
  DS41_SKIP_WITHOUT_GPU();
  TestModel cpu = load_cpu_model(golden_dir(), 2);
  ASSERT_TRUE(cpu.model);
  auto dev = load_device_model(golden_dir());
  ASSERT_TRUE(dev);
  auto eng = make_engine(*dev, 8);
  ASSERT_TRUE(eng);
  engine::CpuEngine ce(cpu.model.get(), "cpu");
  for (int64_t t : {0, 1, 2, 63, 64, 65, 1000})
    EXPECT_EQ(eng->bytes_for_tokens(t), ce.bytes_for_tokens(t)) << t;
  auto a = eng->create_sequence();
  auto b = ce.create_sequence();
  auto toks = seeded_tokens(77, dev->config().vocab_size, 3);
  engine::StepItem ga{*a, toks, false}, cb{*b, toks, false};
  engine::StepOutput so;
  ASSERT_TRUE(eng->step(std::span<const engine::StepItem>(&ga, 1), &so).ok());
  ASSERT_TRUE(ce.step(std::span<const engine::StepItem>(&cb, 1), &so).ok());
  EXPECT_EQ(*eng->sequence_bytes(*a), *ce.sequence_bytes(*b));
  EXPECT_GT(eng->pool().used_bytes(), 0);
}

}  // namespace
}  // namespace ds41::testing
