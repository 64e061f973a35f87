// Bit parity on every CPU (README "Numerics"): host code is built with -ffp-contract=off, so
// a*b+c rounds the product before the add on every architecture. With contraction (GCC's default
// for GNU C++ wherever the target has FMA: aarch64 always, x86 with -mfma/-march=native) the
// expression below becomes one fused multiply-add and returns 2^-26 instead of 0, and the
// reference and the quantizers give different bits on different machines.
//
// On x86-64 the function is compiled for an FMA target (target attribute) so that this test bites
// on the CI machine too: without -ffp-contract=off it fails there (checked: 1.49e-08 != 0).
#include <gtest/gtest.h>

namespace ds41 {
namespace {

#if defined(__x86_64__)
#define DS41_FMA_TARGET __attribute__((target("fma")))
bool cpu_has_fma() { return __builtin_cpu_supports("fma"); }
#else
#define DS41_FMA_TARGET
bool cpu_has_fma() { return true; }
#endif

// Not inlined and fed through volatile so the compiler cannot fold the expression at compile time.
DS41_FMA_TARGET __attribute__((noinline)) float mul_add(float a, float b, float c) { return a * b + c; }

TEST(FpContract, MultiplyAddIsNotFused) {
  if (!cpu_has_fma()) GTEST_SKIP() << "this CPU has no FMA: nothing could be fused";
  volatile float a = 1.0f + 0x1p-13f;  // a*a = 1 + 2^-12 + 2^-26 exactly; float keeps 1 + 2^-12
  volatile float c = -(1.0f + 0x1p-12f);
  const float r = mul_add(a, a, c);
  EXPECT_EQ(r, 0.0f) << "a*b+c was contracted into an FMA (got " << r
                     << "): the build must pass -ffp-contract=off for host code";
}

}  // namespace
}  // namespace ds41
