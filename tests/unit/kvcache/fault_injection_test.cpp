// Reliability: the persistent tier over FaultInjectingIo. Failed/short writes, ENOSPC, fsync and
// rename errors, torn and corrupted writes, failed and corrupted reads — and a seeded random mix
// of all of them. Invariant checked everywhere: a get() never returns bytes other than the ones
// put for that key; failed publishes leave neither a final file nor a temp file behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "kvcache/disk_tier.h"
#include "unit/kvcache/test_util.h"

namespace ds41 {
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
    for (auto& e : std::filesystem::directory_iterator(dir_.sub("store/tmp"))) n += e.is_regular_file();
    return n;
  }
  uint64_t counter(const std::string& n, const MetricLabels& l = {}) { return metrics_.counter_value(n, l); }

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
  std::vector<DiskTier::PutRequest> reqs;
  for (uint64_t i = 0; i < 8; ++i) data.push_back(payload(i));
  for (uint64_t i = 0; i < 8; ++i) reqs.push_back({key(i), 128, data[i]});
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
  std::vector<DiskTier::PutRequest> reqs;
  for (uint64_t i = 0; i < 6; ++i) data.push_back(payload(i));
  for (uint64_t i = 0; i < 6; ++i) reqs.push_back({key(i), 128, data[i]});
  io_.inject(FaultKind::kFailFsync, /*skip=*/2, /*times=*/1);
  auto res = tier_->put_batch(reqs);
  for (uint64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(res[i].ok(), i != 2) << i << ": " << res[i].to_string();
    EXPECT_EQ(get_checked(i), i != 2) << i;
  }
  EXPECT_EQ(temp_files(), 0u);
}

}  // namespace
}  // namespace ds41
