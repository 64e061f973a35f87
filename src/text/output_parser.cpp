// ds41 text: completion -> reasoning / content / tool calls (see output_parser.h).
#include "text/output_parser.h"

#include <nlohmann/json.hpp>
#include <set>

#include "text/python_json.h"
#include "text/utf8.h"

namespace ds41::text {
namespace {

// A cursor over the DSML block; every method fails instead of reading out of bounds.
class Cursor {
 public:
  explicit Cursor(std::string_view s) : s_(s) {}
  bool eat(std::string_view lit) {
    if (s_.substr(pos_, lit.size()) != lit) return false;
    pos_ += lit.size();
    return true;
  }
  bool at(std::string_view lit) const { return s_.substr(pos_, lit.size()) == lit; }
  // Text up to the first occurrence of `stop` (consumed); false if absent.
  bool until(std::string_view stop, std::string_view* out) {
    const size_t p = s_.find(stop, pos_);
    if (p == std::string_view::npos) return false;
    *out = s_.substr(pos_, p - pos_);
    pos_ = p + stop.size();
    return true;
  }
  std::string_view rest() const { return s_.substr(pos_); }

 private:
  std::string_view s_;
  size_t pos_ = 0;
};

std::string dsml(std::string_view head, std::string_view tail) {
  return std::string(head) + std::string(kDsmlToken) + std::string(tail);
}

bool only_whitespace(std::string_view s) {
  for (char c : s)
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return false;
  return true;
}

}  // namespace

bool parse_dsml_tool_calls(std::string_view block, std::vector<ToolCall>* calls_out) {
  static const std::string kCallsOpen = dsml("<", " calls>\n"), kCallsClose = dsml("</", " calls>"),
                           kInvokeOpen = dsml("<", " invoke name=\""), kInvokeClose = dsml("</", " invoke>"),
                           kParamOpen = dsml("<", " parameter name=\""),
                           kParamClose = dsml("</", " parameter>");
  Cursor c(block);
  if (!c.eat(kCallsOpen)) return false;
  std::vector<ToolCall> calls;
  for (;;) {
    if (c.eat(kCallsClose)) break;
    if (!c.eat(kInvokeOpen)) return false;
    std::string_view name;
    if (!c.until("\">\n", &name) || name.empty() || name.find('\n') != std::string_view::npos ||
        name.find(kDsmlToken) != std::string_view::npos)
      return false;
    std::string args = "{";
    std::set<std::string> seen;
    bool first = true;
    for (;;) {
      if (c.eat(kInvokeClose) || c.eat("\n" + kInvokeClose)) break;  // the second: no parameters
      if (!c.eat(kParamOpen)) return false;
      std::string_view key, value;
      if (!c.until("\" string=\"", &key) || key.find(kDsmlToken) != std::string_view::npos ||
          key.find('\n') != std::string_view::npos)
        return false;
      bool is_string;
      if (c.eat("true\">"))
        is_string = true;
      else if (c.eat("false\">"))
        is_string = false;
      else
        return false;
      if (!c.until(kParamClose, &value)) return false;
      // A value must not swallow other DSML tags (interleaved / truncated blocks).
      if (value.find(kDsmlToken) != std::string_view::npos) return false;
      if (!seen.insert(std::string(key)).second) return false;  // duplicate parameter
      if (!first) args += ", ";
      first = false;
      args += python_json_dumps(std::string(key));
      args += ": ";
      if (is_string) {
        args += python_json_dumps(std::string(value));
      } else {
        if (nlohmann::json::accept(value.begin(), value.end()) == false) return false;
        args += value;
      }
      if (!c.eat("\n")) return false;
    }
    args += "}";
    calls.push_back(ToolCall{"", std::string(name), std::move(args)});
    if (!c.eat("\n")) {
      // "</｜DSML｜ calls>" may follow the last invoke directly only with the newline.
      return false;
    }
  }
  if (calls.empty() || !only_whitespace(c.rest())) return false;
  *calls_out = std::move(calls);
  return true;
}

ParsedOutput parse_assistant_output(std::string_view input, bool thinking) {
  ParsedOutput out;
  // Decoded text is valid UTF-8 already; anything else is repaired first so that the JSON we
  // build from it is valid.
  std::string repaired;
  std::string_view text = input;
  if (!utf8_is_valid(input)) {
    repaired = utf8_sanitize(input);
    text = repaired;
  }
  std::string_view rest = text;
  if (thinking) {
    const size_t p = rest.find(kThinkEnd);
    if (p == std::string_view::npos) {
      // Truncated while reasoning: everything is reasoning (minus a final EOS).
      const size_t e = rest.find(kEosToken);
      out.saw_eos = e != std::string_view::npos;
      out.reasoning_content = std::string(rest.substr(0, e));
      return out;
    }
    out.reasoning_complete = true;
    out.reasoning_content = std::string(rest.substr(0, p));
    rest = rest.substr(p + kThinkEnd.size());
  }
  const size_t e = rest.find(kEosToken);
  if (e != std::string_view::npos) {
    out.saw_eos = true;
    rest = rest.substr(0, e);
  }
  static const std::string kStart = "\n\n" + dsml("<", " calls>");
  const size_t t = rest.find(kStart);
  if (t == std::string_view::npos) {
    out.content = std::string(rest);
    return out;
  }
  if (parse_dsml_tool_calls(rest.substr(t + 2), &out.tool_calls)) {
    out.content = std::string(rest.substr(0, t));
  } else {
    out.tool_calls_malformed = true;
    out.content = std::string(rest);
  }
  return out;
}

}  // namespace ds41::text
