// cuBLAS / cuBLASLt opened on first use (backends/cuda/cublas_lazy.cpp): not mapped into a process
// that never calls them (their static initialisers cost ~0.4 s per process), opened by the first
// call, then cuBLAS's own answers. Needs the CUDA toolkit's libraries, not a GPU: runs in CI.
// ctest runs each test in its own process; run together, a test that finds the library already
// mapped by an earlier one skips its "not mapped yet" half.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "backends/cuda/cublas_lazy.h"

namespace ds41::cuda {
namespace {

bool mapped(const std::string& stem) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("/" + stem + ".so") != std::string::npos) return true;
  return false;
}

TEST(CublasLazy, CublasLtOpensOnFirstCall) {
  if (mapped("libcublasLt")) GTEST_SKIP() << "libcublasLt already mapped by an earlier test of this process";
  // The test binary links the whole CUDA backend, as ds41 does: nothing opened cuBLASLt at start.
  EXPECT_FALSE(mapped("libcublas"));
  const size_t v = cublasLtGetVersion();
  EXPECT_TRUE(mapped("libcublasLt")) << cublas_load_error();
  EXPECT_EQ(v / 10000, static_cast<size_t>(CUBLAS_VER_MAJOR)) << "version " << v;
  EXPECT_EQ(v, static_cast<size_t>(CUBLAS_VERSION)) << "the runtime library is not the headers' version";
}

TEST(CublasLazy, CublasOpensOnFirstCallAndAnswersWithItsOwnTexts) {
  if (mapped("libcublas")) GTEST_SKIP() << "libcublas already mapped by an earlier test of this process";
  EXPECT_TRUE(cublas_available()) << cublas_load_error();
  EXPECT_TRUE(mapped("libcublas"));
  EXPECT_EQ(cublas_load_error(), "");
  // cuBLAS's own status texts (the fallback text would name the library that did not open).
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  const std::string text = cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(text.find("not available"), std::string::npos) << text;
  EXPECT_FALSE(text.empty());
}

}  // namespace
}  // namespace ds41::cuda
