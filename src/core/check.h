// ds41 core: DS41_CHECK for broken invariants (programmer errors), never for bad input.
// Aborts with file:line and the failed condition. Recoverable failures use Status.
#pragma once

#include <cstdio>
#include <cstdlib>

#define DS41_CHECK(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "ds41: CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      __VA_OPT__(std::fprintf(stderr, "  %s\n", ::ds41::check_detail_(__VA_ARGS__));)  \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

namespace ds41 {
inline const char* check_detail_(const char* s) { return s; }
}  // namespace ds41
