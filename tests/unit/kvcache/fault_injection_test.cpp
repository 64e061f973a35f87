// Reliability: the persistent tier over FaultInjectingIo. Failed/short writes, ENOSPC, fsync and
// rename errors, torn and corrupted writes, failed and corrupted reads — and a seeded random mix
// of all of them. Invariant checked everywhere: a get() never returns bytes other than the ones
// put for that key; failed publishes leave neither a final file nor a temp file behind.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <random>

#include "kvcache/disk_tier.h"
#include "kvcache/posix_io.h"
#include "support/kvcache/fault_injecting_io.h"
#include "unit/kvcache/test_util.h"

namespace ds41::kvcache {
namespace {

constexpr size_t kPayload = 113920;  // one released-model global block (890 B/token x 128)

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DiskTierConfig c;
    c.dir = dir_.sub("store");
    c.capacity_bytes = 1ULL << 30;
    c.model_fingerprint = 7;
    c.sync = true;  // fsync faults must be reachable
    c.touch_interval_ns = 0;
    auto t = DiskTier::open(c, io_, clock_, metrics_);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    tier_ = std::move(*t);
  }
  static BlockKey key(uint64_t i) { return BlockKey{i, i * 31 + 5}; }
  static std::vector<uint8_t> payload(uint64_t i) { return testing::make_payload(i + 1000, kPayload); }
  // Returns true on a hit; fails the test if the bytes are not exactly the ones written.
  bool get_checked(uint64_t i) {
    auto b = tier_->get(key(i));
    if (!b) return false;
    auto want = payload(i);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), b->payload().begin(), b->payload().end()))
        << "CORRUPT DATA SERVED for block " << i;
    return true;
  }
  size_t temp_files() {
    size_t n = 0;
    // Temp files live beside their final names (blocks/<hh>/.<key>...tmp); tmp/ holds the marker's.
    for (auto& e : std::filesystem::recursive_directory_iterator(dir_.sub("store")))
      n += e.is_regular_file() && e.path().extension() == ".tmp";
    return n;
  }
  uint64_t counter(const std::string& n, const MetricLabels& l = {}) { return metrics_.counter_value(n, l); }
  // Blocks first..first+n-1 as put_batch requests; `data` owns the payloads the requests view.
  std::vector<DiskTier::PutRequest> batch(uint64_t first, uint64_t n,
                                          std::vector<std::vector<uint8_t>>* data) {
    data->clear();
    for (uint64_t i = first; i < first + n; ++i) data->push_back(payload(i));
    std::vector<DiskTier::PutRequest> reqs;
    for (uint64_t i = 0; i < n; ++i) reqs.push_back({key(first + i), 128, (*data)[i]});
    return reqs;
  }

  testing::ScratchDir dir_{"fault"};
  FaultInjectingIo io_{PosixIo::instance()};
  FakeClock clock_;
  MetricsRegistry metrics_;
  std::unique_ptr<DiskTier> tier_;
};

TEST_F(FaultTest, FailedPublishesLeaveNothingBehind) {
  struct Case {
    FaultKind kind;
    int skip;
    StatusCode code;
  };
  // skip=1 on writes hits the payload write (the header is the first write).
  const Case cases[] = {{FaultKind::kFailWrite, 0, StatusCode::kIoError},
                        {FaultKind::kFailWrite, 1, StatusCode::kIoError},
                        {FaultKind::kNoSpace, 1, StatusCode::kResourceExhausted},
                        {FaultKind::kFailFsync, 0, StatusCode::kIoError},
                        {FaultKind::kFailRename, 0, StatusCode::kIoError}};
  uint64_t i = 0;
  for (const Case& c : cases) {
    io_.clear();
    io_.inject(c.kind, c.skip, 1);
    Status s = tier_->put(key(i), 128, payload(i));
    EXPECT_EQ(s.code(), c.code) << "case " << i << ": " << s.to_string();
    EXPECT_FALSE(std::filesystem::exists(tier_->block_path(key(i)))) << i;
    EXPECT_EQ(temp_files(), 0u) << i;
    EXPECT_FALSE(get_checked(i));
    EXPECT_FALSE(tier_->contains(key(i)));
    // The store keeps working after the fault.
    io_.clear();
    ASSERT_TRUE(tier_->put(key(i), 128, payload(i)).ok());
    EXPECT_TRUE(get_checked(i));
    ++i;
  }
  EXPECT_EQ(counter("ds41_kv_disk_write_errors_total"), 5u);
  EXPECT_EQ(tier_->used_bytes(),
            5 * (kPayload + kBlockHeaderBytes));  // failed writes released their reservation
}

TEST_F(FaultTest, ShortWritesAreCompletedNotTorn) {
  io_.inject(FaultKind::kShortWrite, 0, -1);  // every write is short
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(tier_->put(key(i), 128, payload(i)).ok());
  io_.clear();
  for (uint64_t i = 0; i < 5; ++i) EXPECT_TRUE(get_checked(i));
  EXPECT_GT(io_.fired(), 20);
}

TEST_F(FaultTest, TornAndCorruptWritesAreNeverServed) {
  io_.inject(FaultKind::kTornWrite, 1, 1);     // block 0: payload write loses its second half
  io_.inject(FaultKind::kCorruptWrite, 3, 1);  // block 1: payload written with a flipped byte
  io_.inject(FaultKind::kTornWrite, 4, 1);     // block 2: header torn
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(tier_->put(key(i), 128, payload(i)).ok());  // the disk lied
  EXPECT_EQ(io_.fired(), 3);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(get_checked(i)) << i;
    EXPECT_FALSE(std::filesystem::exists(tier_->block_path(key(i)))) << i;
  }
  EXPECT_TRUE(get_checked(3));
  EXPECT_EQ(counter("ds41_kv_disk_checksum_failures_total"), 3u);
  // Rewriting a deleted torn block works.
  ASSERT_TRUE(tier_->put(key(0), 128, payload(0)).ok());
  EXPECT_TRUE(get_checked(0));
}

TEST_F(FaultTest, ReadFaults) {
  for (uint64_t i = 0; i < 2; ++i) ASSERT_TRUE(tier_->put(key(i), 128, payload(i)).ok());
  io_.inject(FaultKind::kFailRead, 0, 1);
  EXPECT_FALSE(get_checked(0));  // transient EIO: a miss, the file stays
  EXPECT_TRUE(std::filesystem::exists(tier_->block_path(key(0))));
  EXPECT_EQ(counter("ds41_kv_disk_read_errors_total"), 1u);
  EXPECT_TRUE(get_checked(0));
  io_.inject(FaultKind::kCorruptRead, 0, 1);
  EXPECT_FALSE(get_checked(1));  // bytes came back wrong: never served
  EXPECT_EQ(counter("ds41_kv_disk_checksum_failures_total"), 1u);
}

TEST_F(FaultTest, RandomFaultMixNeverServesCorruptData) {
  std::mt19937 rng(20261130);
  const FaultKind kinds[] = {FaultKind::kFailWrite,  FaultKind::kShortWrite,   FaultKind::kNoSpace,
                             FaultKind::kTornWrite,  FaultKind::kCorruptWrite, FaultKind::kFailFsync,
                             FaultKind::kFailRename, FaultKind::kFailRead,     FaultKind::kCorruptRead};
  int hits = 0, put_ok = 0, put_err = 0;
  for (int op = 0; op < 400; ++op) {
    if (rng() % 3 == 0) io_.inject(kinds[rng() % 9], static_cast<int>(rng() % 3), 1);
    uint64_t i = rng() % 40;
    if (rng() % 2) {
      (tier_->put(key(i), 128, payload(i)).ok() ? put_ok : put_err)++;
    } else {
      hits += get_checked(i);
    }
    if (op % 50 == 49) io_.clear();
  }
  EXPECT_GT(io_.fired(), 50);
  EXPECT_GT(hits, 20);
  EXPECT_GT(put_ok, 20);
  EXPECT_GT(put_err, 5);
  io_.clear();
  for (uint64_t i = 0; i < 40; ++i) get_checked(i);  // final sweep, corrupt leftovers are removed
  EXPECT_EQ(temp_files(), 0u);
}

// Group commit (DiskTier::put_batch, used by every AsyncWriter thread): one directory fsync per
// directory per batch, and a failed directory fsync acknowledges none of that directory's blocks.
TEST_F(FaultTest, GroupCommitFsyncsEachDirectoryOncePerBatch) {
  constexpr uint64_t kDirAb = 0xabULL << 56;  // keys with hi < 2^56 land in blocks/00/
  std::vector<std::vector<uint8_t>> data;
  std::vector<DiskTier::PutRequest> reqs = batch(0, 8, &data);
  // Every directory fsync after the first fails: if the batch fsynced the directory per block,
  // blocks 1..7 would fail.
  io_.inject(FaultKind::kFailDirFsync, /*skip=*/1, /*times=*/-1);
  auto res = tier_->put_batch(reqs);
  ASSERT_EQ(res.size(), 8u);
  for (uint64_t i = 0; i < 8; ++i) EXPECT_TRUE(res[i].ok()) << i << ": " << res[i].to_string();
  EXPECT_EQ(io_.fired(), 0);
  for (uint64_t i = 0; i < 8; ++i) EXPECT_TRUE(get_checked(i));
  io_.clear();

  // Next batch: blocks 8..11 in blocks/00/, 12..15 in blocks/ab/. The first directory fsync
  // (blocks/00, sorted) fails: none of 8..11 is acknowledged, all of 12..15 are.
  data.clear();
  reqs.clear();
  for (uint64_t i = 8; i < 16; ++i) data.push_back(payload(i));
  for (uint64_t i = 8; i < 16; ++i) {
    BlockKey k = key(i);
    if (i >= 12) k.hi |= kDirAb;
    reqs.push_back({k, 128, data[i - 8]});
  }
  io_.inject(FaultKind::kFailDirFsync, 0, 1);
  res = tier_->put_batch(reqs);
  ASSERT_EQ(res.size(), 8u);
  EXPECT_EQ(io_.fired(), 1);
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_FALSE(res[j].ok()) << "block " << 8 + j << " acknowledged although its directory fsync failed";
    EXPECT_NE(res[j].message().find("fsync dir"), std::string::npos) << res[j].to_string();
  }
  for (size_t j = 4; j < 8; ++j) EXPECT_TRUE(res[j].ok()) << res[j].to_string();
  EXPECT_EQ(counter("ds41_kv_disk_write_errors_total"), 4u);
  EXPECT_EQ(temp_files(), 0u);
  // A rejected batch may leave the (complete, verified) file visible; it is simply unacknowledged.
  for (size_t j = 4; j < 8; ++j) {
    auto b = tier_->get(reqs[j].key);
    ASSERT_TRUE(b.has_value());
    EXPECT_TRUE(std::equal(data[j].begin(), data[j].end(), b->payload().begin(), b->payload().end()));
  }
}

// A data fsync failure inside a batch fails only that block; the rest of the batch commits.
TEST_F(FaultTest, GroupCommitDataFsyncFailureIsPerBlock) {
  std::vector<std::vector<uint8_t>> data;
  std::vector<DiskTier::PutRequest> reqs = batch(0, 6, &data);
  io_.inject(FaultKind::kFailFsync, /*skip=*/2, /*times=*/1);
  auto res = tier_->put_batch(reqs);
  for (uint64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(res[i].ok(), i != 2) << i << ": " << res[i].to_string();
    EXPECT_EQ(get_checked(i), i != 2) << i;
  }
  EXPECT_EQ(temp_files(), 0u);
}

// A mid-batch write failure (ENOSPC on the 4th block's data) fails that block only; the blocks
// staged before and after it still commit, and no temp file is left.
TEST_F(FaultTest, GroupCommitWriteFailureMidBatchIsPerBlock) {
  std::vector<std::vector<uint8_t>> data;
  std::vector<DiskTier::PutRequest> reqs = batch(0, 8, &data);
  // Two pwrites per block (header, payload): the 8th write is block 3's payload.
  io_.inject(FaultKind::kNoSpace, /*skip=*/7, /*times=*/1);
  auto res = tier_->put_batch(reqs);
  EXPECT_EQ(io_.fired(), 1);
  for (uint64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(res[i].ok(), i != 3) << i << ": " << res[i].to_string();
    EXPECT_EQ(get_checked(i), i != 3) << i;
  }
  EXPECT_EQ(res[3].code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(temp_files(), 0u);
  EXPECT_EQ(tier_->block_count(), 7u);
}

// Records the order of the durability-relevant calls of a FileIo.
class RecordingIo final : public ForwardingIo {
 public:
  explicit RecordingIo(FileIo& base) : ForwardingIo(base) {}
  std::vector<std::string> ops;
  Result<size_t> pwrite(int fd, const void* b, size_t n, uint64_t o) override {
    log("write");
    return base_.pwrite(fd, b, n, o);
  }
  Status fsync(int fd) override {
    log("fsync");
    return base_.fsync(fd);
  }
  Status start_writeback(int fd) override {
    log("writeback");
    return base_.start_writeback(fd);
  }
  Status rename(const std::string& a, const std::string& b) override {
    log("rename");
    return base_.rename(a, b);
  }
  Status fsync_dir(const std::string& d) override {
    log("dirfsync");
    return base_.fsync_dir(d);
  }
  // One by one through the recorded calls above.
  std::vector<Status> fsync_many(std::span<const int> fds) override { return FileIo::fsync_many(fds); }
  std::vector<Status> fsync_dirs(std::span<const std::string> dirs) override {
    return FileIo::fsync_dirs(dirs);
  }

 private:
  void log(const char* op) {
    std::lock_guard<std::mutex> lock(mu_);
    ops.emplace_back(op);
  }
  std::mutex mu_;
};

// The write pipeline of a batch: every block's data is written and its writeback started before
// the first fsync (so the fsyncs share journal commits instead of each waiting for its own
// writeback), each rename follows its block's fsync, and directory fsyncs come last — one per
// distinct directory. A per-block publish loop (write, fsync, rename, write, ...) fails this.
TEST(GroupCommitOrder, BatchStagesAllDataBeforeAnyFsync) {
  testing::ScratchDir dir("order");
  RecordingIo io(PosixIo::instance());
  FakeClock clock;
  MetricsRegistry metrics;
  DiskTierConfig c;
  c.dir = dir.sub("store");
  c.capacity_bytes = 1ULL << 30;
  c.sync = true;
  auto t = DiskTier::open(c, io, clock, metrics);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  io.ops.clear();
  constexpr int kBlocks = 12;
  std::vector<std::vector<uint8_t>> data;
  std::vector<DiskTier::PutRequest> reqs;
  for (int i = 0; i < kBlocks; ++i) data.push_back(testing::make_payload(i, 4096 + i));
  for (int i = 0; i < kBlocks; ++i) {
    // Blocks 0..5 in blocks/00/, 6..11 in blocks/01/: two directory fsyncs expected.
    uint64_t hi = (i < 6 ? 0ULL : 1ULL << 56) | static_cast<uint64_t>(i);
    reqs.push_back({BlockKey{hi, 77}, 128, data[i]});
  }
  auto res = (*t)->put_batch(reqs);
  for (int i = 0; i < kBlocks; ++i) ASSERT_TRUE(res[i].ok()) << res[i].to_string();
  auto pos = [&](const std::string& op, int nth) {
    int seen = 0;
    for (size_t i = 0; i < io.ops.size(); ++i)
      if (io.ops[i] == op && seen++ == nth) return static_cast<int>(i);
    return -1;
  };
  auto count = [&](const std::string& op) { return std::count(io.ops.begin(), io.ops.end(), op); };
  EXPECT_EQ(count("writeback"), kBlocks);
  EXPECT_EQ(count("fsync"), kBlocks);
  EXPECT_EQ(count("rename"), kBlocks);
  EXPECT_EQ(count("dirfsync"), 2);
  const int first_fsync = pos("fsync", 0);
  EXPECT_LT(pos("writeback", kBlocks - 1), first_fsync) << "a block's data was staged after an fsync";
  EXPECT_LT(pos("write", 2 * kBlocks - 1), first_fsync);
  for (int i = 0; i < kBlocks; ++i) EXPECT_LT(pos("fsync", i), pos("rename", i)) << i;
  EXPECT_LT(pos("rename", kBlocks - 1), pos("dirfsync", 0));
  for (int i = 0; i < kBlocks; ++i) {
    auto b = (*t)->get(reqs[i].key);
    ASSERT_TRUE(b.has_value()) << i;
    EXPECT_TRUE(std::equal(data[i].begin(), data[i].end(), b->payload().begin(), b->payload().end()));
  }
}

// PosixIo's batched fsyncs (io_uring, or the loop where a ring cannot be set up): one Status per
// element in order; a bad descriptor or directory fails only its own element.
TEST(PosixIoBatch, FsyncManyAndFsyncDirsReportPerElement) {
  testing::ScratchDir dir("fsyncmany");
  auto& io = PosixIo::instance();
  std::vector<int> fds;
  for (int i = 0; i < 70; ++i) {  // more than one ring's worth (64)
    auto fd = io.open(dir.sub("f" + std::to_string(i)), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_TRUE(fd.ok()) << fd.status().to_string();
    auto data = testing::make_payload(i, 4096);
    ASSERT_TRUE(write_fully(io, *fd, data, 0, "f").ok());
    fds.push_back(*fd);
  }
  std::vector<int> with_bad = fds;
  with_bad[5] = 1 << 29;  // not an open descriptor
  auto res = io.fsync_many(with_bad);
  ASSERT_EQ(res.size(), with_bad.size());
  for (size_t i = 0; i < res.size(); ++i) EXPECT_EQ(res[i].ok(), i != 5) << i << ": " << res[i].to_string();
  EXPECT_NE(res[5].message().find("fsync"), std::string::npos) << res[5].to_string();
  for (int fd : fds) ASSERT_TRUE(io.close(fd).ok());
  std::vector<std::string> dirs = {dir.str(), dir.sub("missing"), dir.str()};
  auto dres = io.fsync_dirs(dirs);
  ASSERT_EQ(dres.size(), 3u);
  EXPECT_TRUE(dres[0].ok()) << dres[0].to_string();
  EXPECT_EQ(dres[1].code(), StatusCode::kNotFound) << dres[1].to_string();
  EXPECT_TRUE(dres[2].ok()) << dres[2].to_string();
}

}  // namespace
}  // namespace ds41::kvcache
