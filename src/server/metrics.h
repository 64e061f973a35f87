// ds41 server: Prometheus metrics (text exposition format 0.0.4), names ds41_* (README "Metrics").
// Thread-safe: handler threads and the engine loop's on_step callback record concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine_loop.h"
#include "kvcache/metrics.h"

namespace ds41::server {

class ServerMetrics {
 public:
  ServerMetrics();
  void record_request(const std::string& route, int status);
  void record_tokens(int64_t prompt, int64_t generated);
  void observe_ttft(double s);
  void observe_inter_token(double s);
  void observe_e2e(double s);
  void observe_step(int64_t seqs, int64_t tokens, double seconds);
  // Appends this registry's series (the prefix cache's) to every render; null: none. Set before
  // serving; the registry must outlive the metrics.
  void set_cache_metrics(const kvcache::MetricsRegistry* r) { cache_ = r; }
  // The whole exposition; loop gauges come from `stats`.
  std::string render(const engine::LoopStats& stats) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // (route, status) -> count
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  // Latencies and step sizes (kvcache::Histogram: the one histogram type of the code base).
  kvcache::Histogram ttft_, itl_, e2e_, step_seqs_, step_tokens_, step_seconds_;
  const kvcache::MetricsRegistry* cache_ = nullptr;
};

}  // namespace ds41::server
