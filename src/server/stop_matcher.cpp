// ds41 server: StopMatcher (see stop_matcher.h).
#include "server/stop_matcher.h"

#include <algorithm>

namespace ds41::server {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string StopMatcher::push(std::string_view text) {
  if (matched_) return {};
  held_.append(text);
  if (stops_.empty()) return std::exchange(held_, {});
  size_t best = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t pos = held_.find(s);
    if (pos < best) {
      best = pos;
      matched_stop_ = s;
    }
  }
  if (best != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Keep the longest suffix that is a proper prefix of some stop string. The stop strings are
  // valid UTF-8, so the cut falls on a character boundary of (valid UTF-8) held text.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    const size_t max_k = std::min(held_.size(), s.size() - 1);
    for (size_t k = max_k; k > keep; --k) {
      if (std::string_view(held_).substr(held_.size() - k) == std::string_view(s).substr(0, k)) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  if (matched_) return {};
  return std::exchange(held_, {});
}

}  // namespace ds41::server
