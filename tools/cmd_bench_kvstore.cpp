// ds41 bench kvstore: the two-class KV store against the disk it runs on. Measures, in one run:
// raw sequential write/read bandwidth of a plain file on the same directory (the roofline),
// persistent-tier write/read bandwidth with 128-token global blocks of the released model's size
// (890 B/token x 128 = 113,920 B), the restore time of a 128K-token prefix (lookup + verified
// reads, cold and warm page cache), SWA snapshot put/get latency (p50/p99) for the embedded DRAM
// pool and for Redis (two local redis-server nodes it starts itself), and optionally the index
// rebuild time for N blocks (--index-blocks 1000000). Prints JSON with --json.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "bench_header.h"
#include "cli_registry.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "kvcache/dram_swa_pool.h"
#include "kvcache/kv_store.h"
#include "kvcache/posix_io.h"
#include "kvcache/redis_swa_pool.h"
#include "load_progress.h"

namespace ds41 {
namespace {
namespace cmd_bench_kvstore {  // one name per file: the unity build of tools/ (CMakeLists.txt)

using namespace ds41::kvcache;  // the tier this command drives

using Clk = std::chrono::steady_clock;
double secs_since(Clk::time_point t0) { return std::chrono::duration<double>(Clk::now() - t0).count(); }

struct Options {
  std::string dir;
  size_t blocks = 1024;  // 1024 x 128 tokens = the 128K-token prefix
  size_t block_bytes = 890 * 128;
  int write_threads = 8;
  size_t write_batch = 32;
  int read_threads = 8;
  bool no_sync = false;
  size_t swa_bytes = 2700000;  // ~2.7 MB SWA snapshot (issue 4)
  int swa_iters = 200;
  std::string redis_nodes;  // existing nodes "h:p,h:p"; empty = start two local ones
  bool no_redis = false;
  size_t index_blocks = 0;
  bool keep = false;
  bool json = false;
  int repeats = 5;
  int scan_threads = 0;
};

void drop_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_cache_tree(const std::string& dir) {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec)) drop_cache(it->path().string());
}

// Raw sequential I/O of `bytes` to a new file in `dir`: 1 MiB writes, one fsync; then a cold
// read. The file is left in place (removed with the bench directory at the end): deleting inside
// the run would put the filesystem's block freeing (and discards, on `discard` mounts) into the
// next timed window.
Result<std::pair<double, double>> raw_sequential(const std::string& dir, uint64_t bytes) {
  static int seq = 0;
  std::string path = dir + "/raw_sequential." + std::to_string(seq++) + ".bin";
  std::vector<uint8_t> buf(1 << 20, 0x5a);
  ::sync();  // start from a settled disk, as the store measurement does
  auto t0 = Clk::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return io_error("raw: open " + path + ": " + std::strerror(errno));
  for (uint64_t off = 0; off < bytes; off += buf.size()) {
    size_t n = std::min<uint64_t>(buf.size(), bytes - off);
    if (::pwrite(fd, buf.data(), n, off) != static_cast<ssize_t>(n)) {
      ::close(fd);
      return io_error("raw: write failed");
    }
  }
  fsync(fd);
  ::close(fd);
  double w = secs_since(t0);
  drop_cache(path);
  t0 = Clk::now();
  fd = ::open(path.c_str(), O_RDONLY);
  for (uint64_t off = 0; off < bytes; off += buf.size())
    if (::pread(fd, buf.data(), buf.size(), off) <= 0) break;
  ::close(fd);
  double r = secs_since(t0);
  return std::make_pair(bytes / w / 1e6, bytes / r / 1e6);
}

// FileIo decorator that sums the wall time threads spend in each call kind (the write/read path
// breakdown the JSON reports: where a block's publish time goes).
class TimingIo final : public ForwardingIo {
 public:
  explicit TimingIo(FileIo& base) : ForwardingIo(base) {}
  enum Op {
    kOpen,
    kWrite,
    kWriteback,
    kFsync,
    kClose,
    kRename,
    kDirFsync,
    kRead,
    kStat,
    kTimes,
    kAdvise,
    kFsyncMany,
    kFsyncDirs,
    kN
  };
  nlohmann::json report() const {
    static const char* names[kN] = {"open",
                                    "pwrite",
                                    "start_writeback",
                                    "fsync",
                                    "close",
                                    "rename",
                                    "fsync_dir",
                                    "pread",
                                    "stat",
                                    "set_times",
                                    "advise_willneed",
                                    "fsync_many (batches)",
                                    "fsync_dirs (batches)"};
    nlohmann::json j;
    for (int i = 0; i < kN; ++i)
      if (count_[i].load()) j[names[i]] = {{"calls", count_[i].load()}, {"thread_ms", ns_[i].load() / 1e6}};
    return j;
  }
  void reset() {
    for (int i = 0; i < kN; ++i) count_[i] = ns_[i] = 0;
  }

 private:
  template <typename F>
  auto timed(Op op, F&& f) {
    auto t0 = Clk::now();
    auto r = f();
    ns_[op].fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(Clk::now() - t0).count());
    count_[op].fetch_add(1);
    return r;
  }

 public:
  Result<int> open(const std::string& p, int f, int m) override {
    return timed(kOpen, [&] { return base_.open(p, f, m); });
  }
  Result<size_t> pwrite(int fd, const void* b, size_t n, uint64_t o) override {
    return timed(kWrite, [&] { return base_.pwrite(fd, b, n, o); });
  }
  Result<size_t> pread(int fd, void* b, size_t n, uint64_t o) override {
    return timed(kRead, [&] { return base_.pread(fd, b, n, o); });
  }
  Status fsync(int fd) override {
    return timed(kFsync, [&] { return base_.fsync(fd); });
  }
  Status start_writeback(int fd) override {
    return timed(kWriteback, [&] { return base_.start_writeback(fd); });
  }
  Status advise_willneed(int fd) override {
    return timed(kAdvise, [&] { return base_.advise_willneed(fd); });
  }
  Status close(int fd) override {
    return timed(kClose, [&] { return base_.close(fd); });
  }
  Result<FileStat> fstat(int fd) override {
    return timed(kStat, [&] { return base_.fstat(fd); });
  }
  Result<FileStat> stat(const std::string& p) override {
    return timed(kStat, [&] { return base_.stat(p); });
  }
  Status rename(const std::string& a, const std::string& b) override {
    return timed(kRename, [&] { return base_.rename(a, b); });
  }
  Status fsync_dir(const std::string& d) override {
    return timed(kDirFsync, [&] { return base_.fsync_dir(d); });
  }
  std::vector<Status> fsync_many(std::span<const int> fds) override {
    return timed(kFsyncMany, [&] { return base_.fsync_many(fds); });
  }
  std::vector<Status> fsync_dirs(std::span<const std::string> dirs) override {
    return timed(kFsyncDirs, [&] { return base_.fsync_dirs(dirs); });
  }
  Status set_times_fd(int fd, int64_t a, int64_t m) override {
    return timed(kTimes, [&] { return base_.set_times_fd(fd, a, m); });
  }
  Status set_times(const std::string& p, int64_t a, int64_t m) override {
    return timed(kTimes, [&] { return base_.set_times(p, a, m); });
  }

 private:
  std::atomic<uint64_t> ns_[kN] = {};
  std::atomic<uint64_t> count_[kN] = {};
};

nlohmann::json percentiles_us(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    return v.empty() ? 0.0 : v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
  };
  return {{"p50_us", at(0.50) * 1e6},
          {"p99_us", at(0.99) * 1e6},
          {"max_us", v.empty() ? 0.0 : v.back() * 1e6},
          {"n", v.size()}};
}

// put_swa/get_swa through KvStore: includes the header + XXH3 checksum wrap and verification.
nlohmann::json swa_latency(KvStore& s, const Options& o) {
  std::vector<uint8_t> snap(o.swa_bytes);
  std::mt19937_64 rng(3);
  for (auto& b : snap) b = static_cast<uint8_t>(rng());
  std::vector<double> put_s, get_s;
  int misses = 0;
  for (int i = 0; i < o.swa_iters; ++i) {
    BlockKey k{0x5a5a, static_cast<uint64_t>(i)};
    auto t0 = Clk::now();
    Status st = s.put_swa_key(k, 131072, snap);
    put_s.push_back(secs_since(t0));
    if (!st.ok()) ++misses;
    t0 = Clk::now();
    auto got = s.get_swa_key(k);
    get_s.push_back(secs_since(t0));
    if (!got) ++misses;
  }
  for (int i = 0; i < o.swa_iters; ++i) (void)s.swa().erase(BlockKey{0x5a5a, static_cast<uint64_t>(i)});
  return {{"backend", s.swa().backend_name()},
          {"value_bytes", o.swa_bytes},
          {"put", percentiles_us(put_s)},
          {"get", percentiles_us(get_s)},
          {"failures", misses}};
}

struct LocalRedis {
  pid_t pid = -1;
  int port = 0;
  ~LocalRedis() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

bool start_local_redis(LocalRedis* r, int port) {
  pid_t parent = getpid();
  r->port = port;
  r->pid = fork();
  if (r->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    int devnull = ::open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    std::string p = std::to_string(port);
    execlp("redis-server", "redis-server", "--port", p.c_str(), "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no", "--daemonize", "no", "--dir", "/tmp", static_cast<char*>(nullptr));
    _exit(127);
  }
  return r->pid > 0;
}

// The only directory the benchmark writes into: a fresh `ds41-bench-kvstore.XXXXXX` that it
// creates (mkdtemp) inside --dir, removed with everything in it on destruction unless --keep.
// --dir itself is created when missing (and then removed again if it is empty at the end);
// whatever else is in --dir is never touched (issue 9: the benchmark used to delete --dir).
class BenchDir {
 public:
  static Result<std::unique_ptr<BenchDir>> create(const std::string& parent, bool keep) {
    std::unique_ptr<BenchDir> d(new BenchDir);
    d->parent_ = parent;
    d->keep_ = keep;
    std::error_code ec;
    d->created_parent_ = std::filesystem::create_directories(parent, ec);
    if (ec) return io_error("cannot create --dir " + parent + ": " + ec.message());
    std::string tmpl = parent + "/ds41-bench-kvstore.XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr)
      return io_error("cannot create a benchmark directory in " + parent + ": " + std::strerror(errno));
    d->path_ = tmpl;
    return d;
  }
  ~BenchDir() {
    if (keep_) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    if (created_parent_) std::filesystem::remove(parent_, ec);  // only when empty
  }
  BenchDir(const BenchDir&) = delete;
  BenchDir& operator=(const BenchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  BenchDir() = default;
  std::string parent_, path_;
  bool created_parent_ = false;
  bool keep_ = false;
};

int run(const Options& o0) {
  Options o = o0;
  auto bench_dir = BenchDir::create(o.dir.empty() ? std::string("/tmp") : o.dir, o.keep);
  if (!bench_dir.ok()) {
    std::fprintf(stderr, "ds41 bench kvstore: %s\n", bench_dir.status().to_string().c_str());
    return 1;
  }
  o.dir = (*bench_dir)->path();
  std::error_code ec;
  struct statfs sf {};
  statfs(o.dir.c_str(), &sf);
  char fstype[32];
  std::snprintf(fstype, sizeof(fstype), "0x%lx", static_cast<unsigned long>(sf.f_type));
  nlohmann::json out = cli::bench_header<nlohmann::json>(
      "kvstore", {{"dir", o.dir}, {"fs_type", fstype}, {"host_memory_bytes", host_memory_bytes()}}, {});
  out["config"] = {{"blocks", o.blocks},
                   {"block_tokens", 128},
                   {"block_bytes", o.block_bytes},
                   {"write_threads", o.write_threads},
                   {"write_batch", o.write_batch},
                   {"read_threads", o.read_threads},
                   {"sync", !o.no_sync},
                   {"swa_bytes", o.swa_bytes},
                   {"swa_iters", o.swa_iters},
                   {"index_blocks", o.index_blocks},
                   {"repeats", o.repeats}};
  const uint64_t total = static_cast<uint64_t>(o.blocks) * o.block_bytes;

  // Payloads and the token chain (same for every repetition).
  std::mt19937_64 rng(11);
  std::vector<int32_t> tokens(o.blocks * 128);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 129280);
  std::vector<std::vector<uint8_t>> payloads(std::min<size_t>(o.blocks, 16));
  for (auto& p : payloads) {
    p.resize(o.block_bytes);
    for (auto& b : p) b = static_cast<uint8_t>(rng());
  }

  MetricsRegistry metrics;
  KvStoreConfig c;
  c.model_identity = "ds41-bench";
  c.model_fingerprint = 1;
  c.disk.dir = o.dir + "/store";
  c.disk.capacity_bytes = total * 2 + (64 << 20);
  c.disk.sync = !o.no_sync;
  c.writer.threads = o.write_threads;
  c.writer.max_batch = o.write_batch;
  c.dram.capacity_bytes = std::max<uint64_t>(o.swa_bytes * 4 + (1 << 20), 64 << 20);

  // Each repetition, on the same directory: 1. the roofline (raw sequential write + cold read of
  // one file), 2. the persistent tier writing the whole chain through the async writer into an
  // empty store, 3. the 128K-token restore (lookup + verified reads), cold then warm.
  // Ratios are taken within a repetition; the reported figures are the medians over repetitions.
  nlohmann::json runs = nlohmann::json::array();
  std::vector<double> w_ratio, r_ratio, raw_w, raw_r, st_w, st_r, cold_ms, warm_ms, lookup_ms;
  size_t restored = 0, wrong = 0, found_blocks = 0, found_tokens = 0;
  uint64_t write_errors = 0;
  std::unique_ptr<KvStore> swa_store;  // the last repetition's store also serves the SWA bench
  TimingIo timing(PosixIo::instance());
  // Progress on stderr over the repetitions, the SWA pools and the index rebuild, updated between
  // the timed phases only; plain lines off a terminal, nothing with -q.
  const uint64_t steps = static_cast<uint64_t>(o.repeats) + 1 + (o.index_blocks > 0 ? 1 : 0);
  uint64_t steps_done = 0;
  cli::LoadProgress progress(stderr, cli::LoadProgress::mode_for_stderr(), "ds41 bench kvstore", "steps");
  progress.update(0, steps);
  for (int rep = 0; rep < o.repeats; ++rep) {
    auto raw = raw_sequential(o.dir, total);
    if (!raw.ok()) {
      std::fprintf(stderr, "ds41 bench kvstore: %s\n", raw.status().to_string().c_str());
      return 1;
    }
    swa_store.reset();
    // A fresh store directory per repetition; earlier ones stay until the end (see raw_sequential).
    c.disk.dir = o.dir + "/store." + std::to_string(rep);
    std::filesystem::remove_all(c.disk.dir, ec);
    timing.reset();
    auto store_r = KvStore::open(c, timing, SystemClock::instance(), metrics);
    if (!store_r.ok()) {
      std::fprintf(stderr, "ds41 bench kvstore: %s\n", store_r.status().to_string().c_str());
      return 1;
    }
    auto& store = **store_r;
    // Settle the previous repetition's deletions and the new layout (256 directories) before
    // timing: otherwise their journal traffic lands inside the store's write window only.
    ::sync();
    timing.reset();
    auto keys = store.hasher().chain_keys(tokens);
    const uint64_t err0 = metrics.counter_value("ds41_kv_write_completed_total", {{"result", "error"}});
    auto t0 = Clk::now();
    for (size_t i = 0; i < keys.size(); ++i) {
      Status s = store.write_block(keys[i], 128, payloads[i % payloads.size()], SubmitMode::kBlock);
      if (!s.ok()) {
        std::fprintf(stderr, "ds41 bench kvstore: write: %s\n", s.to_string().c_str());
        return 1;
      }
    }
    store.writer().drain();
    const double write_s = secs_since(t0);
    write_errors += metrics.counter_value("ds41_kv_write_completed_total", {{"result", "error"}}) - err0;
    nlohmann::json write_breakdown = timing.report();

    drop_cache_tree(c.disk.dir);
    timing.reset();
    ThreadPool pool(o.read_threads);
    t0 = Clk::now();
    auto lk = store.lookup(tokens);
    const double lookup_s = secs_since(t0);
    auto blocks = store.restore(lk.block_keys, &pool);
    const double cold_s = secs_since(t0);
    nlohmann::json read_breakdown = timing.report();
    size_t rep_wrong = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const auto& want = payloads[i % payloads.size()];
      if (!std::equal(want.begin(), want.end(), blocks[i].payload().begin(), blocks[i].payload().end()))
        ++rep_wrong;
    }
    const size_t rep_restored = blocks.size();
    blocks.clear();
    t0 = Clk::now();
    auto lk2 = store.lookup(tokens);
    auto warm = store.restore(lk2.block_keys, &pool);
    const double warm_s = secs_since(t0);
    if (warm.size() != rep_restored) rep_wrong += rep_restored > warm.size() ? rep_restored - warm.size() : 0;
    warm.clear();

    // The disk's speed drifts within seconds on shared/virtual disks: the roofline of this
    // repetition is the mean of the raw measurement before and after it.
    auto raw_after = raw_sequential(o.dir, total);
    if (!raw_after.ok()) {
      std::fprintf(stderr, "ds41 bench kvstore: %s\n", raw_after.status().to_string().c_str());
      return 1;
    }
    const double roof_w = 0.5 * (raw->first + raw_after->first);
    const double roof_r = 0.5 * (raw->second + raw_after->second);
    const double sw = total / write_s / 1e6, sr = total / cold_s / 1e6;
    raw_w.push_back(roof_w);
    raw_r.push_back(roof_r);
    st_w.push_back(sw);
    st_r.push_back(sr);
    w_ratio.push_back(sw / roof_w);
    r_ratio.push_back(sr / roof_r);
    cold_ms.push_back(cold_s * 1e3);
    warm_ms.push_back(warm_s * 1e3);
    lookup_ms.push_back(lookup_s * 1e3);
    wrong += rep_wrong;
    restored = rep == 0 ? rep_restored : std::min(restored, rep_restored);
    found_blocks = lk.cached_blocks;
    found_tokens = lk.cached_tokens;
    runs.push_back({{"raw_seq_write_MBps", roof_w},
                    {"raw_seq_read_MBps", roof_r},
                    {"raw_before_after_write_MBps", {raw->first, raw_after->first}},
                    {"raw_before_after_read_MBps", {raw->second, raw_after->second}},
                    {"store_write_MBps", sw},
                    {"store_read_cold_MBps", sr},
                    {"write_ratio_vs_raw", sw / roof_w},
                    {"read_ratio_vs_raw", sr / roof_r},
                    {"restore_cold_ms", cold_s * 1e3},
                    {"restore_warm_ms", warm_s * 1e3},
                    {"write_thread_ms_by_call", write_breakdown},
                    {"cold_read_thread_ms_by_call", read_breakdown}});
    swa_store = std::move(*store_r);
    progress.update(++steps_done, steps);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  KvStore& store = *swa_store;
  const double cold_s = median(cold_ms) / 1e3, warm_s = median(warm_ms) / 1e3;
  out["persistent_tier"] = {
      {"raw_seq_write_MBps", median(raw_w)},
      {"raw_seq_read_MBps", median(raw_r)},
      {"store_write_MBps", median(st_w)},
      {"store_read_cold_MBps", median(st_r)},
      {"write_ratio_vs_raw", median(w_ratio)},
      {"read_ratio_vs_raw", median(r_ratio)},
      {"target_ratio", 0.7},
      {"repeats", o.repeats},
      {"runs", runs},
      {"write_errors", write_errors},
      {"note",
       "medians over repeats of same-repetition ratios; each repetition's raw figure is the mean of "
       "a raw measurement just before and just after it. store write = one file per block through the "
       "async writer; each writer batch (<= 32 blocks) writes every temp file and starts its writeback, "
       "then fsync + rename each, then one fsync per block directory, then acknowledges. raw = one file, "
       "1 MiB writes, one fsync. cold read = lookup + verified parallel reads with read-ahead after "
       "dropping the block files from the page cache; raw read = the same for the raw file"}};
  out["restore_prefix"] = {{"tokens", found_tokens},         {"blocks_found", found_blocks},
                           {"blocks_restored", restored},    {"wrong_blocks", wrong},
                           {"lookup_ms", median(lookup_ms)}, {"cold_ms", cold_s * 1e3},
                           {"warm_ms", warm_s * 1e3}};
  // 4. SWA pools.
  nlohmann::json swa = nlohmann::json::array();
  swa.push_back(swa_latency(store, o));
  if (!o.no_redis) {
    std::vector<std::unique_ptr<LocalRedis>> local;
    RedisSwaPoolConfig rc;
    if (!o.redis_nodes.empty()) {
      size_t pos = 0;
      while (pos != std::string::npos) {
        size_t e = o.redis_nodes.find(',', pos);
        rc.nodes.push_back(o.redis_nodes.substr(pos, e == std::string::npos ? e : e - pos));
        pos = e == std::string::npos ? e : e + 1;
      }
    } else {
      for (int i = 0; i < 2; ++i) {
        auto r = std::make_unique<LocalRedis>();
        int port = 20000 + static_cast<int>((getpid() * 2 + i) % 30000);
        if (start_local_redis(r.get(), port)) rc.nodes.push_back("127.0.0.1:" + std::to_string(port));
        local.push_back(std::move(r));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    rc.timeout_ms = 2000;
    auto pool_r = RedisSwaPool::create(rc, SystemClock::instance(), metrics);
    if (pool_r.ok()) {
      // Wait for the nodes to answer (a fresh redis-server needs a moment).
      for (int i = 0; i < 50 && !(*pool_r)->put(BlockKey{1, 1}, std::vector<uint8_t>(1)).ok(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      KvStoreConfig rcfg = c;
      rcfg.swa_backend = SwaBackend::kRedis;
      rcfg.redis = rc;
      auto rs = KvStore::open_with_pool(rcfg, PosixIo::instance(), SystemClock::instance(), metrics,
                                        std::move(*pool_r));
      if (rs.ok()) {
        auto j = swa_latency(**rs, o);
        j["nodes"] = rc.nodes;
        swa.push_back(j);
      }
    } else {
      swa.push_back({{"backend", "redis"}, {"error", pool_r.status().to_string()}});
    }
  }
  out["swa_pool"] = swa;
  progress.update(++steps_done, steps);

  // 5. Index rebuild with many blocks (tiny payloads: the scan cost is per file, not per byte).
  if (o.index_blocks > 0) {
    DiskTierConfig ic;
    ic.dir = o.dir + "/index";
    ic.capacity_bytes = 1ULL << 50;
    ic.sync = false;
    ic.scan_threads = o.scan_threads;
    MetricsRegistry im;
    std::filesystem::remove_all(ic.dir, ec);
    {
      auto t = DiskTier::open(ic, PosixIo::instance(), SystemClock::instance(), im);
      if (!t.ok()) return 1;
      std::vector<uint8_t> tiny(64, 1);
      auto tp0 = Clk::now();
      std::atomic<size_t> next{0};
      std::vector<std::thread> ts;
      for (int w = 0; w < 4; ++w)
        ts.emplace_back([&] {
          for (size_t i; (i = next.fetch_add(1)) < o.index_blocks;) (void)(*t)->put(BlockKey{i, ~i}, 1, tiny);
        });
      for (auto& th : ts) th.join();
      out["index_rebuild"]["populate_s"] = secs_since(tp0);
    }
    // Warm: directory entries and inodes are cached after populating. Cold: after dropping the
    // whole page/dentry/inode cache, when this process may (root on the bench machine).
    auto t1 = Clk::now();
    auto t = DiskTier::open(ic, PosixIo::instance(), SystemClock::instance(), im);
    double open_s = secs_since(t1);
    out["index_rebuild"]["blocks"] = t.ok() ? (*t)->block_count() : 0;
    out["index_rebuild"]["open_ms"] = open_s * 1e3;
    out["index_rebuild"]["scan_threads"] = ic.scan_threads;
    out["index_rebuild"]["page_cache"] = "warm (directory entries and inodes cached after populate)";
    t = io_error("closed before the cold measurement");
    sync();
    bool dropped = false;
    if (FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w")) {
      dropped = std::fputs("3\n", f) >= 0;
      dropped = (std::fclose(f) == 0) && dropped;
    }
    out["index_rebuild"]["cold_cache_dropped"] = dropped;
    if (dropped) {
      t1 = Clk::now();
      auto tc = DiskTier::open(ic, PosixIo::instance(), SystemClock::instance(), im);
      out["index_rebuild"]["cold_open_ms"] = secs_since(t1) * 1e3;
      out["index_rebuild"]["cold_blocks"] = tc.ok() ? (*tc)->block_count() : 0;
    }
    progress.update(++steps_done, steps);
  }

  // Where the store is: kept (open it with `ds41 kv stats`) or removed.
  if (o.keep)
    std::fprintf(stderr, "ds41 bench kvstore: kept %s; its last store: ds41 kv stats --kv-dir %s\n",
                 o.dir.c_str(), c.disk.dir.c_str());
  else
    std::fprintf(stderr, "ds41 bench kvstore: the stores were in %s, now removed (--keep keeps them)\n",
                 o.dir.c_str());
  if (o.json) {
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    const auto& p = out["persistent_tier"];
    std::printf(
        "persistent tier: write %.0f MB/s (raw %.0f, ratio %.2f), cold read %.0f MB/s (raw %.0f, ratio "
        "%.2f)\n",
        p["store_write_MBps"].get<double>(), p["raw_seq_write_MBps"].get<double>(),
        p["write_ratio_vs_raw"].get<double>(), p["store_read_cold_MBps"].get<double>(),
        p["raw_seq_read_MBps"].get<double>(), p["read_ratio_vs_raw"].get<double>());
    std::printf("restore %zu tokens: cold %.1f ms, warm %.1f ms\n", found_tokens, cold_s * 1e3, warm_s * 1e3);
    for (const auto& s : swa) std::printf("swa %s\n", s.dump().c_str());
    if (out.contains("index_rebuild")) std::printf("index %s\n", out["index_rebuild"].dump().c_str());
  }
  return wrong == 0 && restored == o.blocks ? 0 : 1;
}

void setup(CLI::App& parent, int& exit_code) {
  auto opts = std::make_shared<Options>();
  CLI::App* cmd =
      parent.add_subcommand("kvstore", "Persistent KV tier vs raw disk, 128K restore, SWA pool latency");
  cmd->add_option("--dir", opts->dir,
                  "Directory on the disk to measure (default /tmp); the benchmark works in a fresh "
                  "ds41-bench-kvstore.XXXXXX inside it and removes only that");
  cmd->add_option("--blocks", opts->blocks, "Global blocks to write/read (1024 = a 128K-token prefix)")
      ->check(CLI::Range(1, 10000000));
  cmd->add_option("--block-bytes", opts->block_bytes, "Payload bytes per block (890 B/token x 128)")
      ->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--write-threads", opts->write_threads, "Async writer threads")->check(CLI::Range(1, 256));
  cmd->add_option("--write-batch", opts->write_batch, "Most blocks per writer group commit")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--read-threads", opts->read_threads, "Restore reader threads")->check(CLI::Range(1, 256));
  cmd->add_flag("--no-sync", opts->no_sync, "Skip fsync on publish (not durable; for tmpfs comparisons)");
  cmd->add_option("--swa-bytes", opts->swa_bytes, "SWA snapshot size")->check(CLI::Range(1, 1 << 30));
  cmd->add_option("--swa-iters", opts->swa_iters, "SWA put/get pairs per backend")
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--redis", opts->redis_nodes,
                  "Existing Redis nodes host:port,host:port (default: start two)");
  cmd->add_flag("--no-redis", opts->no_redis, "Skip the Redis SWA pool");
  cmd->add_option("--index-blocks", opts->index_blocks, "Also time the index rebuild with this many blocks");
  cmd->add_option("--repeats", opts->repeats,
                  "Repetitions of raw I/O + store write + restore (medians reported)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--scan-threads", opts->scan_threads, "Index rebuild threads (0 = min(16, cores))")
      ->check(CLI::Range(0, 256));
  cmd->add_flag("--keep", opts->keep, "Keep the benchmark's own directory inside --dir");
  cmd->add_flag("--json", opts->json, "Print JSON");
  cmd->callback([opts, &exit_code] {
    if (opts->json) set_log_level(LogLevel::kWarn);
    exit_code = run(*opts);
  });
}

DS41_REGISTER_BENCH("kvstore", setup);

}  // namespace cmd_bench_kvstore
}  // namespace
}  // namespace ds41
