// run_l2_prefetch (backends/cuda/l2_prefetch_kernels.h): argument errors without a device; on one,
// prefetches of unaligned regions, a cap inside a region, weights' payload and scale regions, chained
// with PDL between a producer and a consumer of other buffers: nothing is written, no fault, and the
// kernels around it see the values they would without it.
#include <gtest/gtest.h>

#include <vector>

#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/l2_prefetch_kernels.h"
#include "kernel_parity_util.h"

namespace ds41::cuda::parity {
namespace {

TEST(L2Prefetch, ArgumentErrors) {
  L2Regions r;
  r.ptr[0] = nullptr;
  r.bytes[0] = 128;
  r.count = 1;
  Status st = run_l2_prefetch(r, 1 << 20, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("null"), std::string::npos) << st.message();
  static const char dummy[16] = {};
  r.ptr[0] = dummy;
  r.bytes[0] = -5;
  st = run_l2_prefetch(r, 1 << 20, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("negative"), std::string::npos) << st.message();
  r.count = L2Regions::kMax + 1;
  EXPECT_FALSE(run_l2_prefetch(r, 1 << 20, nullptr).ok());
  // Nothing to do: no launch, no error (also without a device).
  L2Regions empty;
  EXPECT_TRUE(run_l2_prefetch(empty, 1 << 20, nullptr).ok());
  r.count = 1;
  r.bytes[0] = 16;
  EXPECT_TRUE(run_l2_prefetch(r, 0, nullptr).ok());
  // add(): regions fill up, absent weights and zero sizes take none.
  L2Regions f;
  for (int i = 0; i < L2Regions::kMax; ++i) EXPECT_TRUE(f.add(dummy, 16));
  EXPECT_FALSE(f.add(dummy, 16));
  EXPECT_TRUE(f.add(dummy, 0));
  EXPECT_TRUE(f.add(DeviceWeight{}));
  EXPECT_EQ(f.total(), 16 * L2Regions::kMax);
}

TEST(L2Prefetch, ChangesNothing) {
  DS41_SKIP_WITHOUT_GPU();
  const bool emu = std::getenv("DS41_PARITY_SMALL") != nullptr;
  const size_t n = emu ? size_t{1} << 14 : size_t{24} << 20;  // floats: 96 MB on a device
  const std::vector<float> host = rand_floats(n, 91);
  Dev<float> w(host), a(std::vector<float>(4096, 1.5f));
  DeviceWeight dw;
  dw.format = quant::WeightFormat::kFp8Tiles;
  dw.out_dim = 64;
  dw.in_dim = 96;  // payload 6144 B, scales 2 x 3 B: odd sizes
  dw.data = reinterpret_cast<const uint8_t*>(w.p) + 3;
  dw.scale = reinterpret_cast<const uint8_t*>(w.p) + 7001;
  cudaStream_t stream = nullptr;  // our own: launch() asks for PDL only there
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  struct StreamGone {
    cudaStream_t s;
    ~StreamGone() { cudaStreamDestroy(s); }
  } stream_gone{stream};
  for (int64_t cap : {int64_t{1} << 20, int64_t{24} << 20, int64_t{1} << 40}) {
    L2Regions r;
    ASSERT_TRUE(r.add(reinterpret_cast<const uint8_t*>(w.p) + 5, static_cast<int64_t>(n * sizeof(float)) - 9));
    ASSERT_TRUE(r.add(dw));
    ASSERT_TRUE(r.add(w.p, 1));  // one byte: no whole 16-byte unit
    // producer -> prefetch -> consumer on one stream (PDL): a *= 2, prefetch, a *= 0.5
    ASSERT_TRUE(run_scale(a.p, 4096, 2.0f, stream).ok());
    const Status st = run_l2_prefetch(r, cap, stream);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_TRUE(run_scale(a.p, 4096, 0.5f, stream).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  const std::vector<float> got = w.get(), ga = a.get();
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ += got[i] != host[i];
  for (float v : ga) differ += v != 1.5f;
  report("l2_prefetch", "prefetched regions and the chained buffers: values changed", static_cast<double>(differ), 0,
         "a prefetch writes nothing");
  EXPECT_EQ(differ, 0u);
}

}  // namespace
}  // namespace ds41::cuda::parity
