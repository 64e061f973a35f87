// ds41 core: DS41_CHECK for broken invariants (programmer errors), never for bad input.
// Aborts with file:line, the failed condition and the values involved. Recoverable failures use
// Status.
//
//   DS41_CHECK(cond);                              // condition text only
//   DS41_CHECK(cond, "literal");                   // plus a message
//   DS41_CHECK(cond, "id %lld of %lld", id, rows); // plus a printf-style message (checked by the
//                                                  // compiler's format warnings)
//   DS41_CHECK_EQ(a, b) / _NE / _LT / _LE / _GT / _GE, optionally followed by a message as above:
//   prints both expressions and both values, e.g.
//     ds41: CHECK failed at x.cpp:12: w.out_dim % groups == 0 (7 vs. 0)
// The operands of DS41_CHECK_<OP> are evaluated exactly once. Values print as numbers (integers,
// floating point with 9 significant digits, enums as their underlying integer), bools as
// true/false, C strings and std::string(_view) as text and other pointers as addresses.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>

namespace ds41::check_detail {

// Prints "CHECK failed at file:line: cond<values>" and the message, then aborts.
[[noreturn]] inline void fail_(const char* file, int line, const char* cond, const std::string& values,
                               const char* msg) {
  std::fprintf(stderr, "ds41: CHECK failed at %s:%d: %s%s\n", file, line, cond, values.c_str());
  if (msg != nullptr && msg[0] != '\0') std::fprintf(stderr, "  %s\n", msg);
  std::fflush(stderr);
  std::abort();
}

// The optional message: nothing, a literal, or a printf format with arguments.
inline std::string message_() { return {}; }
#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 1, 2)))
#endif
inline std::string
message_(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string s;
  if (n > 0) {
    s.resize(static_cast<size_t>(n) + 1);
    std::vsnprintf(s.data(), s.size(), fmt, ap2);
    s.resize(static_cast<size_t>(n));
  }
  va_end(ap2);
  return s;
}

template <typename T>
std::string value_string_(const T& v) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_enum_v<U>) {
    return value_string_(static_cast<std::underlying_type_t<U>>(v));
  } else if constexpr (std::is_same_v<U, char> || std::is_same_v<U, signed char> ||
                       std::is_same_v<U, unsigned char>) {
    return std::to_string(static_cast<int>(v));
  } else if constexpr (std::is_integral_v<U>) {
    return std::to_string(v);
  } else if constexpr (std::is_floating_point_v<U>) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(v));
    return buf;
  } else if constexpr (std::is_convertible_v<const U&, std::string_view>) {
    return "\"" + std::string(std::string_view(v)) + "\"";
  } else if constexpr (std::is_pointer_v<U> || std::is_null_pointer_v<U>) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%p", static_cast<const void*>(v));
    return buf;
  } else {
    static_assert(sizeof(U) == 0, "DS41_CHECK_<OP>: operand type has no printable value");
  }
}

// " (a vs. b)": the values of a failed comparison.
template <typename A, typename B>
std::string values_(const A& a, const B& b) {
  return " (" + value_string_(a) + " vs. " + value_string_(b) + ")";
}

}  // namespace ds41::check_detail

#define DS41_CHECK(cond, ...)                                                           \
  do {                                                                                  \
    if (!(cond)) [[unlikely]] {                                                         \
      ::ds41::check_detail::fail_(__FILE__, __LINE__, #cond, std::string(),             \
                                  ::ds41::check_detail::message_(__VA_ARGS__).c_str()); \
    }                                                                                   \
  } while (0)

// Comparison checks: both operands are evaluated once and printed on failure.
#define DS41_CHECK_OP_(op, a, b, ...)                                                          \
  do {                                                                                         \
    const auto& ds41_check_a_ = (a);                                                           \
    const auto& ds41_check_b_ = (b);                                                           \
    if (!(ds41_check_a_ op ds41_check_b_)) [[unlikely]] {                                      \
      ::ds41::check_detail::fail_(__FILE__, __LINE__, #a " " #op " " #b,                       \
                                  ::ds41::check_detail::values_(ds41_check_a_, ds41_check_b_), \
                                  ::ds41::check_detail::message_(__VA_ARGS__).c_str());        \
    }                                                                                          \
  } while (0)

#define DS41_CHECK_EQ(a, b, ...) DS41_CHECK_OP_(==, a, b __VA_OPT__(, ) __VA_ARGS__)
#define DS41_CHECK_NE(a, b, ...) DS41_CHECK_OP_(!=, a, b __VA_OPT__(, ) __VA_ARGS__)
#define DS41_CHECK_LT(a, b, ...) DS41_CHECK_OP_(<, a, b __VA_OPT__(, ) __VA_ARGS__)
#define DS41_CHECK_LE(a, b, ...) DS41_CHECK_OP_(<=, a, b __VA_OPT__(, ) __VA_ARGS__)
#define DS41_CHECK_GT(a, b, ...) DS41_CHECK_OP_(>, a, b __VA_OPT__(, ) __VA_ARGS__)
#define DS41_CHECK_GE(a, b, ...) DS41_CHECK_OP_(>=, a, b __VA_OPT__(, ) __VA_ARGS__)
