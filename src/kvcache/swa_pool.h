// ds41 kvcache: the SWA snapshot pool interface. An SWA snapshot (the window rings of every layer
// at a prefix end) is short-lived: kept for a TTL of minutes, and a miss is always acceptable
// (the engine repairs it by bounded replay). So every failure of a backend — absent, expired,
// evicted, node down, timeout — is a miss, never an exception or a hang. Values are opaque bytes
// (KvStore wraps them in the verified block format). Implementations: DramSwaPool (embedded),
// RedisSwaPool (sharded over Redis nodes).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "kvcache/block_key.h"

namespace ds41::kvcache {

// Shared immutable bytes: the DRAM pool hands out its stored buffer without copying.
using SwaBytes = std::shared_ptr<const std::vector<uint8_t>>;

class SwaPool {
 public:
  virtual ~SwaPool() = default;
  // Stores `value` under `key` for ttl_ns (0 = the pool's configured TTL), replacing any
  // previous value. Errors (too large, backend unavailable) are returned for metrics/logging;
  // callers may ignore them.
  virtual Status put(const BlockKey& key, std::span<const uint8_t> value, int64_t ttl_ns = 0) = 0;
  // As put(), taking ownership of the bytes: a pool that keeps them in memory stores this buffer
  // without copying (a 2.7 MB snapshot per request end). Default: put() of a view.
  virtual Status put_owned(const BlockKey& key, std::vector<uint8_t> value, int64_t ttl_ns = 0) {
    return put(key, std::span<const uint8_t>(value), ttl_ns);
  }
  // The value, or nullptr on any kind of miss.
  virtual SwaBytes get(const BlockKey& key) = 0;
  // Whether a live value exists (false on any error).
  virtual bool contains(const BlockKey& key) = 0;
  virtual Status erase(const BlockKey& key) = 0;
  // "dram" or "redis" (the metrics label).
  virtual const char* backend_name() const = 0;
};

}  // namespace ds41::kvcache
