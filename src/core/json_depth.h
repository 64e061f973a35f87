// ds41 core: a linear pre-scan that bounds JSON nesting before a DOM parser runs, so hostile
// input (a long run of '[') cannot build a huge tree or recurse deeply. Used by every parser of
// untrusted JSON (config.json, safetensors headers). nlohmann's callback-based depth limit is
// quadratic in the members of nested objects, hence this scan.
#pragma once

#include <string_view>

namespace ds41 {

// True when brackets outside strings nest deeper than max_depth (the root is depth 1).
// Malformed input is left to the parser; this only bounds the tree it could build.
inline bool json_nesting_exceeds(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (ch == '\\') escaped = true;
      else if (ch == '"') in_string = false;
      continue;
    }
    if (ch == '"') in_string = true;
    else if (ch == '{' || ch == '[') {
      if (++depth > max_depth) return true;
    } else if (ch == '}' || ch == ']') {
      --depth;
    }
  }
  return false;
}

}  // namespace ds41
