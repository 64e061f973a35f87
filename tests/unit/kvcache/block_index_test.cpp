// Tests for kvcache/block_index (retention split and LRU order, no I/O) and kvcache/unique_fd
// (each descriptor closed exactly once, through the FileIo that opened it).
#include "kvcache/block_index.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <atomic>

#include "kvcache/posix_io.h"
#include "kvcache/unique_fd.h"
#include "unit/kvcache/test_util.h"

namespace ds41::kvcache {
namespace {

constexpr int64_t kS = 1'000'000'000LL;

BlockKey key(uint64_t i) { return BlockKey{i, ~i}; }

TEST(BlockIndex, RetentionSplitLruOrderAndAgeing) {
  BlockIndex idx(/*retention_ns=*/100 * kS);
  const int64_t now = 1000 * kS;
  idx.insert(key(1), {10, now - 500 * kS, now - 50 * kS}, now);  // past retention, used 50 s ago
  idx.insert(key(2), {20, now - 300 * kS, now - 80 * kS}, now);  // past retention, used 80 s ago
  idx.insert(key(3), {40, now - 10 * kS, now - 10 * kS}, now);   // under retention
  EXPECT_EQ(idx.size(), 3u);
  EXPECT_EQ(idx.used_bytes(), 70u);
  EXPECT_TRUE(idx.find(key(1))->old);
  EXPECT_FALSE(idx.find(key(3))->old);
  ASSERT_EQ(idx.lru().size(), 2u);
  EXPECT_EQ(idx.retained().size(), 1u);
  EXPECT_EQ(*idx.lru_victim(), key(2));  // least recently used among the evictable
  idx.touch(key(2), now);
  EXPECT_EQ(*idx.lru_victim(), key(1));
  idx.remove(key(1));
  idx.remove(key(1));  // absent: no-op
  EXPECT_EQ(idx.used_bytes(), 60u);
  EXPECT_EQ(*idx.lru_victim(), key(2));
  // Block 3 leaves retention 90 s later (published at now - 10 s, retention 100 s).
  idx.promote_aged(now + 89 * kS);
  EXPECT_FALSE(idx.find(key(3))->old);
  idx.promote_aged(now + 90 * kS);
  EXPECT_TRUE(idx.find(key(3))->old);
  EXPECT_TRUE(idx.retained().empty());
  EXPECT_EQ(idx.lru().size(), 2u);
  // Only young blocks: nothing to evict.
  BlockIndex young(100 * kS);
  young.insert(key(9), {1, now, now}, now);
  EXPECT_FALSE(young.lru_victim().has_value());
}

TEST(BlockIndex, ReplaceAllKeepsNewerInProcessAccessTimes) {
  BlockIndex idx(0);
  const int64_t now = 1000 * kS;
  idx.insert(key(1), {10, 100 * kS, 900 * kS}, now);
  idx.insert(key(2), {10, 100 * kS, 900 * kS}, now);
  BlockIndex::Map fresh;
  fresh[key(1)] = {10, 100 * kS, 500 * kS};  // same publish time: the newer access is kept
  fresh[key(2)] = {10, 200 * kS, 500 * kS};  // rewritten meanwhile: the disk's times win
  fresh[key(3)] = {5, 100 * kS, 100 * kS};
  idx.replace_all(std::move(fresh), now);
  EXPECT_EQ(idx.find(key(1))->access_ns, 900 * kS);
  EXPECT_EQ(idx.find(key(2))->access_ns, 500 * kS);
  EXPECT_EQ(idx.used_bytes(), 25u);
  EXPECT_EQ(*idx.lru_victim(), key(3));
}

// Counts closes that reach the underlying FileIo.
class CloseCountingIo final : public ForwardingIo {
 public:
  using ForwardingIo::ForwardingIo;
  Status close(int fd) override {
    closes.fetch_add(1);
    return base_.close(fd);
  }
  std::atomic<int> closes{0};
};

TEST(UniqueFd, ClosesOnceThroughItsFileIo) {
  testing::ScratchDir dir("unique-fd");
  CloseCountingIo io(PosixIo::instance());
  const std::string path = dir.sub("f");
  {
    auto fd = open_fd(io, path, O_WRONLY | O_CREAT, 0644);
    ASSERT_TRUE(fd.ok()) << fd.status().to_string();
    EXPECT_TRUE(fd->valid());
    UniqueFd moved = std::move(*fd);
    EXPECT_FALSE(fd->valid());
    EXPECT_TRUE(moved.valid());
    UniqueFd other;
    other = std::move(moved);
    EXPECT_EQ(io.closes.load(), 0);
  }
  EXPECT_EQ(io.closes.load(), 1);  // one open, one close, whatever the moves
  {
    auto fd = open_fd(io, path, O_RDONLY, 0);
    ASSERT_TRUE(fd.ok());
    EXPECT_TRUE(fd->close().ok());
    EXPECT_TRUE(fd->close().ok());  // already closed: nothing to do
  }
  EXPECT_EQ(io.closes.load(), 2);
  auto missing = open_fd(io, dir.sub("absent"), O_RDONLY, 0);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(io.closes.load(), 2);
}

}  // namespace
}  // namespace ds41::kvcache
