// ds41 kvcache: MetricsRegistry implementation (registration under a mutex, values atomic).
#include "kvcache/metrics.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

#include "core/check.h"

namespace ds41::kvcache {
namespace {

bool valid_metric_name(const std::string& n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    char c = n[i];
    bool ok = std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
              (i > 0 && std::isdigit(static_cast<unsigned char>(c)));
    if (!ok) return false;
  }
  return true;
}

std::string escape_label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escape_help(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

}  // namespace

std::string prometheus_number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  std::ostringstream os;
  os.precision(10);
  os << v;
  return os.str();
}

void render_histogram(const Histogram& h, const std::string& name, const std::string& help, std::string* out) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  for (size_t i = 0; i <= h.bounds().size(); ++i) {
    const std::string le = i < h.bounds().size() ? prometheus_number(h.bounds()[i]) : "+Inf";
    *out += name + "_bucket{le=\"" + le + "\"} " + std::to_string(h.cumulative(i)) + "\n";
  }
  *out += name + "_sum " + prometheus_number(h.sum()) + "\n" + name + "_count " + std::to_string(h.count()) + "\n";
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  DS41_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()), "histogram bounds must be ascending");
}

void Histogram::observe(double v) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

uint64_t Histogram::cumulative(size_t i) const {
  uint64_t c = 0;
  for (size_t j = 0; j <= std::min(i, bounds_.size()); ++j) c += counts_[j].load(std::memory_order_relaxed);
  return c;
}

const std::vector<double>& latency_bounds_seconds() {
  static const std::vector<double> b = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                        1,     2.5,   5,    10,    30,   60,  120};
  return b;
}

std::string MetricsRegistry::render_labels(const MetricLabels& labels) {
  if (labels.empty()) return "";
  std::string s = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    DS41_CHECK(valid_metric_name(labels[i].first), "invalid metric label name");
    if (i) s += ",";
    s += labels[i].first + "=\"" + escape_label_value(labels[i].second) + "\"";
  }
  return s + "}";
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help,
                                  const MetricLabels& labels) {
  DS41_CHECK(valid_metric_name(name), "invalid metric name");
  std::string key = render_labels(labels);
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = families_.try_emplace(name, Family{Kind::kCounter, help, {}});
  DS41_CHECK(it->second.kind == Kind::kCounter, "metric registered as gauge and counter");
  auto s = it->second.series.find(key);
  if (s != it->second.series.end()) return counters_[s->second];
  counters_.emplace_back();
  it->second.series.emplace(key, counters_.size() - 1);
  return counters_.back();
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help, const MetricLabels& labels) {
  DS41_CHECK(valid_metric_name(name), "invalid metric name");
  std::string key = render_labels(labels);
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = families_.try_emplace(name, Family{Kind::kGauge, help, {}});
  DS41_CHECK(it->second.kind == Kind::kGauge, "metric registered as counter and gauge");
  auto s = it->second.series.find(key);
  if (s != it->second.series.end()) return gauges_[s->second];
  gauges_.emplace_back();
  it->second.series.emplace(key, gauges_.size() - 1);
  return gauges_.back();
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                      const std::vector<double>& bounds, const MetricLabels& labels) {
  DS41_CHECK(valid_metric_name(name), "invalid metric name");
  for (const auto& l : labels) DS41_CHECK(l.first != "le", "a histogram's label may not be named le");
  std::string key = render_labels(labels);
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = families_.try_emplace(name, Family{Kind::kHistogram, help, {}});
  DS41_CHECK(it->second.kind == Kind::kHistogram, "metric registered as histogram and another kind");
  auto s = it->second.series.find(key);
  if (s != it->second.series.end()) {
    DS41_CHECK(histograms_[s->second].bounds() == bounds, "histogram registered again with other bounds");
    return histograms_[s->second];
  }
  histograms_.emplace_back(bounds);
  histogram_labels_.push_back(labels);
  it->second.series.emplace(key, histograms_.size() - 1);
  return histograms_.back();
}

uint64_t MetricsRegistry::counter_value(const std::string& name, const MetricLabels& labels) const {
  std::string key = render_labels(labels);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second.kind != Kind::kCounter) return 0;
  auto s = it->second.series.find(key);
  return s == it->second.series.end() ? 0 : counters_[s->second].value();
}

int64_t MetricsRegistry::gauge_value(const std::string& name, const MetricLabels& labels) const {
  std::string key = render_labels(labels);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end() || it->second.kind != Kind::kGauge) return 0;
  auto s = it->second.series.find(key);
  return s == it->second.series.end() ? 0 : gauges_[s->second].value();
}

std::string MetricsRegistry::prometheus_text() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [name, fam] : families_) {
    out += "# HELP " + name + " " + escape_help(fam.help) + "\n";
    out += "# TYPE " + name +
           (fam.kind == Kind::kCounter ? " counter\n" : fam.kind == Kind::kGauge ? " gauge\n" : " histogram\n");
    for (const auto& [labels, idx] : fam.series) {
      if (fam.kind == Kind::kHistogram) {
        const Histogram& h = histograms_[idx];
        for (size_t i = 0; i <= h.bounds().size(); ++i) {
          MetricLabels l = histogram_labels_[idx];
          l.emplace_back("le", i < h.bounds().size() ? prometheus_number(h.bounds()[i]) : "+Inf");
          out += name + "_bucket" + render_labels(l) + " " + std::to_string(h.cumulative(i)) + "\n";
        }
        out += name + "_sum" + labels + " " + prometheus_number(h.sum()) + "\n";
        out += name + "_count" + labels + " " + std::to_string(h.count()) + "\n";
        continue;
      }
      std::string v = fam.kind == Kind::kCounter ? std::to_string(counters_[idx].value())
                                                 : std::to_string(gauges_[idx].value());
      out += name + labels + " " + v + "\n";
    }
  }
  return out;
}

}  // namespace ds41::kvcache
