// Tests for core::ThreadPool: coverage, determinism of the chunking, many concurrent callers on
// one pool and nested calls (the server and KvStore::restore call one shared pool from several
// threads). Run under ThreadSanitizer by `scripts/test.sh --sanitize tsan` and by the CI's short
// TSan job (tests/sanitize).
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace ds41 {
namespace {

TEST(ThreadPool, CoversRangeExactlyOnce) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(1000);
  for (int rep = 0; rep < 20; ++rep) {
    pool.parallel_for(1000, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
  }
  for (auto& h : hits) EXPECT_EQ(h.load(), 20);
}

TEST(ThreadPool, ChunksDependOnlyOnNAndSize) {
  ThreadPool pool(4);
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> seen;
  pool.parallel_for(10, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(mu);
    seen.emplace_back(b, e);
  });
  std::sort(seen.begin(), seen.end());
  std::vector<std::pair<int64_t, int64_t>> want = {{0, 2}, {2, 5}, {5, 7}, {7, 10}};
  EXPECT_EQ(seen, want);
}

// Many threads share one pool, each issuing many calls of different sizes and checking its own
// result: with a single shared job slot (the old design) callers overwrite each other's job and
// pending count, which loses chunks, runs a chunk of the wrong function or crashes.
TEST(ThreadPool, ManyConcurrentCallersEachGetTheirOwnResult) {
  ThreadPool pool(4);
  constexpr int kCallers = 8, kCalls = 300;
  std::atomic<int> failures{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int call = 0; call < kCalls; ++call) {
        const int64_t n = 1 + (c * 131 + call * 17) % 257;
        std::vector<int> out(static_cast<size_t>(n), 0);
        pool.parallel_for(n, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) out[static_cast<size_t>(i)] += c * 1000 + static_cast<int>(i);
        });
        for (int64_t i = 0; i < n; ++i)
          if (out[static_cast<size_t>(i)] != c * 1000 + i) failures++;
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// A fn that itself calls parallel_for on the same pool (the engine may run a backend op inside a
// pool task) completes: every caller works through its own chunks.
TEST(ThreadPool, NestedCallsComplete) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  pool.parallel_for(6, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.parallel_for(100, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
    }
  });
  EXPECT_EQ(total.load(), 600);
}

TEST(ThreadPool, SingleThreadRunsInline) {
  ThreadPool pool(1);
  const auto me = std::this_thread::get_id();
  bool inline_run = false;
  pool.parallel_for(5, [&](int64_t b, int64_t e) { inline_run = std::this_thread::get_id() == me && b == 0 && e == 5; });
  EXPECT_TRUE(inline_run);
}

}  // namespace
}  // namespace ds41
