// ds41 kvcache: MetricsRegistry implementation (registration under a mutex, values atomic).
#include "kvcache/metrics.h"

#include <cctype>

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
    out += "# TYPE " + name + (fam.kind == Kind::kCounter ? " counter\n" : " gauge\n");
    for (const auto& [labels, idx] : fam.series) {
      std::string v = fam.kind == Kind::kCounter ? std::to_string(counters_[idx].value())
                                                 : std::to_string(gauges_[idx].value());
      out += name + labels + " " + v + "\n";
    }
  }
  return out;
}

}  // namespace ds41::kvcache
