// ds41 text: Python-compatible json.dumps (see python_json.h).
#include "text/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace ds41::text {
namespace {

void dump_string(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void dump(const nlohmann::ordered_json& v, std::string* out) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::null: *out += "null"; break;
    case nlohmann::ordered_json::value_t::boolean: *out += v.get<bool>() ? "true" : "false"; break;
    case nlohmann::ordered_json::value_t::number_integer: *out += std::to_string(v.get<int64_t>()); break;
    case nlohmann::ordered_json::value_t::number_unsigned: *out += std::to_string(v.get<uint64_t>()); break;
    case nlohmann::ordered_json::value_t::number_float: *out += python_float_repr(v.get<double>()); break;
    case nlohmann::ordered_json::value_t::string: dump_string(v.get_ref<const std::string&>(), out); break;
    case nlohmann::ordered_json::value_t::array: {
      out->push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first) *out += ", ";
        first = false;
        dump(e, out);
      }
      out->push_back(']');
      break;
    }
    case nlohmann::ordered_json::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) *out += ", ";
        first = false;
        dump_string(it.key(), out);
        *out += ": ";
        dump(it.value(), out);
      }
      out->push_back('}');
      break;
    }
    default: *out += "null"; break;  // binary / discarded: not produced by JSON text
  }
}

}  // namespace

std::string python_float_repr(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);  // shortest: d.ddde±XX
  std::string sci(buf, r.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  if (exp >= -4 && exp < 16) {
    std::string s;
    if (exp < 0) {
      s = "0." + std::string(-exp - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      s = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      s = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
    return sign + s;
  }
  std::string m = digits.size() > 1 ? digits.substr(0, 1) + "." + digits.substr(1) : digits;
  char eb[16];
  std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return sign + m + eb;
}

std::string python_json_dumps(const nlohmann::ordered_json& v) {
  std::string out;
  dump(v, &out);
  return out;
}

}  // namespace ds41::text
