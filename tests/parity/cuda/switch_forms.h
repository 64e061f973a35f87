// ds41 tests/parity/cuda: a parity body run under both forms of a test-overridable switch (the launch.h and
// kernel switches' set_*_for_tests: 1 on, 0 off, -1 back to the environment), so each form's bits are checked.
#pragma once

#include <gtest/gtest.h>

namespace ds41::cuda::parity {

// body() with set(1) (traced as `on`), then with set(0) (`off`); the environment's setting after.
template <class Body>
void for_both_forms(void (*set)(int), const char* on, const char* off, Body&& body) {
  for (const int mode : {1, 0}) {
    SCOPED_TRACE(mode ? on : off);
    set(mode);
    body();
  }
  set(-1);
}

}  // namespace ds41::cuda::parity
