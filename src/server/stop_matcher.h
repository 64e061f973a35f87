// ds41 server: stop strings matched on the consumer side of the request queue (issue 12: the step
// loop never detokenizes). Text arrives in chunks whose boundaries fall anywhere, so a suffix
// that could still grow into a stop string is held back until it either matches or cannot.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ds41::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Appends `text`; returns the text that can no longer be part of a stop string. On a match,
  // returns the text before the earliest match, matched() turns true and later pushes return "".
  std::string push(std::string_view text);
  // End of stream: returns whatever was held back (no match can complete any more).
  std::string flush();
  bool matched() const { return matched_; }
  const std::string& matched_stop() const { return matched_stop_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
  std::string matched_stop_;
};

}  // namespace ds41::server
