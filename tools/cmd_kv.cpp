// ds41 kv stats|verify|gc: operator commands for the persistent global-KV tier (DiskTier,
// docs/formats/kv_block.md). Every sub-command takes --kv-dir (required), --kv-disk-capacity,
// --kv-retention (the server's spellings, parsed by kvcache/store_config.h) and --json. None of
// them creates a store: a missing directory or one without the LAYOUT marker is an error.
//   stats   index rebuild, then blocks/bytes, what is still under retention, ages, usage.
//   verify  reads and verifies every block (without stamping access times); corrupt/torn blocks
//           are deleted (kept with --dry-run), blocks of another model fingerprint or format
//           version are reported as incompatible and kept.
//   gc      evicts blocks past retention, least recently used first, until usage <= capacity.
// Exit codes: 0 ok, 1 runtime error (store missing/unreadable; verify: read errors or a corrupt
// block that could not be deleted), 2 usage error (bad or missing flag value), 3 verify
// --dry-run found corrupt blocks.
#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cli_format.h"
#include "cli_registry.h"
#include "core/clock.h"
#include "kvcache/disk_tier.h"
#include "kvcache/metrics.h"
#include "kvcache/posix_io.h"
#include "kvcache/store_config.h"

namespace ds41::cli {
namespace {
namespace cmd_kv {  // one name per file: the unity build of tools/ (CMakeLists.txt)

using namespace ds41::kvcache;  // the tier this command drives

using ojson = nlohmann::ordered_json;

// Capacity used when --kv-disk-capacity is not given (stats, verify): effectively unbounded, and
// far enough from UINT64_MAX that used + incoming cannot overflow in the tier's arithmetic.
constexpr uint64_t kUnboundedCapacity = 1ULL << 62;

struct KvArgs {
  std::string sub;  // stats | verify | gc
  std::string dir;
  std::string capacity;
  std::string retention = "72h";
  bool json = false;
  bool dry_run = false;
  int threads = -1;  // -1 = default (min(8, cores))
  std::string fingerprint;
  size_t list = 20;
};

// Outcome of flag validation / store opening: an exit code and a message, or a usable tier.
struct Failure {
  int code = 0;
  std::string message;
};

int report_failure(const KvArgs& a, const Failure& f) {
  std::cerr << "ds41 kv " << a.sub << ": " << f.message << "\n";
  if (a.json) std::cout << ojson{{"ok", false}, {"exit_code", f.code}, {"error", f.message}}.dump(2) << "\n";
  return f.code;
}

std::string human_age(double s) {
  char buf[32];
  if (s < 120)
    std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (s < 7200)
    std::snprintf(buf, sizeof buf, "%.1f min", s / 60);
  else if (s < 172800)
    std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  else
    std::snprintf(buf, sizeof buf, "%.1f d", s / 86400);
  return buf;
}

double seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

// Flags -> DiskTierConfig. Any bad value is a usage error (exit 2) naming the flag and value.
std::optional<Failure> parse_common(const KvArgs& a, DiskTierConfig* cfg, bool* has_capacity) {
  if (a.dir.empty()) return Failure{2, "--kv-dir is required (the persistent KV directory)"};
  cfg->dir = a.dir;
  *has_capacity = !a.capacity.empty();
  cfg->capacity_bytes = kUnboundedCapacity;
  if (*has_capacity) {
    auto c = parse_byte_size(a.capacity);
    if (!c.ok()) return Failure{2, "--kv-disk-capacity '" + a.capacity + "': " + c.status().message()};
    if (*c == 0) return Failure{2, "--kv-disk-capacity '" + a.capacity + "': must be > 0"};
    cfg->capacity_bytes = *c;
  }
  auto r = parse_duration_ns(a.retention);
  if (!r.ok()) return Failure{2, "--kv-retention '" + a.retention + "': " + r.status().message()};
  cfg->retention_ns = *r;
  cfg->sync = true;
  cfg->rescan_interval_ns = 0;  // one-shot tool: the open() scan is the view
  return std::nullopt;
}

// Opens an EXISTING store (DiskTier::open would create the layout: check first).
Result<std::unique_ptr<DiskTier>> open_existing(const DiskTierConfig& cfg, Clock& clock, MetricsRegistry& m) {
  FileIo& io = PosixIo::instance();
  auto st = io.stat(cfg.dir);
  if (!st.ok()) {
    if (st.status().code() == StatusCode::kNotFound)
      return not_found("--kv-dir " + cfg.dir + " does not exist (nothing was created)");
    return st.status();
  }
  if (!st->is_dir) return failed_precondition("--kv-dir " + cfg.dir + " is not a directory");
  auto marker = io.stat(cfg.dir + "/LAYOUT");
  if (!marker.ok()) {
    if (marker.status().code() == StatusCode::kNotFound)
      return failed_precondition("--kv-dir " + cfg.dir +
                                 " is not a ds41 KV store (no LAYOUT marker); nothing was created");
    return marker.status();
  }
  return DiskTier::open(cfg, io, clock, m);
}

// ---- stats ----

int run_stats(const KvArgs& a, const DiskTierConfig& cfg, bool has_capacity) {
  SystemClock& clock = SystemClock::instance();
  MetricsRegistry metrics;
  auto tier = open_existing(cfg, clock, metrics);
  if (!tier.ok()) return report_failure(a, {1, tier.status().message()});
  DiskTier::Usage u = (*tier)->usage();
  const int64_t now = clock.now_unix_ns();
  const bool empty = u.blocks == 0;
  ojson out;
  out["ok"] = true;
  out["dir"] = cfg.dir;
  out["blocks"] = u.blocks;
  out["bytes"] = u.bytes;
  out["retained_blocks"] = u.retained_blocks;
  out["retained_bytes"] = u.retained_bytes;
  out["evictable_blocks"] = u.blocks - u.retained_blocks;
  out["evictable_bytes"] = u.bytes - u.retained_bytes;
  out["retention_s"] = seconds(cfg.retention_ns);
  out["oldest_block_age_s"] = empty ? ojson(nullptr) : ojson(seconds(now - u.oldest_created_ns));
  out["newest_block_age_s"] = empty ? ojson(nullptr) : ojson(seconds(now - u.newest_created_ns));
  out["least_recent_use_age_s"] = empty ? ojson(nullptr) : ojson(seconds(now - u.lru_access_ns));
  out["capacity_bytes"] = has_capacity ? ojson(cfg.capacity_bytes) : ojson(nullptr);
  out["usage_fraction"] = has_capacity
                              ? ojson(static_cast<double>(u.bytes) / static_cast<double>(cfg.capacity_bytes))
                              : ojson(nullptr);
  out["over_capacity"] = has_capacity && u.bytes > cfg.capacity_bytes;
  out["retention_exceeds_capacity"] = has_capacity && u.retained_bytes > cfg.capacity_bytes;
  out["index_rebuild_ms"] = (*tier)->last_scan_ms();
  if (a.json) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf("kv store %s\n", cfg.dir.c_str());
  std::printf("  blocks           %zu (%" PRIu64 " bytes, %s)\n", u.blocks, u.bytes,
              human_bytes(u.bytes, ByteUnits::kBinary).c_str());
  std::printf("  under retention  %zu blocks, %" PRIu64 " bytes (--kv-retention %s)\n", u.retained_blocks,
              u.retained_bytes, a.retention.c_str());
  std::printf("  evictable        %zu blocks, %" PRIu64 " bytes\n", u.blocks - u.retained_blocks,
              u.bytes - u.retained_bytes);
  if (!empty)
    std::printf("  block ages       oldest %s, newest %s; least recent use %s ago\n",
                human_age(seconds(now - u.oldest_created_ns)).c_str(),
                human_age(seconds(now - u.newest_created_ns)).c_str(),
                human_age(seconds(now - u.lru_access_ns)).c_str());
  if (has_capacity) {
    const char* note = "";
    if (u.retained_bytes > cfg.capacity_bytes)
      note = " (OVER CAPACITY with blocks under retention alone: new blocks are refused)";
    else if (u.bytes > cfg.capacity_bytes)
      note = " (OVER CAPACITY: `ds41 kv gc` evicts blocks past retention)";
    std::printf("  capacity         %" PRIu64 " bytes (%s), %.1f %% used%s\n", cfg.capacity_bytes,
                human_bytes(cfg.capacity_bytes, ByteUnits::kBinary).c_str(),
                100.0 * u.bytes / cfg.capacity_bytes, note);
  } else
    std::printf("  capacity         not given (--kv-disk-capacity)\n");
  std::printf("  index rebuild    %.1f ms\n", (*tier)->last_scan_ms());
  return 0;
}

// ---- verify ----

Result<uint64_t> parse_fingerprint(const std::string& s) {
  uint64_t v = 0;
  const char* b = s.data();
  const char* e = s.data() + s.size();
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    b += 2;
    base = 16;
  }
  auto [p, ec] = std::from_chars(b, e, v, base);
  if (b == e || ec != std::errc() || p != e)
    return invalid_argument("expected an unsigned 64-bit number (decimal or 0x hex)");
  return v;
}

int run_verify(const KvArgs& a, const DiskTierConfig& cfg) {
  std::optional<uint64_t> fingerprint;
  if (!a.fingerprint.empty()) {
    auto f = parse_fingerprint(a.fingerprint);
    if (!f.ok())
      return report_failure(a, {2, "--model-fingerprint '" + a.fingerprint + "': " + f.status().message()});
    fingerprint = *f;
  }
  int threads = a.threads;
  if (threads == -1) threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  if (threads < 1 || threads > 256)
    return report_failure(a, {2, "--threads " + std::to_string(a.threads) + ": must be in [1, 256]"});

  SystemClock& clock = SystemClock::instance();
  MetricsRegistry metrics;
  auto tier_r = open_existing(cfg, clock, metrics);
  if (!tier_r.ok()) return report_failure(a, {1, tier_r.status().message()});
  DiskTier& tier = **tier_r;
  const std::vector<DiskTier::BlockInfo> blocks = tier.list_blocks();

  auto t0 = std::chrono::steady_clock::now();
  std::atomic<size_t> next{0};
  std::mutex mu;  // guards the lists and counters below
  size_t ok = 0, corrupt = 0, deleted = 0, incompatible = 0, read_errors = 0, vanished = 0;
  uint64_t bytes_ok = 0;
  ojson corrupt_list = ojson::array(), incompatible_list = ojson::array(), error_list = ojson::array();
  auto worker = [&] {
    for (size_t i = next.fetch_add(1); i < blocks.size(); i = next.fetch_add(1)) {
      const BlockKey& key = blocks[i].key;
      DiskTier::VerifyOutcome v = tier.verify_block(key, fingerprint, a.dry_run);
      std::lock_guard<std::mutex> lock(mu);
      switch (v.result) {
        case DiskTier::VerifyResult::kOk:
          ++ok;
          bytes_ok += blocks[i].bytes;
          break;
        case DiskTier::VerifyResult::kCorrupt:
          ++corrupt;
          if (v.deleted) ++deleted;
          corrupt_list.push_back({{"key", key.hex()},
                                  {"path", tier.block_path(key)},
                                  {"reason", v.detail.message()},
                                  {"deleted", v.deleted}});
          break;
        case DiskTier::VerifyResult::kIncompatible:
          ++incompatible;
          incompatible_list.push_back({{"key", key.hex()},
                                       {"path", tier.block_path(key)},
                                       {"model_fingerprint", v.meta.model_fingerprint},
                                       {"reason", v.detail.message()}});
          break;
        case DiskTier::VerifyResult::kMissing:
          ++vanished;  // deleted by another process since the listing: nothing to verify
          break;
        case DiskTier::VerifyResult::kReadError:
          ++read_errors;
          error_list.push_back(
              {{"key", key.hex()}, {"path", tier.block_path(key)}, {"reason", v.detail.message()}});
          break;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // Sort the lists so output is deterministic whatever the thread interleaving.
  auto by_key = [](const ojson& x, const ojson& y) { return x["key"] < y["key"]; };
  std::sort(corrupt_list.begin(), corrupt_list.end(), by_key);
  std::sort(incompatible_list.begin(), incompatible_list.end(), by_key);
  std::sort(error_list.begin(), error_list.end(), by_key);

  int code = 0;
  if (a.dry_run && corrupt > 0) code = 3;
  if (read_errors > 0 || (!a.dry_run && deleted < corrupt)) code = 1;

  ojson out;
  out["ok"] = code == 0;
  out["exit_code"] = code;
  out["dir"] = cfg.dir;
  out["dry_run"] = a.dry_run;
  out["model_fingerprint"] = fingerprint ? ojson(*fingerprint) : ojson(nullptr);
  out["threads"] = threads;
  out["checked"] = blocks.size();
  out["ok_blocks"] = ok;
  out["ok_bytes"] = bytes_ok;
  out["corrupt"] = corrupt;
  out["corrupt_deleted"] = deleted;
  out["incompatible"] = incompatible;
  out["read_errors"] = read_errors;
  out["vanished"] = vanished;
  out["elapsed_ms"] = ms;
  out["corrupt_blocks"] = corrupt_list;
  out["incompatible_blocks"] = incompatible_list;
  out["read_error_blocks"] = error_list;
  if (a.json) {
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("kv verify %s%s: %zu blocks checked in %.0f ms (%d threads)\n", cfg.dir.c_str(),
                a.dry_run ? " (dry run)" : "", blocks.size(), ms, threads);
    std::printf("  ok            %zu (%" PRIu64 " bytes)\n", ok, bytes_ok);
    if (a.dry_run)
      std::printf("  corrupt       %zu (dry run: kept)\n", corrupt);
    else
      std::printf("  corrupt       %zu (deleted %zu)\n", corrupt, deleted);
    std::printf("  incompatible  %zu (other model fingerprint or format version; kept)\n", incompatible);
    std::printf("  read errors   %zu\n", read_errors);
    if (vanished)
      std::printf("  vanished      %zu (removed by another process during the check)\n", vanished);
    auto list = [&](const char* what, const ojson& l) {
      for (size_t i = 0; i < l.size() && i < a.list; ++i)
        std::printf("  %s %s: %s\n", what, l[i]["path"].get<std::string>().c_str(),
                    l[i]["reason"].get<std::string>().c_str());
      if (l.size() > a.list) std::printf("  ... %zu more (--json lists all)\n", l.size() - a.list);
    };
    list(a.dry_run ? "corrupt (kept, dry run)" : "corrupt", corrupt_list);
    list("incompatible", incompatible_list);
    list("read error", error_list);
  }
  if (code == 3)
    std::cerr << "ds41 kv verify: " << corrupt << " corrupt block(s) found (dry run: not deleted)\n";
  if (code == 1)
    std::cerr << "ds41 kv verify: " << read_errors << " read error(s), " << (corrupt - deleted)
              << " corrupt block(s) not deleted\n";
  return code;
}

// ---- gc ----

int run_gc(const KvArgs& a, const DiskTierConfig& cfg, bool has_capacity) {
  if (!has_capacity)
    return report_failure(a, {2, "--kv-disk-capacity is required for gc (the usage to reduce the store to)"});
  SystemClock& clock = SystemClock::instance();
  MetricsRegistry metrics;
  auto tier = open_existing(cfg, clock, metrics);
  if (!tier.ok()) return report_failure(a, {1, tier.status().message()});
  DiskTier::GcReport r = (*tier)->collect_garbage(a.dry_run);
  const int64_t now = clock.now_unix_ns();
  std::string warning;
  if (r.retention_exceeds_capacity)
    warning = "blocks under retention alone take " + std::to_string(r.retained_bytes) + " bytes (" +
              human_bytes(r.retained_bytes, ByteUnits::kBinary) + "), more than the capacity " +
              std::to_string(r.capacity_bytes) + " bytes (" +
              human_bytes(r.capacity_bytes, ByteUnits::kBinary) + "); they are kept (--kv-retention " +
              a.retention + "): the store stays over capacity and the server will refuse new blocks";
  ojson ev = ojson::array();
  for (const auto& b : r.evicted)
    ev.push_back({{"key", b.key.hex()},
                  {"bytes", b.bytes},
                  {"age_s", seconds(now - b.created_ns)},
                  {"idle_s", seconds(now - b.access_ns)}});
  ojson out;
  out["ok"] = true;
  out["dir"] = cfg.dir;
  out["dry_run"] = a.dry_run;
  out["capacity_bytes"] = r.capacity_bytes;
  out["retention_s"] = seconds(cfg.retention_ns);
  out["used_before"] = r.used_before;
  out["used_after"] = r.used_after;
  out["evicted_blocks"] = r.evicted_blocks;
  out["evicted_bytes"] = r.evicted_bytes;
  out["vanished_blocks"] = r.vanished_blocks;
  out["retained_bytes"] = r.retained_bytes;
  out["retention_exceeds_capacity"] = r.retention_exceeds_capacity;
  out["over_capacity_after"] = r.used_after > r.capacity_bytes;
  out["warning"] = warning.empty() ? ojson(nullptr) : ojson(warning);
  out["evicted"] = ev;
  if (a.json) {
    std::cout << out.dump(2) << "\n";
  } else {
    const char* verb = a.dry_run ? "would evict" : "evicted";
    std::printf("kv gc %s%s: capacity %" PRIu64 " bytes (%s), --kv-retention %s\n", cfg.dir.c_str(),
                a.dry_run ? " (dry run)" : "", r.capacity_bytes,
                human_bytes(r.capacity_bytes, ByteUnits::kBinary).c_str(), a.retention.c_str());
    std::printf("  used before   %" PRIu64 " bytes (%s)\n", r.used_before,
                human_bytes(r.used_before, ByteUnits::kBinary).c_str());
    std::printf("  %-13s %zu blocks, %" PRIu64 " bytes (LRU first, only blocks past retention)\n", verb,
                r.evicted_blocks, r.evicted_bytes);
    std::printf("  used after    %" PRIu64 " bytes (%s)%s\n", r.used_after,
                human_bytes(r.used_after, ByteUnits::kBinary).c_str(), a.dry_run ? " (projected)" : "");
    std::printf("  retained      %" PRIu64 " bytes under retention\n", r.retained_bytes);
    if (a.dry_run)
      for (size_t i = 0; i < r.evicted.size() && i < a.list; ++i)
        std::printf("  would evict %s (%" PRIu64 " bytes, age %s, idle %s)\n", r.evicted[i].key.hex().c_str(),
                    r.evicted[i].bytes, human_age(seconds(now - r.evicted[i].created_ns)).c_str(),
                    human_age(seconds(now - r.evicted[i].access_ns)).c_str());
  }
  if (!warning.empty()) std::cerr << "ds41 kv gc: warning: " << warning << "\n";
  return 0;
}

int run_kv(const KvArgs& a) {
  DiskTierConfig cfg;
  bool has_capacity = false;
  if (auto f = parse_common(a, &cfg, &has_capacity)) return report_failure(a, *f);
  if (a.sub == "stats") return run_stats(a, cfg, has_capacity);
  if (a.sub == "verify") return run_verify(a, cfg);
  return run_gc(a, cfg, has_capacity);
}

void add_common(CLI::App* sub, KvArgs& a) {
  sub->add_option("--kv-dir", a.dir, "Persistent KV directory (required; never created by this command)");
  sub->add_option("--kv-disk-capacity", a.capacity,
                  "Capacity, e.g. 500G, 64M, 4096 (bytes; K/M/G/T = 1024^n)");
  sub->add_option("--kv-retention", a.retention,
                  "Retention: blocks younger than this are never evicted (72h)");
  sub->add_flag("--json", a.json, "Machine-readable JSON on stdout");
}

void setup(CLI::App& parent, int& exit_code) {
  CLI::App* kv =
      parent.add_subcommand("kv", "Operator commands for the persistent KV tier (stats, verify, gc)");
  kv->require_subcommand(1);

  auto st = std::make_shared<KvArgs>();
  st->sub = "stats";
  CLI::App* stats = kv->add_subcommand("stats", "Blocks, bytes, retention, ages and usage of a KV store");
  add_common(stats, *st);
  stats->footer("Exit: 0 ok, 1 store missing/unreadable, 2 bad flag value.");
  stats->callback([st, &exit_code] { exit_code = run_kv(*st); });

  auto va = std::make_shared<KvArgs>();
  va->sub = "verify";
  CLI::App* verify = kv->add_subcommand("verify", "Read and verify every block; delete corrupt ones");
  add_common(verify, *va);
  verify->add_flag("--dry-run", va->dry_run, "Report corrupt blocks without deleting them");
  verify->add_option("--threads", va->threads, "Reader threads (default min(8, cores))");
  verify->add_option("--model-fingerprint", va->fingerprint,
                     "Expected model fingerprint (decimal or 0x hex); blocks of another are incompatible "
                     "(kept). Default: accept the fingerprint in each block's header");
  verify->add_option("--list", va->list, "Problem blocks listed in text output (JSON lists all)");
  verify->footer(
      "Corrupt or torn blocks are deleted (never with --dry-run); incompatible blocks (other model "
      "fingerprint or format version) are reported and kept.\n"
      "Exit: 0 no corrupt block left (corrupt ones found were deleted: see the report), 1 read errors, a "
      "corrupt block that could not be deleted, or store missing/unreadable, 2 bad flag value, 3 --dry-run "
      "found corrupt blocks.");
  verify->callback([va, &exit_code] { exit_code = run_kv(*va); });

  auto ga = std::make_shared<KvArgs>();
  ga->sub = "gc";
  CLI::App* gc =
      kv->add_subcommand("gc", "Evict least recently used blocks past retention down to the capacity");
  add_common(gc, *ga);
  gc->add_flag("--dry-run", ga->dry_run, "List what would be evicted; change nothing");
  gc->add_option("--list", ga->list, "Blocks listed by --dry-run in text output (JSON lists all)");
  gc->footer(
      "--kv-disk-capacity is required. Blocks under retention are never evicted; when they alone exceed "
      "the capacity gc says so (warning on stderr, JSON retention_exceeds_capacity) and exits 0.\n"
      "Exit: 0 ok, 1 store missing/unreadable, 2 bad or missing flag value.");
  gc->callback([ga, &exit_code] { exit_code = run_kv(*ga); });
}

}  // namespace cmd_kv
}  // namespace
}  // namespace ds41::cli

DS41_REGISTER_COMMAND("kv", ::ds41::cli::cmd_kv::setup);
