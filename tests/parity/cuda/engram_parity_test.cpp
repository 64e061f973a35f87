// Parity of the CUDA Engram kernels (backends/cuda/engram_kernels.h, MODEL_SPEC 3.2.4) with the
// CPU reference: the gather of 24 dequantized 256-wide rows per position from a 1M-row table
// (E4M3 incl. NaN codes, E8M0 per 32), and the per-stream gate update at C = 4, h = 5120 with
// keys and value read from the wkv output z [n, 5 * 5120] and DEAD rows.
#include <gtest/gtest.h>

#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/engram_kernels.h"
#include "kernel_parity_util.h"

namespace ds41::cuda::parity {
namespace {

using backends::cpu::CpuBackend;

TEST(EngramParity, EngramGather) {
  DS41_SKIP_WITHOUT_GPU();
  const int64_t rows = 1000000, dim = 256, cols = 24;
  auto table = rand_bytes(static_cast<size_t>(rows * dim), 500);  // any E4M3 byte, NaN codes included
  auto scale = rand_e8m0(static_cast<size_t>(rows * dim / 32), 501, 100, 140);
  Dev<uint8_t> dt(table), ds(scale);
  CpuBackend cpu(nullptr);
  for (int64_t n : {1, 300}) {
    Rng r(502 + n);
    std::vector<int64_t> ids(n * cols);
    for (auto& id : ids) id = static_cast<int64_t>(r.next() % rows);
    ids[0] = rows - 1;
    ids[cols - 1] = 0;
    std::vector<float> want(n * cols * dim);
    cpu.engram_gather(table.data(), scale.data(), dim, ids.data(), n, cols, want.data());
    Dev<int64_t> di(ids);
    Dev<float> dout(want.size());
    Status s = run_engram_gather(dt.p, ds.p, rows, dim, di.p, n, cols, dout.p, nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
    report("engram_gather", dims({rows, dim}) + " cols=24 n=" + std::to_string(n),
           count_bit_diffs(dout.get(), want), 0, "exact (bit-exact dequantization)");
  }
}

TEST(EngramParity, EngramUpdate) {
  DS41_SKIP_WITHOUT_GPU();
  struct C {
    int64_t n, c, h;
    bool dead;
  };
  CpuBackend cpu(nullptr);
  uint64_t seed = 600;
  // h = 9000 > 8 x 1024: the kernel's chunked path (values reloaded for the update); h = 37: one
  // warp, a partial batch.
  for (const C& c : std::vector<C>{{1, 4, 5120, false}, {300, 4, 5120, true}, {9, 2, 192, true}, {2, 3, 9000, false},
                                   {5, 4, 37, true}}) {
    auto streams = rand_floats(static_cast<size_t>(c.n * c.c * c.h), ++seed, 3.0f);
    auto z = rand_floats(static_cast<size_t>(c.n * (c.c + 1) * c.h), ++seed, 2.0f);
    auto omega = rand_floats(static_cast<size_t>(c.c * c.h), ++seed, 1.5f);
    std::vector<uint8_t> dead(c.n, 0);
    if (c.dead)
      for (int64_t r = 0; r < c.n; r += 4) dead[r] = 1;
    // The reference takes keys [n, C, H] and value [n, H] split out of z.
    std::vector<float> keys(c.n * c.c * c.h), value(c.n * c.h);
    for (int64_t r = 0; r < c.n; ++r) {
      std::copy(&z[r * (c.c + 1) * c.h], &z[r * (c.c + 1) * c.h + c.c * c.h], &keys[r * c.c * c.h]);
      std::copy(&z[r * (c.c + 1) * c.h + c.c * c.h], &z[(r + 1) * (c.c + 1) * c.h], &value[r * c.h]);
    }
    auto want_s = streams;
    std::vector<float> want_g(c.n * c.c);
    cpu.engram_update(want_s.data(), keys.data(), value.data(), omega.data(), c.dead ? dead.data() : nullptr,
                      c.n, c.c, c.h, 1e-20f, want_g.data());
    Dev<float> ds(streams), dz(z), dom(omega), dg(want_g.size());
    Dev<uint8_t> dd(dead);
    Status s =
        run_engram_update(ds.p, dz.p, dom.p, c.dead ? dd.p : nullptr, c.n, c.c, c.h, 1e-20f, dg.p, nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
    const std::string shape = dims({c.n, c.c, c.h}) + (c.dead ? " dead rows" : "");
    const char* why = "fp64 sums in another order: g equal unless its fp32 rounding flips (1 ulp)";
    report("engram_update gate", shape, rel_elem(dg.get(), want_g), 2.5e-7, why);
    report("engram_update S", shape, rel_to_max(ds.get(), want_s), 1e-6, why);
  }
}

}  // namespace
}  // namespace ds41::cuda::parity
