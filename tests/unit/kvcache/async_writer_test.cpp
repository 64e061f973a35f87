// Tests for kvcache/async_writer: bounded queue, reject vs blocking back-pressure, completion
// callbacks with the put's Status, drain and destructor semantics.
#include "kvcache/async_writer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <thread>

#include "kvcache/posix_io.h"
#include "unit/kvcache/test_util.h"

namespace ds41::kvcache {
namespace {

// A FileIo whose writes wait until the gate opens (a slow disk under the test's control).
class GatedIo final : public FileIo {
 public:
  explicit GatedIo(FileIo& base) : base_(base) {}
  void close_gate() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = false;
  }
  void open_gate() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }
  std::atomic<int> waiting{0};
  Result<int> open(const std::string& p, int f, int m) override { return base_.open(p, f, m); }
  Result<size_t> pwrite(int fd, const void* b, size_t n, uint64_t o) override {
    std::unique_lock<std::mutex> l(mu_);
    ++waiting;
    cv_.wait(l, [&] { return open_; });
    --waiting;
    l.unlock();
    return base_.pwrite(fd, b, n, o);
  }
  Result<size_t> pread(int fd, void* b, size_t n, uint64_t o) override { return base_.pread(fd, b, n, o); }
  Status fsync(int fd) override { return base_.fsync(fd); }
  Status close(int fd) override { return base_.close(fd); }
  Result<FileStat> fstat(int fd) override { return base_.fstat(fd); }
  Result<FileStat> stat(const std::string& p) override { return base_.stat(p); }
  Status rename(const std::string& a, const std::string& b) override { return base_.rename(a, b); }
  Status unlink(const std::string& p) override { return base_.unlink(p); }
  Status mkdir(const std::string& p) override { return base_.mkdir(p); }
  Status list_dir(const std::string& p, std::vector<std::string>* n) override { return base_.list_dir(p, n); }
  Status fsync_dir(const std::string& d) override { return base_.fsync_dir(d); }
  Status set_times_fd(int fd, int64_t a, int64_t m) override { return base_.set_times_fd(fd, a, m); }
  Status set_times(const std::string& p, int64_t a, int64_t m) override { return base_.set_times(p, a, m); }

 private:
  FileIo& base_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;  // open while the tier is created; tests close it
};

class AsyncWriterTest : public ::testing::Test {
 protected:
  std::unique_ptr<DiskTier> open_tier(FileIo& io, uint64_t capacity = 1ULL << 30) {
    DiskTierConfig c;
    c.dir = dir_.sub("store");
    c.capacity_bytes = capacity;
    c.sync = false;
    auto t = DiskTier::open(c, io, clock_, metrics_);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return std::move(*t);
  }
  static BlockWrite write(uint64_t i, std::function<void(const Status&)> done = {}) {
    return BlockWrite{BlockKey{i, i}, 128, testing::make_payload(i, 1000), std::move(done)};
  }
  testing::ScratchDir dir_{"writer"};
  FakeClock clock_;
  MetricsRegistry metrics_;
};

TEST_F(AsyncWriterTest, BoundedQueueRejectsOrBlocks) {
  GatedIo io(PosixIo::instance());
  auto tier = open_tier(io);
  io.close_gate();
  AsyncWriterConfig wc;
  wc.threads = 1;
  wc.queue_blocks = 2;
  std::atomic<int> acked{0};
  auto ack = [&](const Status& s) { acked += s.ok(); };
  {
    AsyncWriter w(*tier, wc, metrics_);
    ASSERT_TRUE(w.submit(write(0, ack)).ok());
    while (io.waiting.load() == 0) std::this_thread::yield();  // worker holds block 0 at the gate
    ASSERT_TRUE(w.submit(write(1, ack)).ok());
    ASSERT_TRUE(w.submit(write(2, ack)).ok());
    EXPECT_EQ(w.queued_blocks(), 2u);
    EXPECT_EQ(metrics_.gauge_value("ds41_kv_write_queue_depth"), 2);
    Status rej = w.submit(write(3, ack), SubmitMode::kReject);
    EXPECT_EQ(rej.code(), StatusCode::kResourceExhausted);
    Status late = w.submit(write(4, ack), SubmitMode::kBlock, 30);
    EXPECT_EQ(late.code(), StatusCode::kResourceExhausted);
    EXPECT_EQ(metrics_.counter_value("ds41_kv_write_queue_rejected_total"), 2u);
    // A blocked submitter proceeds once the disk catches up.
    std::atomic<bool> submitted{false};
    std::thread t([&] { submitted = w.submit(write(5, ack), SubmitMode::kBlock, 60000).ok(); });
    // Open the gate only once the submitter is really waiting for room.
    while (metrics_.counter_value("ds41_kv_write_queue_blocked_total") < 2) std::this_thread::yield();
    io.open_gate();
    t.join();
    EXPECT_TRUE(submitted.load());
    w.drain();
    EXPECT_EQ(acked.load(), 4);
    EXPECT_EQ(w.queued_blocks(), 0u);
    EXPECT_EQ(metrics_.counter_value("ds41_kv_write_queue_blocked_total"), 2u);
  }
  for (uint64_t i : {0, 1, 2, 5}) EXPECT_TRUE(tier->get(BlockKey{i, i}).has_value()) << i;
  for (uint64_t i : {3, 4}) EXPECT_FALSE(tier->contains(BlockKey{i, i})) << i;
}

TEST_F(AsyncWriterTest, CallbacksCarryErrorsAndDestructorDrains) {
  auto tier = open_tier(PosixIo::instance(), 3 * (1000 + kBlockHeaderBytes));
  AsyncWriterConfig wc;
  wc.threads = 3;
  std::atomic<int> ok{0}, refused{0};
  {
    AsyncWriter w(*tier, wc, metrics_);
    for (uint64_t i = 0; i < 5; ++i)
      ASSERT_TRUE(w.submit(write(i, [&](const Status& s) {
                     if (s.ok())
                       ++ok;
                     else if (s.code() == StatusCode::kResourceExhausted)
                       ++refused;
                   })).ok());
  }  // destructor finishes the queue
  EXPECT_EQ(ok.load(), 3);
  EXPECT_EQ(refused.load(), 2);
  EXPECT_EQ(metrics_.counter_value("ds41_kv_write_completed_total", {{"result", "error"}}), 2u);
  EXPECT_EQ(metrics_.counter_value("ds41_kv_disk_writes_refused_total"), 2u);
}

TEST_F(AsyncWriterTest, QueueIsBoundedByBytesToo) {
  GatedIo io(PosixIo::instance());
  auto tier = open_tier(io);
  io.close_gate();
  AsyncWriterConfig wc;
  wc.threads = 1;
  wc.queue_blocks = 100;
  wc.queue_bytes = 2500;  // two 1000-byte payloads fit, a third does not
  AsyncWriter w(*tier, wc, metrics_);
  ASSERT_TRUE(w.submit(write(0)).ok());
  while (io.waiting.load() == 0) std::this_thread::yield();
  ASSERT_TRUE(w.submit(write(1)).ok());
  ASSERT_TRUE(w.submit(write(2)).ok());
  EXPECT_EQ(w.submit(write(3)).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(w.queued_bytes(), 2000u);
  io.open_gate();
  w.drain();
}

}  // namespace
}  // namespace ds41::kvcache
