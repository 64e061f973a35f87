// End-to-end tests of `ds41 kv stats|verify|gc` through the built binary. Each store is written
// through the kvcache library (DiskTier::put) and then aged by setting file times with
// utimensat: mtime = publish time (retention), atime = last use (LRU), as
// docs/formats/kv_block.md defines. Checks: stats equals what was written; verify detects a
// flipped byte (dry run: exit 3, file kept; real run: deleted, second run clean), reports a
// block of another fingerprint as incompatible and keeps it; gc evicts only blocks past
// retention, LRU first, and warns when retained blocks alone exceed the capacity; bad flags and
// missing stores fail with messages naming the problem and create nothing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "e2e/checkpoint_cli/cli_util.h"
#include "kvcache/disk_tier.h"
#include "kvcache/posix_io.h"

namespace ds41::kvcache {
namespace {

using nlohmann::json;
using testing_cli::run_ds41;
using testing_cli::RunResult;

constexpr int64_t kHourNs = 3600LL * 1'000'000'000LL;
constexpr uint64_t kFingerprint = 42;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void set_times(const std::string& path, int64_t atime_ns, int64_t mtime_ns) {
  struct timespec ts[2];
  ts[0].tv_sec = atime_ns / 1'000'000'000LL;
  ts[0].tv_nsec = atime_ns % 1'000'000'000LL;
  ts[1].tv_sec = mtime_ns / 1'000'000'000LL;
  ts[1].tv_nsec = mtime_ns % 1'000'000'000LL;
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), ts, 0), 0) << path;
}

json parse_json(const RunResult& r) {
  json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "stdout is not JSON:\n" << r.out << "\nstderr:\n" << r.err;
  return j;
}

std::string dump(const RunResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\nstdout:\n" + r.out + "\nstderr:\n" + r.err;
}

class KvCliTest : public ::testing::Test {
 protected:
  // n blocks; block i has a payload of 2000 + 97 i bytes.
  static size_t payload_size(int i) { return 2000 + 97 * static_cast<size_t>(i); }
  static uint64_t file_bytes(int i) { return kBlockHeaderBytes + payload_size(i); }
  static BlockKey key(int i) {
    return BlockKey{0xabc000ULL + static_cast<uint64_t>(i) * 0x1000193ULL, 77ULL + i};
  }
  static std::vector<uint8_t> payload(int i) {
    std::vector<uint8_t> v(payload_size(i));
    for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<uint8_t>(j * 31 + i * 7);
    return v;
  }

  void SetUp() override {
    root_ = testing_cli::fresh_dir(std::string("kvcli_") +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    dir_ = root_ + "/store";
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  std::string path(int i) const {
    std::string h = key(i).hex();
    return dir_ + "/blocks/" + h.substr(0, 2) + "/" + h + ".kvb";
  }

  // Writes blocks [from, to) through the library with the given model fingerprint.
  void write_blocks(int from, int to, uint64_t fingerprint = kFingerprint) {
    DiskTierConfig c;
    c.dir = dir_;
    c.capacity_bytes = 1ULL << 40;
    c.model_fingerprint = fingerprint;
    c.sync = false;
    MetricsRegistry m;
    auto t = DiskTier::open(c, PosixIo::instance(), SystemClock::instance(), m);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    for (int i = from; i < to; ++i) ASSERT_TRUE((*t)->put(key(i), 128, payload(i)).ok()) << i;
  }

  // Ages block i: published `age_h` hours ago, last used `idle_h` hours ago.
  void age(int i, double age_h, double idle_h) {
    int64_t now = now_ns();
    set_times(path(i), now - static_cast<int64_t>(idle_h * kHourNs),
              now - static_cast<int64_t>(age_h * kHourNs));
  }

  std::string kv(const std::string& sub, const std::string& extra = "") {
    return "kv " + sub + " --kv-dir '" + dir_ + "' " + extra;
  }

  std::string root_, dir_;
};

TEST_F(KvCliTest, StatsReportsWhatWasWritten) {
  write_blocks(0, 12);
  // Blocks 0..4 are 100-104 h old (past the default 72 h retention); 5..11 are fresh.
  uint64_t total = 0, old_bytes = 0;
  for (int i = 0; i < 12; ++i) total += file_bytes(i);
  for (int i = 0; i < 5; ++i) {
    age(i, 100 + i, 90 - i);
    old_bytes += file_bytes(i);
  }
  const uint64_t cap = 1000000;
  RunResult r = run_ds41(kv("stats", "--kv-disk-capacity " + std::to_string(cap) + " --json"));
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  json j = parse_json(r);
  EXPECT_EQ(j["blocks"].get<uint64_t>(), 12u);
  EXPECT_EQ(j["bytes"].get<uint64_t>(), total);
  EXPECT_EQ(j["retained_blocks"].get<uint64_t>(), 7u);
  EXPECT_EQ(j["retained_bytes"].get<uint64_t>(), total - old_bytes);
  EXPECT_EQ(j["evictable_blocks"].get<uint64_t>(), 5u);
  EXPECT_EQ(j["evictable_bytes"].get<uint64_t>(), old_bytes);
  EXPECT_NEAR(j["oldest_block_age_s"].get<double>(), 104 * 3600.0, 60);
  EXPECT_NEAR(j["newest_block_age_s"].get<double>(), 0, 60);
  EXPECT_NEAR(j["least_recent_use_age_s"].get<double>(), 90 * 3600.0, 60);
  EXPECT_EQ(j["capacity_bytes"].get<uint64_t>(), cap);
  EXPECT_DOUBLE_EQ(j["usage_fraction"].get<double>(), static_cast<double>(total) / cap);
  EXPECT_FALSE(j["over_capacity"].get<bool>());
  EXPECT_FALSE(j["retention_exceeds_capacity"].get<bool>());
  EXPECT_DOUBLE_EQ(j["retention_s"].get<double>(), 72 * 3600.0);
  EXPECT_GE(j["index_rebuild_ms"].get<double>(), 0.0);

  // Another retention moves the split: with 101.5 h only blocks 2..4 (102-104 h) are past it.
  r = run_ds41(kv("stats", "--kv-retention 101.5h --json"));
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  j = parse_json(r);
  EXPECT_EQ(j["evictable_blocks"].get<uint64_t>(), 3u);
  EXPECT_TRUE(j["capacity_bytes"].is_null());
  EXPECT_TRUE(j["usage_fraction"].is_null());

  // Text output: the same numbers, human readable.
  r = run_ds41(kv("stats", "--kv-disk-capacity 1M"));
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  EXPECT_NE(r.out.find("12 (" + std::to_string(total) + " bytes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("under retention  7 blocks"), std::string::npos) << r.out;
}

TEST_F(KvCliTest, StatsOnEmptyStoreAndOverCapacity) {
  write_blocks(0, 0);  // layout only
  RunResult r = run_ds41(kv("stats", "--json"));
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  json j = parse_json(r);
  EXPECT_EQ(j["blocks"].get<uint64_t>(), 0u);
  EXPECT_TRUE(j["oldest_block_age_s"].is_null());
  write_blocks(0, 3);
  r = run_ds41(kv("stats", "--kv-disk-capacity 4K --json"));
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  j = parse_json(r);
  EXPECT_TRUE(j["over_capacity"].get<bool>());
  EXPECT_TRUE(j["retention_exceeds_capacity"].get<bool>());
  EXPECT_GT(j["usage_fraction"].get<double>(), 1.0);
}

TEST_F(KvCliTest, MissingStoreIsAnErrorAndNothingIsCreated) {
  for (const char* sub : {"stats", "verify", "gc"}) {
    RunResult r = run_ds41(kv(sub, "--kv-disk-capacity 1G"));
    EXPECT_EQ(r.exit_code, 1) << sub << "\n" << dump(r);
    EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(dir_), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir_)) << sub << " created the store";
  }
  // An existing directory that is not a store (no LAYOUT marker) is left untouched.
  std::filesystem::create_directories(dir_);
  for (const char* sub : {"stats", "verify", "gc"}) {
    RunResult r = run_ds41(kv(sub, "--kv-disk-capacity 1G --json"));
    EXPECT_EQ(r.exit_code, 1) << sub << "\n" << dump(r);
    EXPECT_NE(r.err.find("no LAYOUT marker"), std::string::npos) << r.err;
    json j = parse_json(r);
    EXPECT_FALSE(j["ok"].get<bool>());
    EXPECT_TRUE(std::filesystem::is_empty(dir_)) << sub << " wrote into a non-store directory";
  }
}

TEST_F(KvCliTest, BadFlagValuesAreUsageErrorsNamingTheFlag) {
  write_blocks(0, 1);
  struct Case {
    std::string args, must_mention1, must_mention2;
  } cases[] = {
      {kv("stats", "--kv-retention '5 parsecs'"), "--kv-retention", "5 parsecs"},
      {kv("stats", "--kv-disk-capacity -3G"), "--kv-disk-capacity", "-3G"},
      {kv("stats", "--kv-disk-capacity=-3G --json"), "--kv-disk-capacity", "-3G"},
      {kv("verify", "--kv-retention -1h"), "--kv-retention", "-1h"},
      {kv("gc", "--kv-disk-capacity 12Q"), "--kv-disk-capacity", "12Q"},
      {kv("gc", "--kv-disk-capacity 0"), "--kv-disk-capacity", "> 0"},
      {kv("gc"), "--kv-disk-capacity", "required"},
      {"kv stats --json", "--kv-dir", "required"},
      {"kv verify", "--kv-dir", "required"},
      {kv("verify", "--model-fingerprint banana"), "--model-fingerprint", "banana"},
      {kv("verify", "--threads 0"), "--threads", "[1, 256]"},
  };
  for (const auto& c : cases) {
    RunResult r = run_ds41(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << dump(r);
    EXPECT_NE(r.err.find(c.must_mention1), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.must_mention2), std::string::npos) << c.args << "\n" << r.err;
  }
  // Missing --kv-dir with --json still prints a parsable error object.
  RunResult r = run_ds41("kv gc --json --kv-disk-capacity 1G");
  EXPECT_EQ(r.exit_code, 2) << dump(r);
  json j = parse_json(r);
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_NE(j["error"].get<std::string>().find("--kv-dir"), std::string::npos) << r.out;
}

// Parser-level usage errors (no sub-command, unknown flag) also exit 2, not CLI11's own codes;
// --help exits 0.
TEST_F(KvCliTest, ParserUsageErrorsExitTwoAndHelpExitsZero) {
  struct Case {
    std::string args, must_mention;
  } cases[] = {
      {"kv", "subcommand"},
      {kv("stats", "--no-such-flag"), "--no-such-flag"},
      {"kv frobnicate", "subcommand"},
  };
  for (const auto& c : cases) {
    RunResult r = run_ds41(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << dump(r);
    EXPECT_NE((r.err + r.out).find(c.must_mention), std::string::npos) << c.args << "\n" << dump(r);
  }
  RunResult h = run_ds41("kv gc --help");
  EXPECT_EQ(h.exit_code, 0) << dump(h);
  EXPECT_NE(h.out.find("--dry-run"), std::string::npos) << dump(h);
}

TEST_F(KvCliTest, VerifyDetectsAFlippedByteDryRunKeepsItRealRunDeletesIt) {
  write_blocks(0, 10);
  const std::string victim = path(6);
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(kBlockHeaderBytes + 500);
    char c;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x01);
    f.seekp(kBlockHeaderBytes + 500);
    f.write(&c, 1);
  }
  RunResult r = run_ds41(kv("verify", "--dry-run --json --threads 3"));
  ASSERT_EQ(r.exit_code, 3) << dump(r);
  json j = parse_json(r);
  EXPECT_EQ(j["checked"].get<int>(), 10);
  EXPECT_EQ(j["ok_blocks"].get<int>(), 9);
  EXPECT_EQ(j["corrupt"].get<int>(), 1);
  EXPECT_EQ(j["corrupt_deleted"].get<int>(), 0);
  ASSERT_EQ(j["corrupt_blocks"].size(), 1u);
  EXPECT_EQ(j["corrupt_blocks"][0]["key"].get<std::string>(), key(6).hex());
  EXPECT_NE(j["corrupt_blocks"][0]["reason"].get<std::string>().find("checksum"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(victim)) << "dry run deleted the corrupt block";
  EXPECT_NE(r.err.find("dry run"), std::string::npos) << r.err;

  r = run_ds41(kv("verify", "--json"));
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  j = parse_json(r);
  EXPECT_EQ(j["corrupt"].get<int>(), 1);
  EXPECT_EQ(j["corrupt_deleted"].get<int>(), 1);
  EXPECT_FALSE(std::filesystem::exists(victim)) << "verify kept the corrupt block";
  for (int i = 0; i < 10; ++i) {
    if (i == 6) continue;
    EXPECT_TRUE(std::filesystem::exists(path(i))) << i;
  }

  r = run_ds41(kv("verify"));  // text mode
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  EXPECT_NE(r.out.find("9 blocks checked"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("corrupt       0"), std::string::npos) << r.out;
}

TEST_F(KvCliTest, VerifyReportsOtherFingerprintAsIncompatibleAndKeepsIt) {
  write_blocks(0, 4, kFingerprint);
  write_blocks(4, 5, /*fingerprint=*/7);
  // No expectation: each block is checked against its own header.
  RunResult r = run_ds41(kv("verify", "--json"));
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  json j = parse_json(r);
  EXPECT_EQ(j["ok_blocks"].get<int>(), 5);
  EXPECT_EQ(j["incompatible"].get<int>(), 0);
  EXPECT_TRUE(j["model_fingerprint"].is_null());

  r = run_ds41(kv("verify", "--model-fingerprint 42 --json"));
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  j = parse_json(r);
  EXPECT_EQ(j["ok_blocks"].get<int>(), 4);
  EXPECT_EQ(j["incompatible"].get<int>(), 1);
  EXPECT_EQ(j["corrupt"].get<int>(), 0);
  ASSERT_EQ(j["incompatible_blocks"].size(), 1u);
  EXPECT_EQ(j["incompatible_blocks"][0]["key"].get<std::string>(), key(4).hex());
  EXPECT_EQ(j["incompatible_blocks"][0]["model_fingerprint"].get<uint64_t>(), 7u);
  EXPECT_TRUE(std::filesystem::exists(path(4)));

  r = run_ds41(kv("verify", "--model-fingerprint 0x7 --json"));
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  j = parse_json(r);
  EXPECT_EQ(j["incompatible"].get<int>(), 4);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(std::filesystem::exists(path(i))) << i;
}

TEST_F(KvCliTest, GcEvictsOnlyBlocksPastRetentionLruFirst) {
  write_blocks(0, 12);
  // Blocks 0..5: 100 h old (past retention), last used at distinct times. LRU order (least
  // recent first): 3, 0, 5, 1, 4, 2. Blocks 6..11: fresh, never evictable.
  const int lru_order[] = {3, 0, 5, 1, 4, 2};
  for (int rank = 0; rank < 6; ++rank) age(lru_order[rank], 100, 90 - 10 * rank);
  uint64_t young = 0, total = 0;
  for (int i = 0; i < 12; ++i) total += file_bytes(i);
  for (int i = 6; i < 12; ++i) young += file_bytes(i);
  // Room for the young blocks plus the two most recently used old ones (4 and 2).
  const uint64_t cap = young + file_bytes(4) + file_bytes(2);
  const std::vector<int> want = {3, 0, 5, 1};
  uint64_t want_bytes = 0;
  for (int i : want) want_bytes += file_bytes(i);

  RunResult r = run_ds41(kv("gc", "--kv-disk-capacity " + std::to_string(cap) + " --dry-run --json"));
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  json j = parse_json(r);
  EXPECT_TRUE(j["dry_run"].get<bool>());
  EXPECT_EQ(j["used_before"].get<uint64_t>(), total);
  EXPECT_EQ(j["evicted_blocks"].get<int>(), 4);
  EXPECT_EQ(j["evicted_bytes"].get<uint64_t>(), want_bytes);
  EXPECT_EQ(j["used_after"].get<uint64_t>(), cap);
  ASSERT_EQ(j["evicted"].size(), 4u);
  for (size_t n = 0; n < want.size(); ++n)
    EXPECT_EQ(j["evicted"][n]["key"].get<std::string>(), key(want[n]).hex()) << n;
  for (int i = 0; i < 12; ++i) EXPECT_TRUE(std::filesystem::exists(path(i))) << "dry run deleted " << i;

  r = run_ds41(kv("gc", "--kv-disk-capacity " + std::to_string(cap) + " --json"));
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  j = parse_json(r);
  EXPECT_FALSE(j["dry_run"].get<bool>());
  EXPECT_EQ(j["evicted_blocks"].get<int>(), 4);
  EXPECT_EQ(j["evicted_bytes"].get<uint64_t>(), want_bytes);
  EXPECT_EQ(j["used_after"].get<uint64_t>(), cap);
  EXPECT_FALSE(j["retention_exceeds_capacity"].get<bool>());
  EXPECT_TRUE(j["warning"].is_null());
  for (size_t n = 0; n < want.size(); ++n)
    EXPECT_EQ(j["evicted"][n]["key"].get<std::string>(), key(want[n]).hex()) << n;
  for (int i : want) EXPECT_FALSE(std::filesystem::exists(path(i))) << "block " << i << " not evicted";
  for (int i : {4, 2, 6, 7, 8, 9, 10, 11})
    EXPECT_TRUE(std::filesystem::exists(path(i))) << "block " << i << " evicted";

  // Stats agree with the result.
  r = run_ds41(kv("stats", "--json"));
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  EXPECT_EQ(parse_json(r)["bytes"].get<uint64_t>(), cap);
}

TEST_F(KvCliTest, GcWarnsWhenRetainedBlocksAloneExceedCapacity) {
  write_blocks(0, 8);
  for (int i = 0; i < 3; ++i) age(i, 80, 80 - i);  // 0..2 past the 72 h retention
  uint64_t young = 0;
  for (int i = 3; i < 8; ++i) young += file_bytes(i);
  const uint64_t cap = young / 2;
  RunResult r = run_ds41(kv("gc", "--kv-disk-capacity " + std::to_string(cap) + " --json"));
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  json j = parse_json(r);
  EXPECT_EQ(j["evicted_blocks"].get<int>(), 3);
  EXPECT_TRUE(j["retention_exceeds_capacity"].get<bool>());
  EXPECT_TRUE(j["over_capacity_after"].get<bool>());
  EXPECT_EQ(j["retained_bytes"].get<uint64_t>(), young);
  EXPECT_EQ(j["used_after"].get<uint64_t>(), young);
  EXPECT_TRUE(j["warning"].is_string());
  EXPECT_NE(r.err.find("warning"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("retention"), std::string::npos) << r.err;
  for (int i = 3; i < 8; ++i)
    EXPECT_TRUE(std::filesystem::exists(path(i))) << "young block " << i << " evicted";
  // A longer retention protects the 80 h old blocks too: nothing is evicted.
  write_blocks(0, 3);
  for (int i = 0; i < 3; ++i) age(i, 80, 80 - i);
  r = run_ds41(kv("gc", "--kv-disk-capacity " + std::to_string(cap) + " --kv-retention 4d"));
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  EXPECT_NE(r.out.find("evicted       0 blocks"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("warning"), std::string::npos) << r.err;
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(std::filesystem::exists(path(i))) << i;
}

}  // namespace
}  // namespace ds41::kvcache
