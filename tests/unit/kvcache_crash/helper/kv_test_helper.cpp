// Helper process for the kvcache crash and two-process tests (not a test itself).
//   kv_test_helper writer DIR FIRST COUNT
//     Writes blocks FIRST..FIRST+COUNT-1 through AsyncWriter (durable: fsync file + dir) and
//     prints "R" once the store is open, then "A <index>" on stdout once each block is
//     acknowledged. The parent SIGKILLs it.
//   kv_test_helper mixed DIR SEED KEYS OPS CAPACITY_BLOCKS
//     Random puts/gets over KEYS blocks under a small capacity (retention 0: constant eviction)
//     while another process does the same; exits 3 if any get returns wrong bytes.
#include "unit/kvcache_crash/helper/kv_test_helper.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "core/log.h"
#include "kvcache/async_writer.h"
#include "kvcache/disk_tier.h"
#include "kvcache/posix_io.h"

using namespace ds41;
using namespace ds41::kvcache;

namespace {

std::unique_ptr<DiskTier> open_tier(const std::string& dir, uint64_t capacity, bool sync,
                                    MetricsRegistry& m) {
  DiskTierConfig c;
  c.dir = dir;
  c.capacity_bytes = capacity;
  c.retention_ns = 0;
  c.model_fingerprint = testing::kHelperFingerprint;
  c.sync = sync;
  c.touch_interval_ns = 0;
  auto t = DiskTier::open(c, PosixIo::instance(), SystemClock::instance(), m);
  if (!t.ok()) {
    std::fprintf(stderr, "helper: %s\n", t.status().to_string().c_str());
    std::exit(2);
  }
  return std::move(*t);
}

int run_writer(const std::string& dir, uint64_t first, uint64_t count) {
  MetricsRegistry m;
  auto tier = open_tier(dir, 1ULL << 40, /*sync=*/true, m);
  AsyncWriterConfig wc;
  wc.threads = 4;
  wc.queue_blocks = 8;
  AsyncWriter w(*tier, wc, m);
  if (::write(1, "R\n", 2) != 2) return 5;  // ready: the parent picks its kill point from here
  for (uint64_t i = first; i < first + count; ++i) {
    BlockWrite bw{testing::helper_key(i), 128, testing::helper_payload(i), [i](const Status& s) {
                    if (!s.ok()) return;
                    char line[32];
                    int n = std::snprintf(line, sizeof(line), "A %llu\n", static_cast<unsigned long long>(i));
                    ssize_t r = ::write(1, line, n);  // < PIPE_BUF: atomic
                    (void)r;
                  }};
    if (!w.submit(std::move(bw), SubmitMode::kBlock, 60000).ok()) return 4;
  }
  w.drain();
  return 0;
}

int run_mixed(const std::string& dir, uint64_t seed, uint64_t keys, int ops, uint64_t capacity_blocks) {
  MetricsRegistry m;
  auto tier = open_tier(dir, capacity_blocks * (113920 + kBlockHeaderBytes), /*sync=*/false, m);
  std::mt19937_64 rng(seed);
  int hits = 0, puts = 0;
  for (int op = 0; op < ops; ++op) {
    uint64_t i = rng() % keys;
    if (rng() % 2) {
      puts += tier->put(testing::helper_key(i), 128, testing::helper_payload(i)).ok();
    } else if (auto b = tier->get(testing::helper_key(i))) {
      auto want = testing::helper_payload(i);
      if (!std::equal(want.begin(), want.end(), b->payload().begin(), b->payload().end())) {
        std::printf("CORRUPT %llu\n", static_cast<unsigned long long>(i));
        return 3;
      }
      ++hits;
    }
  }
  std::printf(
      "OK hits=%d puts=%d checksum_failures=%llu evictions=%llu\n", hits, puts,
      static_cast<unsigned long long>(m.counter_value("ds41_kv_disk_checksum_failures_total")),
      static_cast<unsigned long long>(m.counter_value("ds41_kv_disk_evictions_total", {{"reason", "lru"}})));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
  set_log_level(LogLevel::kError);
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "writer" && argc == 5) return run_writer(argv[2], std::stoull(argv[3]), std::stoull(argv[4]));
  if (mode == "mixed" && argc == 7)
    return run_mixed(argv[2], std::stoull(argv[3]), std::stoull(argv[4]), std::stoi(argv[5]),
                     std::stoull(argv[6]));
  std::fprintf(stderr,
               "usage: kv_test_helper writer DIR FIRST COUNT | mixed DIR SEED KEYS OPS CAPACITY_BLOCKS\n");
  return 2;
}
