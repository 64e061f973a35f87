// --numerics fp8-act on the GPU engine (quant/act_quant.h; gpu_forward.h act_input): every FP8 / FP4
// linear's input quantized per 32 along K as the CPU reference's linears do, the prefill GEMMs on one
// bfloat16 part. Checked against the CPU reference in the same mode, on the tiny golden model and the
// small preset (both past every limit of their config), for a one-shot prefill (tensor-core GEMMs), the
// same prompt on the GEMV / tile kernels only, and decode steps after it.
//
// FP8 activations make the model more sensitive to float noise than the exact path: a value one ulp
// on the other side of an E4M3 rounding midpoint moves by a whole E4M3 step (golden README
// "Discontinuities"), and the CPU's float64 norms and sums put some values on the other side where the
// GPU's kernels do not. So the GPU runs are compared with the CPU strictly up to the first row where
// they part (the flip), which must come late enough to mean something: on the H100 (2026-12-07) the
// tiny model's rows 0..50 agreed within 5e-3 and row 51 parted (0.17), the small model's rows 0..1 (its
// random weights amplify more; GpuCpuParity sees ~3 rows there in the exact path too). On those rows
// the fp8-act GPU must also differ from the exact GPU by far more than the tolerance: a linear that
// missed (or wrongly got) its quantization would show from row 0. The two GPU forms (the tensor-core
// prefill and the GEMV one) agree with each other further (114 rows on the tiny model).
#include <gtest/gtest.h>

#include "backends/cuda/tc_gemv_kernels.h"
#include "gpu/engine/gpu_test_util.h"

namespace ds41::testing {
namespace {

struct Fp8Case {
  const char* name;
  bool small;
  int64_t min_rows;  // rows from 0 on which the GPU must match the CPU before the first flip
};


class GpuFp8Act : public ::testing::TestWithParam<Fp8Case> {
 protected:
  void SetUp() override {
    DS41_SKIP_WITHOUT_GPU();
    dir_ = GetParam().small ? small_model_dir() : golden_dir();
    backends::cpu::CpuBackendOptions o;
    o.act = quant::ActNumerics::kFp8Block32;
    cpu_ = load_cpu_model(dir_, 8, o);
    ASSERT_TRUE(cpu_.model);
    dev_ = load_device_model(dir_);
    ASSERT_TRUE(dev_);
    len_ = GetParam().small ? 160 : 297;
  }
  // All logits rows of a one-shot prefill of toks on e, then one row per decode step of extra.
  std::vector<float> run(gpu::CudaEngine& e, std::span<const int32_t> toks, std::span<const int32_t> extra) {
    const int64_t V = cpu_.model->config().vocab_size;
    auto a = e.create_sequence();
    EXPECT_TRUE(a.ok());
    std::vector<engine::StepItem> items{{*a, toks, true}};
    std::vector<model::SequenceOutput> got;
    Status s = e.forward(items, model::LogitsRows::kAll, false, &got);
    EXPECT_TRUE(s.ok()) << s.message();
    std::vector<float> logits = s.ok() ? got[0].logits : std::vector<float>{};
    for (int32_t t : extra) {
      engine::StepItem di{*a, std::span<const int32_t>(&t, 1), true};
      engine::StepOutput so;
      s = e.step(std::span<const engine::StepItem>(&di, 1), &so);
      EXPECT_TRUE(s.ok()) << s.message();
      if (!s.ok()) break;
      logits.insert(logits.end(), so.logits.begin() + so.row[0] * V, so.logits.begin() + (so.row[0] + 1) * V);
    }
    return logits;
  }
  // The same rows from the CPU reference (fp8-act): the prompt's, then one per decode step.
  std::vector<float> cpu_run(std::span<const int32_t> toks, std::span<const int32_t> extra) {
    auto st = cpu_.model->new_sequence();
    model::ForwardOptions fo;
    fo.logits = model::LogitsRows::kAll;
    auto r = cpu_.model->prefill(*st, toks, 0, fo);
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return {};
    std::vector<float> logits = r->logits;
    for (int32_t t : extra) {
      auto o = cpu_.model->decode_step(*st, t, model::ForwardOptions{});
      EXPECT_TRUE(o.ok()) << o.status().message();
      if (!o.ok()) break;
      logits.insert(logits.end(), o->logits.begin(), o->logits.end());
    }
    return logits;
  }
  std::string dir_;
  TestModel cpu_;
  std::unique_ptr<gpu::DeviceModel> dev_;
  int64_t len_ = 0;
};

TEST_P(GpuFp8Act, PrefillAndDecodeMatchTheCpuReference) {
  const model::ModelConfig& c = cpu_.model->config();
  const int64_t V = c.vocab_size;
  const std::string name = GetParam().name;
  const auto toks = seeded_tokens(len_ + 6, V, 3);
  const std::span<const int32_t> prompt(toks.data(), len_), extra(toks.data() + len_, 6);
  const std::vector<float> want = cpu_run(prompt, extra);  // CPU reference, fp8-act
  // GPU, fp8-act: the tensor-core prefill (one bfloat16 part) and the GEMV / tile kernels only.
  auto tc = make_engine(*dev_, 400, 4096, 1024, 128, -1, -1, -1, quant::ActNumerics::kFp8Block32);
  auto gemv = make_engine(*dev_, 400, 4096, 1024, /*tensor_core_min_rows=*/0, -1, -1, -1,
                          quant::ActNumerics::kFp8Block32);
  auto exact = make_engine(*dev_, 400);
  ASSERT_TRUE(tc && gemv && exact);
  const std::vector<float> a = run(*tc, prompt, extra);
  std::vector<float> b;
  {
    struct TcGemvBack {
      ~TcGemvBack() { cuda::set_tc_gemv_for_tests(-1); }
    } back;
    cuda::set_tc_gemv_for_tests(0);
    b = run(*gemv, prompt, extra);
  }
  const std::vector<float> ex = run(*exact, prompt, {});
  ASSERT_EQ(a.size(), want.size());
  ASSERT_EQ(b.size(), want.size());
  const int64_t all = static_cast<int64_t>(a.size()) / V;
  std::cout << name << ": fp8-act GPU forms agree on " << flip_free_rows(a, b, V, kTolGpuLogits) << " of "
            << all << " rows\n";
  // Both GPU forms against the CPU up to their first parting; it comes at min_rows or later.
  for (const std::vector<float>* got : {&a, static_cast<const std::vector<float>*>(&b)}) {
    const int64_t rows = flip_free_rows(want, *got, V, kTolGpuLogits);
    std::cout << name << (got == &a ? " tensor-core" : " GEMV") << " fp8-act GPU vs CPU: first " << rows
              << " rows within " << kTolGpuLogits << "\n";
    EXPECT_GE(rows, GetParam().min_rows) << name << (got == &a ? " tensor-core" : " GEMV");
    // On those rows the mode is what makes the numbers: fp8-act vs exact differ by 10x the tolerance on
    // at least 3 in 4 of them.
    int64_t far = 0;
    for (int64_t r = 0; r < GetParam().min_rows; ++r) far += row_error(&ex[r * V], &(*got)[r * V], V) > 10 * kTolGpuLogits;
    EXPECT_GE(4 * far, 3 * GetParam().min_rows) << name << ": fp8-act rows too close to the exact path's";
  }
  // Decode steps (the row-invariant GEMVs, each FP8 / FP4 input quantized before its launch) where the long
  // prompt's rows still agree: a 20-token prompt and 10 decode steps, all 30 rows within the tolerance (the tiny
  // model: its first parting was at row 51; the small model parts too early for this).
  if (GetParam().min_rows >= 30) {
    const std::span<const int32_t> p20(toks.data(), 20), d10(toks.data() + 20, 10);
    const std::vector<float> want2 = cpu_run(p20, d10);
    const std::vector<float> got2 = run(*tc, p20, d10);
    ASSERT_EQ(got2.size(), want2.size());
    expect_rows_close(want2, got2, V, kTolGpuLogits, name + " fp8-act 20-token prefill + 10 decode steps vs CPU");
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuFp8Act,
                         ::testing::Values(Fp8Case{"tiny", false, 32}, Fp8Case{"small", true, 2}),
                         [](const ::testing::TestParamInfo<Fp8Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace ds41::testing
