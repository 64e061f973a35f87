// ds41 kvcache: a small generic metrics registry (counters, gauges and histograms with names, help
// text and optional labels), exportable as Prometheus text exposition format (version 0.0.4). The server
// publishes one registry at /metrics; every kvcache component takes a MetricsRegistry& and
// registers its series once at construction, then updates them lock-free.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace ds41::kvcache {

// Label pairs in the order given, e.g. {{"tier", "disk"}, {"reason", "lru"}}.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// Monotonic counter. Thread-safe.
class Counter {
 public:
  void inc(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

// Gauge: a value that goes up and down. Thread-safe.
class Gauge {
 public:
  void set(int64_t v) { v_.store(v, std::memory_order_relaxed); }
  void add(int64_t d) { v_.fetch_add(d, std::memory_order_relaxed); }
  int64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> v_{0};
};

// Histogram with fixed upper bounds (ascending; a value v falls in the first bucket with v <= bound,
// else +Inf), rendered as Prometheus _bucket{le}/_sum/_count lines like the server's
// (server/metrics.h; that one is guarded by the server's mutex, this one is lock-free so that any
// thread may observe). Thread-safe; a render concurrent with observe() may see a bucket and the
// count one observation apart.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  // Observations <= bounds()[i] (cumulative, as rendered); i == bounds().size(): all of them.
  uint64_t cumulative(size_t i) const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bound, plus +Inf (not cumulative)
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

// Upper bounds in seconds for latencies (the server's histograms use the same).
const std::vector<double>& latency_bounds_seconds();
// A bound or a sum as Prometheus reads it (+Inf / -Inf, else 10 significant digits).
std::string prometheus_number(double v);
// Appends "# HELP", "# TYPE" and the _bucket / _sum / _count lines of one unlabelled histogram
// (the server's own series; the registry renders its labelled ones the same way).
void render_histogram(const Histogram& h, const std::string& name, const std::string& help, std::string* out);

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Returns the counter for (name, labels), creating it on first use. The reference stays valid
  // for the registry's lifetime. Registering the same name as a gauge and a counter, or a name
  // that is not a valid Prometheus metric name, is a programming error (DS41_CHECK).
  Counter& counter(const std::string& name, const std::string& help, const MetricLabels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const MetricLabels& labels = {});
  // A histogram series; `bounds` must be ascending, and the same for every series of the family.
  Histogram& histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                       const MetricLabels& labels = {});

  // Current value of a series; 0 when absent. For tests and benchmarks.
  uint64_t counter_value(const std::string& name, const MetricLabels& labels = {}) const;
  int64_t gauge_value(const std::string& name, const MetricLabels& labels = {}) const;

  // Prometheus text exposition: one "# HELP"/"# TYPE" pair per family, then its series,
  // families sorted by name.
  std::string prometheus_text() const;

 private:
  enum class Kind { kCounter, kGauge, kHistogram };
  struct Family {
    Kind kind;
    std::string help;
    std::map<std::string, size_t> series;  // rendered label string -> index into counters_/gauges_/...
  };
  static std::string render_labels(const MetricLabels& labels);

  mutable std::mutex mu_;  // guards families_ and the deques' growth
  std::map<std::string, Family> families_;
  std::deque<Counter> counters_;  // deque: stable addresses
  std::deque<Gauge> gauges_;
  std::deque<Histogram> histograms_;
  std::deque<MetricLabels> histogram_labels_;  // per histogram: its labels (le is appended)
};

}  // namespace ds41::kvcache
