// ds41 kvcache: RedisSwaPool implementation over the synchronous hiredis API with socket
// timeouts. Each node has a few connection slots (one mutex each); a broken or timed-out
// connection is freed and re-made on the next use after the down-retry window.
#include "kvcache/redis_swa_pool.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <cerrno>
#include <cstring>

#include "core/log.h"

namespace ds41::kvcache {
namespace {

// Blocks SIGPIPE on this thread while talking to a socket whose peer may have died, and swallows
// a SIGPIPE raised meanwhile, so a killed Redis node cannot kill the process.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        sigset_t pipe_set;
        sigemptyset(&pipe_set);
        sigaddset(&pipe_set, SIGPIPE);
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t old_;
  bool was_pending_ = false;
};

struct timeval to_timeval(int64_t us) {
  struct timeval tv;
  tv.tv_sec = us / 1000000;
  tv.tv_usec = us % 1000000;
  return tv;
}

// Jump consistent hash (Lamping & Veach): stable bucket in [0, n) for a 64-bit key.
size_t jump_hash(uint64_t key, size_t n) {
  int64_t b = -1, j = 0;
  while (j < static_cast<int64_t>(n)) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = static_cast<int64_t>(static_cast<double>(b + 1) *
                             (static_cast<double>(1LL << 31) / static_cast<double>((key >> 33) + 1)));
  }
  return static_cast<size_t>(b);
}

}  // namespace

struct RedisSwaPool::Slot {
  std::mutex mu;  // guards ctx
  redisContext* ctx = nullptr;
};

struct RedisSwaPool::Node {
  std::string name;  // host:port (metrics label)
  std::string host;
  int port = 0;
  std::vector<std::unique_ptr<Slot>> slots;
  std::atomic<uint32_t> next_slot{0};
  std::atomic<int64_t> down_until_ns{0};
  Counter* err_connect = nullptr;
  Counter* err_timeout = nullptr;
  Counter* err_io = nullptr;
  Counter* err_reply = nullptr;
  Counter* skipped_down = nullptr;
};

void RedisSwaPool::ReplyDeleter::operator()(redisReply* r) const {
  if (r) freeReplyObject(r);
}

RedisSwaPool::RedisSwaPool(const RedisSwaPoolConfig& config, Clock& clock, MetricsRegistry& m)
    : config_(config),
      clock_(clock),
      metrics_(m),
      hits_(m.counter("ds41_kv_swa_hits_total", "SWA snapshot lookups that hit", {{"backend", "redis"}})),
      misses_(
          m.counter("ds41_kv_swa_misses_total", "SWA snapshot lookups that missed", {{"backend", "redis"}})),
      puts_(m.counter("ds41_kv_swa_puts_total", "SWA snapshots stored", {{"backend", "redis"}})),
      put_errors_(m.counter("ds41_kv_swa_put_errors_total", "SWA snapshot stores that failed",
                            {{"backend", "redis"}})) {
  for (const auto& n : config_.nodes) {
    auto node = std::make_unique<Node>();
    node->name = n;
    (void)parse_host_port(n, &node->host, &node->port);  // validated by create()
    for (int i = 0; i < config_.connections_per_node; ++i) node->slots.push_back(std::make_unique<Slot>());
    const char* help = "Redis SWA pool failures (each one is a miss or a dropped store)";
    node->err_connect =
        &m.counter("ds41_kv_swa_redis_errors_total", help, {{"node", n}, {"reason", "connect"}});
    node->err_timeout =
        &m.counter("ds41_kv_swa_redis_errors_total", help, {{"node", n}, {"reason", "timeout"}});
    node->err_io = &m.counter("ds41_kv_swa_redis_errors_total", help, {{"node", n}, {"reason", "io"}});
    node->err_reply = &m.counter("ds41_kv_swa_redis_errors_total", help, {{"node", n}, {"reason", "reply"}});
    node->skipped_down =
        &m.counter("ds41_kv_swa_redis_errors_total", help, {{"node", n}, {"reason", "down"}});
    nodes_.push_back(std::move(node));
  }
}

RedisSwaPool::~RedisSwaPool() {
  for (auto& n : nodes_)
    for (auto& s : n->slots)
      if (s->ctx) redisFree(s->ctx);
}

Result<std::unique_ptr<RedisSwaPool>> RedisSwaPool::create(const RedisSwaPoolConfig& config, Clock& clock,
                                                           MetricsRegistry& metrics) {
  DS41_RETURN_IF_ERROR(config.validate());
  return std::unique_ptr<RedisSwaPool>(new RedisSwaPool(config, clock, metrics));
}

size_t RedisSwaPool::node_for(const BlockKey& key) const { return jump_hash(key.lo ^ key.hi, nodes_.size()); }

Result<RedisSwaPool::ReplyPtr> RedisSwaPool::command(const BlockKey& key,
                                                     std::vector<std::string_view> argv) {
  Node& node = *nodes_[node_for(key)];
  const int64_t now = clock_.now_mono_ns();
  if (now < node.down_until_ns.load()) {
    node.skipped_down->inc();
    return unavailable("redis " + node.name + ": marked down after a recent error");
  }
  Slot& slot = *node.slots[node.next_slot.fetch_add(1) % node.slots.size()];
  std::lock_guard<std::mutex> lock(slot.mu);
  const int64_t timeout_us = static_cast<int64_t>(config_.timeout_ms) * 1000;
  auto mark_down = [&] { node.down_until_ns.store(clock_.now_mono_ns() + config_.down_retry_ns); };
  SigpipeGuard sigpipe_guard;
  if (slot.ctx == nullptr) {
    redisContext* c = redisConnectWithTimeout(node.host.c_str(), node.port, to_timeval(timeout_us));
    if (c == nullptr || c->err) {
      std::string why = c ? c->errstr : "out of memory";
      if (c) redisFree(c);
      node.err_connect->inc();
      mark_down();
      return unavailable("redis " + node.name + ": connect: " + why);
    }
    if (redisSetTimeout(c, to_timeval(timeout_us)) != REDIS_OK) {
      redisFree(c);
      node.err_connect->inc();
      mark_down();
      return unavailable("redis " + node.name + ": cannot set socket timeout");
    }
    slot.ctx = c;
  }
  std::vector<const char*> ptrs;
  std::vector<size_t> lens;
  for (auto a : argv) {
    ptrs.push_back(a.data());
    lens.push_back(a.size());
  }
  errno = 0;
  auto* raw = static_cast<redisReply*>(
      redisCommandArgv(slot.ctx, static_cast<int>(argv.size()), ptrs.data(), lens.data()));
  if (raw == nullptr) {
    int err = errno;
    std::string why = slot.ctx->errstr;
    bool timeout = err == EAGAIN || err == EWOULDBLOCK ||
                   why.find("temporarily unavailable") != std::string::npos ||
                   why.find("timed out") != std::string::npos;
    (timeout ? node.err_timeout : node.err_io)->inc();
    redisFree(slot.ctx);  // state unknown after a failed exchange
    slot.ctx = nullptr;
    mark_down();
    return unavailable("redis " + node.name + (timeout ? ": timeout: " : ": i/o error: ") + why);
  }
  ReplyPtr reply(raw);
  if (reply->type == REDIS_REPLY_ERROR) {
    node.err_reply->inc();
    return unavailable("redis " + node.name + ": " + std::string(reply->str, reply->len));
  }
  return reply;
}

Status RedisSwaPool::put(const BlockKey& key, std::span<const uint8_t> value, int64_t ttl_ns) {
  if (ttl_ns < 0) return invalid_argument("kv redis swa pool: ttl must be >= 0");
  int64_t ttl_ms = (ttl_ns == 0 ? config_.ttl_ns : ttl_ns) / 1000000;
  if (ttl_ms < 1) ttl_ms = 1;
  std::string k = redis_key(key);
  std::string ttl = std::to_string(ttl_ms);
  auto r = command(
      key,
      {"SET", k, std::string_view(reinterpret_cast<const char*>(value.data()), value.size()), "PX", ttl});
  if (!r.ok()) {
    put_errors_.inc();
    return r.status();
  }
  puts_.inc();
  return ok_status();
}

SwaBytes RedisSwaPool::get(const BlockKey& key) {
  std::string k = redis_key(key);
  auto r = command(key, {"GET", k});
  if (!r.ok() || (*r)->type != REDIS_REPLY_STRING) {
    misses_.inc();
    return nullptr;
  }
  hits_.inc();
  const auto* p = reinterpret_cast<const uint8_t*>((*r)->str);
  return std::make_shared<const std::vector<uint8_t>>(p, p + (*r)->len);
}

bool RedisSwaPool::contains(const BlockKey& key) {
  std::string k = redis_key(key);
  auto r = command(key, {"EXISTS", k});
  return r.ok() && (*r)->type == REDIS_REPLY_INTEGER && (*r)->integer > 0;
}

Status RedisSwaPool::erase(const BlockKey& key) {
  std::string k = redis_key(key);
  auto r = command(key, {"DEL", k});
  return r.ok() ? ok_status() : r.status();
}

Result<int64_t> RedisSwaPool::pttl_ms(const BlockKey& key) {
  std::string k = redis_key(key);
  DS41_ASSIGN_OR_RETURN(ReplyPtr r, command(key, {"PTTL", k}));
  if (r->type != REDIS_REPLY_INTEGER) return internal_error("redis PTTL: unexpected reply type");
  return static_cast<int64_t>(r->integer);
}

}  // namespace ds41::kvcache
