// ds41 bench load DIR [--json]: (1) time to open and validate a checkpoint (config.json, layer
// schedule, tensor contract, every shard header mmapped and parsed, contract check) — on the
// sparse full-size layout of `make-checkpoint --layout-only --preset v41-flash` (target < 2 s);
// (2) mmap read bandwidth of a real multi-GB file against `dd` of the same file in the same run
// (target ratio >= 0.8), measured on the loader's read path: model::prefetch_mapped() (N threads, each
// populating a contiguous slice with MADV_POPULATE_READ) followed by an N-thread checksum of the mapping.
// The older single-threaded reader (sequential + look-ahead hints) is reported beside it. Page caches are
// dropped before each cold read when possible
// (/proc/sys/vm/drop_caches, needs root) only with --drop-caches; the JSON says whether that worked. Warm
// (page-cache) numbers are reported as well. Prints JSON with the git revision and the machine
// (tools/bench_header.h).
// With --device cuda (issue 10): instead of (2), the device load of DIR (gpu::DeviceModel::load:
// pinned staging, --io-threads shards in parallel, reads overlapped with host-to-device copies)
// against a raw read of the same shard files with the same reader threads in the same run, both
// after evicting the files from the page cache (posix_fadvise DONTNEED, no root needed); JSON
// "device_load": GB/s of each and their ratio. With --load-format dummy it times the on-device
// generation instead (no disk).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "bench_header.h"
#include "cli_registry.h"
#include "core/log.h"
#include "device_flags.h"
#include "load_progress.h"
#include "model/config.h"
#include "model/layer_schedule.h"
#include "model/loader/prefetch.h"
#include "model/loader/safetensors.h"
#include "model/loader/tensor_contract.h"
#include "resource_paths.h"

#ifdef DS41_HAVE_CUDA_ENGINE
#include "gpu/device_model.h"
#include "gpu/device_weight_upload.h"
#endif

namespace ds41::cli {
namespace {
namespace cmd_bench_load {  // one name per file: the unity build of tools/ (CMakeLists.txt)

using ojson = nlohmann::ordered_json;

#ifdef MADV_POPULATE_READ
constexpr int kMadvPopulateRead = MADV_POPULATE_READ;
#else
constexpr int kMadvPopulateRead = 22;  // linux/mman.h
#endif

struct BenchLoadArgs {
  std::string dir;
  std::string file;  // existing file to read; default: create one
  double size_gib = 2.0;
  int repeats = 3;
  bool json = false;
  bool keep = false;
  int threads = 0;           // 0: min(16, hardware threads)
  bool drop_caches = false;  // drop the whole machine's page cache before cold reads (asked for)
  DeviceFlags dev;           // --device cuda: device load vs raw read (section "device_load")
  int io_threads = 4;
  std::string preset;  // dummy without config.json
  std::string tokenizer_dir;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Progress on stderr: redrawn on a terminal, plain lines otherwise, nothing with -q.
LoadProgress::Mode progress_mode() { return LoadProgress::mode_for(stderr, log_level() >= LogLevel::kError); }

bool drop_caches() {
  ::sync();
  int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::write(fd, "3\n", 2) == 2;
  ::close(fd);
  return ok;
}

// One open + validate pass; returns seconds, or the error.
Result<double> open_and_validate(const std::string& dir, size_t* tensors) {
  double t0 = now_s();
  DS41_ASSIGN_OR_RETURN(model::ModelConfig c, model::load_model_config(dir));
  DS41_ASSIGN_OR_RETURN(model::LayerSchedule s, model::derive_layer_schedule(c));
  DS41_ASSIGN_OR_RETURN(model::TensorContract k, model::derive_tensor_contract(c, s));
  DS41_ASSIGN_OR_RETURN(auto ck, model::Checkpoint::open(dir));
  DS41_RETURN_IF_ERROR(model::validate_checkpoint(*ck, k));
  *tensors = ck->tensors().size();
  return now_s() - t0;
}

// Writes size bytes of non-zero data (real blocks, not holes).
Status create_data_file(const std::string& path, uint64_t size, LoadProgress* progress) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(path + ": cannot create (" + std::strerror(errno) + ")");
  std::vector<uint64_t> buf((16u << 20) / 8);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (auto& v : buf) v = (x = x * 6364136223846793005ull + 1442695040888963407ull);
  uint64_t done = 0;
  while (done < size) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size() * 8, size - done));
    buf[0] ^= done;  // every chunk differs
    ssize_t w = ::write(fd, buf.data(), n);
    if (w <= 0) {
      ::close(fd);
      return io_error(path + ": write failed (" + std::strerror(errno) + ")");
    }
    done += static_cast<uint64_t>(w);
    progress->update(done, size);
  }
  ::fsync(fd);
  ::close(fd);
  return ok_status();
}

// Reads every byte through a read-only mapping (sums 64-bit words so nothing is optimised away).
Result<double> mmap_read(const std::string& path, uint64_t* checksum) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error(path + ": cannot open");
  struct stat st {};
  fstat(fd, &st);
  const size_t size = static_cast<size_t>(st.st_size);
  double t0 = now_s();
  void* m = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return io_error(path + ": mmap failed");
  madvise(m, size, MADV_SEQUENTIAL);
  const uint64_t* p = static_cast<const uint64_t*>(m);
  const size_t words = size / 8;
  const size_t chunk = (64u << 20) / 8;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t c = 0; c < words; c += chunk) {
    // Keep kLookahead chunks of asynchronous readahead in flight ahead of the one being summed
    // (the loader's prefetch pattern); the first call primes them all.
    constexpr size_t kLookahead = 4;
    for (size_t k = (c == 0 ? 1 : kLookahead); k <= kLookahead; ++k) {
      size_t next = c + k * chunk;
      if (next < words)
        madvise(const_cast<uint64_t*>(p + next), std::min(chunk, words - next) * 8, MADV_WILLNEED);
    }
    // Map this chunk's pages in one call instead of one fault per 4 KB page (Linux >= 5.14;
    // ignored where unsupported).
    madvise(const_cast<uint64_t*>(p + c), std::min(chunk, words - c) * 8, kMadvPopulateRead);
    const size_t end = std::min(words, c + chunk);
    size_t i = c;
    for (; i + 4 <= end; i += 4) {
      s0 += p[i];
      s1 += p[i + 1];
      s2 += p[i + 2];
      s3 += p[i + 3];
    }
    for (; i < end; ++i) s0 += p[i];
  }
  double dt = now_s() - t0;
  munmap(m, size);
  *checksum = s0 + s1 + s2 + s3;
  return dt;
}

// The loader's path: map, model::prefetch_mapped() with `threads` threads, then sum the words with
// the same number of threads (each its own contiguous slice). *prefetch_s gets the prefetch part.
Result<double> mmap_prefetch_read(const std::string& path, int threads, uint64_t* checksum,
                                  double* prefetch_s, bool* populate) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error(path + ": cannot open");
  struct stat st {};
  fstat(fd, &st);
  const size_t size = static_cast<size_t>(st.st_size);
  double t0 = now_s();
  void* m = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return io_error(path + ": mmap failed");
  model::PrefetchStats ps;
  ThreadPool prefetch_pool(threads);
  Status s = model::prefetch_mapped(m, size, prefetch_pool, &ps);
  *prefetch_s = now_s() - t0;
  if (!s.ok()) {
    munmap(m, size);
    return s.with_context(path);
  }
  *populate = ps.used_populate_read;
  const uint64_t* p = static_cast<const uint64_t*>(m);
  const size_t words = size / 8;
  const size_t t = static_cast<size_t>(std::max(1, threads));
  std::vector<uint64_t> sums(t, 0);
  std::vector<std::thread> pool;
  for (size_t k = 0; k < t; ++k) {
    pool.emplace_back([&, k] {
      const size_t b = words * k / t, e = words * (k + 1) / t;
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      size_t i = b;
      for (; i + 4 <= e; i += 4) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
      }
      for (; i < e; ++i) a0 += p[i];
      sums[k] = a0 + a1 + a2 + a3;
    });
  }
  for (auto& th : pool) th.join();
  double dt = now_s() - t0;
  munmap(m, size);
  uint64_t total = 0;
  for (uint64_t v : sums) total += v;
  *checksum = total;
  return dt;
}

// `dd if=path of=/dev/null bs=16M`, timed from outside (the same wall clock as mmap_read).
Result<double> dd_read(const std::string& path) {
  double t0 = now_s();
  int rc = std::system(("dd if='" + path + "' of=/dev/null bs=16M status=none").c_str());
  double dt = now_s() - t0;
  if (rc != 0) return io_error("dd failed on " + path);
  return dt;
}

#ifdef DS41_HAVE_CUDA_ENGINE
// Evicts a file's clean pages from the page cache (no root needed); false when it cannot.
bool evict_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
  ::close(fd);
  return ok;
}

// (3) device load vs raw read of the same files, alternated twice (best of each), caches evicted.
Result<ojson> device_load_section(const BenchLoadArgs& a) {
  DS41_ASSIGN_OR_RETURN(gpu::DeviceLoadOptions o, device_load_options(a.dev));
  o.io_threads = a.io_threads;
  o.preset = a.preset;
  o.tokenizer_dir = a.tokenizer_dir;
  if (o.tokenizer_dir.empty() && !std::filesystem::exists(std::filesystem::path(a.dir) / "tokenizer.json")) {
    auto t = default_tokenizer_dir();  // ../shared/tokenizer-v41 (Engram's compressed vocabulary)
    if (t.ok()) o.tokenizer_dir = *t;
  }
  ojson j;
  j["io_threads"] = a.io_threads;
  if (o.format == gpu::LoadFormat::kDummy) {
    double best = 1e30;
    uint64_t bytes = 0;
    std::vector<double> runs;
    for (int r = 0; r < 2; ++r) {
      const double t0 = now_s();
      auto m = gpu::DeviceModel::load(a.dir, o);
      if (!m.ok()) return m.status();
      const double dt = now_s() - t0;
      bytes = (*m)->weight_bytes();
      runs.push_back(dt);
      best = std::min(best, dt);
    }
    j["format"] = "dummy";
    j["weight_bytes"] = bytes;
    j["seconds"] = runs;
    j["generate_gb_per_s"] = static_cast<double>(bytes) / best / 1e9;
    return j;
  }
  DS41_ASSIGN_OR_RETURN(auto ck, model::Checkpoint::open(a.dir));
  std::vector<std::string> paths;
  std::vector<gpu::UploadJob> whole;
  uint64_t file_bytes = 0;
  for (const auto& f : ck->files()) {
    whole.push_back({static_cast<int>(paths.size()), 0, f->file_size(), nullptr, false});
    paths.push_back(f->path());
    file_bytes += f->file_size();
  }
  ck.reset();
  bool evicted = true;
  auto evict_all = [&] {
    for (const auto& p : paths) evicted &= evict_file(p);
  };
  std::vector<double> raw_runs, dev_runs;
  uint64_t weight_bytes = 0;
  LoadProgress progress(stderr, progress_mode(), "ds41 bench load: device load");
  for (int r = 0; r < 2; ++r) {
    evict_all();
    gpu::UploadOptions uo;
    uo.io_threads = a.io_threads;
    uo.copy = false;
    gpu::UploadStats st;
    DS41_RETURN_IF_ERROR(gpu::upload_file_ranges(paths, whole, uo, &st));
    raw_runs.push_back(st.seconds);
    evict_all();
    o.progress = [&](uint64_t d, uint64_t t) { progress.update(d, t); };
    const double t0 = now_s();
    auto m = gpu::DeviceModel::load(a.dir, o);
    if (!m.ok()) return m.status();
    dev_runs.push_back(now_s() - t0);
    weight_bytes = (*m)->weight_bytes();
  }
  const double raw = *std::min_element(raw_runs.begin(), raw_runs.end());
  const double dev = *std::min_element(dev_runs.begin(), dev_runs.end());
  j["format"] = "safetensors";
  j["files"] = paths.size();
  j["file_bytes"] = file_bytes;
  j["weight_bytes"] = weight_bytes;
  j["page_cache_evicted"] = evicted;
  j["raw_read_seconds"] = raw_runs;
  j["device_load_seconds"] = dev_runs;
  j["raw_read_gb_per_s"] = static_cast<double>(file_bytes) / raw / 1e9;
  // The device load reads the weights' bytes (the files less headers and unused tensors) and also
  // opens, validates and binds the checkpoint: its rate is weight bytes over the whole load.
  j["device_load_gb_per_s"] = static_cast<double>(weight_bytes) / dev / 1e9;
  j["ratio_device_over_raw"] =
      (static_cast<double>(weight_bytes) / dev) / (static_cast<double>(file_bytes) / raw);
  return j;
}
#endif

int run_bench_load(const BenchLoadArgs& a) {
  ojson out = bench_header("load", ojson::object(),
                           {{"dir", a.dir},
                            {"file", a.file},
                            {"size_gib", a.size_gib},
                            {"repeats", a.repeats},
                            {"threads", a.threads}});

  // --device cuda (asked for explicitly): section (3) replaces (2).
  auto kind = resolve_device(a.dev);
  auto format = parse_load_format(a.dev.load_format);
  if (!kind.ok() || !format.ok()) {
    std::cerr << "ds41 bench load: " << (kind.ok() ? format.status() : kind.status()).message() << "\n";
    return 2;
  }
  const bool device_section = *kind == DeviceKind::kCuda && !a.dev.device.empty();
  const bool dummy = *format == LoadFormatFlag::kDummy;

  // (1) open + validate, a few times (the first may pay for cold metadata); not for dummy weights.
  std::vector<double> times;
  size_t tensors = 0;
  for (int i = 0; i < std::max(1, a.repeats) && !(device_section && dummy); ++i) {
    auto t = open_and_validate(a.dir, &tensors);
    if (!t.ok()) {
      std::cerr << "ds41 bench load: " << t.status().message() << "\n";
      return 1;
    }
    times.push_back(*t);
  }
  double best = times.empty() ? 0.0 : *std::min_element(times.begin(), times.end());
  if (!times.empty())
    out["open_validate"] = {{"tensors", tensors},
                            {"seconds", times},
                            {"best_seconds", best},
                            {"target_seconds", 2.0},
                            {"meets_target", best < 2.0}};

  if (device_section) {
#ifdef DS41_HAVE_CUDA_ENGINE
    auto d = device_load_section(a);
    if (!d.ok()) {
      std::cerr << "ds41 bench load: " << d.status().message() << "\n";
      return 1;
    }
    out["device_load"] = *d;
    if (a.json) {
      std::cout << out.dump(2) << "\n";
    } else {
      std::printf("open + validate %s: %zu tensors, best %.3f s\n", a.dir.c_str(), tensors, best);
      std::printf("device load: %s\n", d->dump().c_str());
    }
    return 0;
#endif
  }

  // (2) mmap vs dd bandwidth on the same file.
  std::string path = a.file;
  bool created = false;
  uint64_t size = 0;
  if (path.empty()) {
    path = (std::filesystem::temp_directory_path() / ("ds41_bench_load_" + std::to_string(getpid()) + ".bin"))
               .string();
    size = static_cast<uint64_t>(a.size_gib * (1ull << 30)) / 4096 * 4096;
    LoadProgress writing(stderr, progress_mode(), "ds41 bench load: writing the test file");
    Status s = create_data_file(path, size, &writing);
    if (!s.ok()) {
      std::cerr << "ds41 bench load: " << s.message() << "\n";
      return 1;
    }
    created = true;
  } else {
    std::error_code ec;
    size = std::filesystem::file_size(path, ec);
    if (ec) {
      std::cerr << "ds41 bench load: " << path << ": " << ec.message() << "\n";
      return 1;
    }
  }
  ojson bw;
  bw["file"] = path;
  bw["bytes"] = size;
  // Dropping the page cache empties it for every process on the machine: only when asked.
  bool dropped = a.drop_caches;
  if (!a.drop_caches && log_level() < LogLevel::kError)
    std::cerr << "ds41 bench load: the page cache is not dropped, so \"cold\" reads may come from memory; "
                 "--drop-caches drops the whole machine's page cache before each cold read (needs root)\n";
  auto drop_caches = [&] { return a.drop_caches && ::ds41::cli::cmd_bench_load::drop_caches(); };
  uint64_t checksum = 0, checksum_single = 0;
  const int threads =
      a.threads > 0 ? a.threads : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  bool populate = false;
  auto gbps = [&](double s) { return s > 0 ? static_cast<double>(size) / s / 1e9 : 0.0; };
  auto fail = [&](const Status& s) {
    std::cerr << "ds41 bench load: " << s.message() << "\n";
    if (created && !a.keep) std::filesystem::remove(path);
    return 1;
  };
  // Per method: all times (s) and the best. "mmap" is the loader path (prefetch_mapped + N-thread
  // sum); "mmap_single" the single-threaded reader; "dd" is `dd bs=16M` of the same file.
  struct Times {
    std::vector<double> cold, warm, prefetch_cold, prefetch_warm;
  } dd_t, mm_t, m1_t;
  auto best_of = [](const std::vector<double>& v) {
    return v.empty() ? 1e30 : *std::min_element(v.begin(), v.end());
  };
  // Progress over the 12 passes of `size` bytes (updated between passes, never inside a timing).
  LoadProgress reading(stderr, progress_mode(), "ds41 bench load: reading (12 passes)");
  uint64_t passes_done = 0;
  auto pass_done = [&] { reading.update(++passes_done * size, 12 * size); };
  // Cold: drop caches before each read; dd, loader mmap, single-thread mmap, twice; keep the best of each.
  for (int r = 0; r < 2; ++r) {
    dropped &= drop_caches();
    auto d = dd_read(path);
    pass_done();
    if (!d.ok()) return fail(d.status());
    dd_t.cold.push_back(*d);
    dropped &= drop_caches();
    double pf = 0;
    auto m = mmap_prefetch_read(path, threads, &checksum, &pf, &populate);
    if (!m.ok()) return fail(m.status());
    pass_done();
    mm_t.cold.push_back(*m);
    mm_t.prefetch_cold.push_back(pf);
    dropped &= drop_caches();
    auto m1 = mmap_read(path, &checksum_single);
    if (!m1.ok()) return fail(m1.status());
    pass_done();
    m1_t.cold.push_back(*m1);
  }
  // Warm: all from the page cache (if the file fits in memory).
  for (int r = 0; r < 2; ++r) {
    auto d = dd_read(path);
    double pf = 0;
    auto m = mmap_prefetch_read(path, threads, &checksum, &pf, &populate);
    auto m1 = mmap_read(path, &checksum_single);
    for (int k = 0; k < 3; ++k) pass_done();
    if (d.ok()) dd_t.warm.push_back(*d);
    if (m.ok()) {
      mm_t.warm.push_back(*m);
      mm_t.prefetch_warm.push_back(pf);
    }
    if (m1.ok()) m1_t.warm.push_back(*m1);
  }
  if (checksum != checksum_single)
    return fail(data_loss(path + ": checksum of the prefetch path differs from the single-thread reader"));
  const double dd_cold = best_of(dd_t.cold), mm_cold = best_of(mm_t.cold), m1_cold = best_of(m1_t.cold);
  const double dd_warm = best_of(dd_t.warm), mm_warm = best_of(mm_t.warm), m1_warm = best_of(m1_t.warm);
  auto rates = [&](const std::vector<double>& v) {
    std::vector<double> g;
    for (double x : v) g.push_back(gbps(x));
    return g;
  };
  bw["drop_caches_worked"] = dropped;
  bw["threads"] = threads;
  bw["madv_populate_read"] = populate;
  auto block = [&](double dd, double mm, double m1, const Times& d, const Times& m, const Times& s,
                   bool cold) {
    ojson o;
    o["dd_gb_per_s"] = gbps(dd);
    o["mmap_gb_per_s"] = gbps(mm);
    o["ratio"] = dd / mm;
    o["mmap_single_thread_gb_per_s"] = gbps(m1);
    o["ratio_single_thread"] = dd / m1;
    o["mmap_prefetch_only_gb_per_s"] = gbps(best_of(cold ? m.prefetch_cold : m.prefetch_warm));
    o["runs_gb_per_s"]["dd"] = rates(cold ? d.cold : d.warm);
    o["runs_gb_per_s"]["mmap"] = rates(cold ? m.cold : m.warm);
    o["runs_gb_per_s"]["mmap_single_thread"] = rates(cold ? s.cold : s.warm);
    return o;
  };
  bw["cold"] = block(dd_cold, mm_cold, m1_cold, dd_t, mm_t, m1_t, true);
  bw["warm"] = block(dd_warm, mm_warm, m1_warm, dd_t, mm_t, m1_t, false);
  const double ratio = dropped ? dd_cold / mm_cold : dd_warm / mm_warm;
  bw["ratio_mmap_over_dd"] = ratio;
  bw["ratio_basis"] = dropped ? "cold" : "warm (drop_caches failed)";
  bw["target_ratio"] = 0.8;
  bw["meets_target"] = ratio >= 0.8;
  bw["checksum"] = checksum;
  out["mmap_vs_dd"] = bw;
  if (created && !a.keep) std::filesystem::remove(path);

  if (a.json) {
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("open + validate %s: %zu tensors, best %.3f s of %zu (target < 2 s)\n", a.dir.c_str(),
                tensors, best, times.size());
    std::printf("read %s (%.2f GiB), caches dropped: %s\n", path.c_str(), size / double(1ull << 30),
                dropped ? "yes" : "no");
    std::printf(
        "  cold: dd %.2f GB/s, mmap (%d threads) %.2f GB/s, mmap/dd %.2f; single-thread mmap %.2f GB/s\n",
        gbps(dd_cold), threads, gbps(mm_cold), dd_cold / mm_cold, gbps(m1_cold));
    std::printf(
        "  warm: dd %.2f GB/s, mmap (%d threads) %.2f GB/s, mmap/dd %.2f; single-thread mmap %.2f GB/s\n",
        gbps(dd_warm), threads, gbps(mm_warm), dd_warm / mm_warm, gbps(m1_warm));
  }
  return 0;
}

void setup(CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<BenchLoadArgs>();
  CLI::App* sub =
      parent.add_subcommand("load", "Checkpoint open+validate time and mmap read bandwidth vs dd");
  sub->add_option("dir", args->dir,
                  "Checkpoint directory (e.g. make-checkpoint --layout-only --preset v41-flash); with "
                  "--load-format dummy --preset P it may be empty (\"\")")
      ->required();
  sub->add_flag("--json", args->json, "Print JSON");
  sub->add_option("--file", args->file, "Existing large file to read (default: create one in the temp dir)");
  sub->add_option("--size-gib", args->size_gib, "Size of the created file in GiB (default 2)")
      ->check(CLI::Range(0.01, 1024.0));
  sub->add_option("--repeats", args->repeats, "Open+validate repetitions (default 3)")
      ->check(CLI::Range(1, 100));
  sub->add_flag("--keep", args->keep, "Keep the created file");
  sub->add_flag("--drop-caches", args->drop_caches,
                "Drop the whole machine's page cache before each cold read (root; affects every process)");
  sub->add_option("--threads", args->threads, "Reader threads of the loader path (default min(16, cores))")
      ->check(CLI::Range(1, 1024));
  add_device_flags(sub, &args->dev);
  sub->add_option("--io-threads", args->io_threads, "--device cuda: shards read in parallel (default 4)")
      ->check(CLI::Range(1, 256));
  sub->add_option("--preset", args->preset, "--load-format dummy without config.json: a preset");
  sub->add_option("--tokenizer", args->tokenizer_dir, "Folder with tokenizer.json (Engram layers)");
  sub->callback([args, &exit_code] { exit_code = run_bench_load(*args); });
}

}  // namespace cmd_bench_load
}  // namespace
}  // namespace ds41::cli

DS41_REGISTER_BENCH("load", ::ds41::cli::cmd_bench_load::setup);
