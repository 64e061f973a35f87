// Issue 16, the Engine thread model (engine.h): CpuEngine::encode_images on a second thread (as the
// engine loop's ImageEncoder calls it) while step() runs prefills and decodes on this one gives the
// serial path's span rows and logits bit for bit, on the public tiny vision model. scripts/test.sh
// runs it under ThreadSanitizer (CpuEngineConcurrency.*): a shared mutable state between the tower
// and the forward would be reported there.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "engine/cpu_engine.h"
#include "golden/golden_arrays.h"
#include "image/image_decode.h"
#include "image/preprocess.h"
#include "model/image_input.h"
#include "unit/engine/loop_test_util.h"

namespace ds41::engine {
namespace {

std::string vision_dir() { return std::string(DS41_SHARED_DIR) + "/golden/v41-tiny-vision-public"; }

TEST(CpuEngineConcurrency, EncodeWhileSteppingIsBitIdenticalToSerial) {
  ds41::testing::TestModel tm = ds41::testing::load_golden_model(2, vision_dir());
  ASSERT_TRUE(tm.model && tm.model->vision_tower());
  CpuEngine eng(tm.model.get(), "tiny-vision");
  const int64_t V = eng.info().vocab_size;
  std::vector<image::PreparedImage> prepared;
  for (int k : {0, 1}) {
    auto d = image::decode_image_file(vision_dir() + "/images/image" + std::to_string(k) + ".png");
    ASSERT_TRUE(d.ok()) << d.status().message();
    auto p = image::prepare_image(d->rgb, model::vision_plan_config(tm.model->config()));
    ASSERT_TRUE(p.ok()) << p.status().message();
    prepared.push_back(std::move(p).value());
  }
  std::vector<const image::PreparedImage*> ptrs;
  for (const auto& p : prepared) ptrs.push_back(&p);

  // Two sequences: a 40-token prefill each, then 6 batched decode steps; every logits row.
  const std::vector<int32_t> pa = looptest::random_prompt(40, 11, static_cast<int32_t>(V - 1)),
                             pb = looptest::random_prompt(40, 12, static_cast<int32_t>(V - 1));
  auto run_steps = [&]() {
    std::vector<float> all;
    auto a = eng.create_sequence(), b = eng.create_sequence();
    EXPECT_TRUE(a.ok() && b.ok());
    if (!a.ok() || !b.ok()) return all;
    StepOutput out;
    std::vector<StepItem> items{{*a, pa, true}, {*b, pb, true}};
    EXPECT_TRUE(eng.step(items, &out).ok());
    all.insert(all.end(), out.logits.begin(), out.logits.end());
    for (int t = 0; t < 6; ++t) {
      const int32_t ta = 3 + t, tb = 9 + t;
      std::vector<StepItem> dec{{*a, std::span<const int32_t>(&ta, 1), true},
                                {*b, std::span<const int32_t>(&tb, 1), true}};
      EXPECT_TRUE(eng.step(dec, &out).ok());
      all.insert(all.end(), out.logits.begin(), out.logits.end());
    }
    EXPECT_TRUE(eng.free_sequence(*a).ok());
    EXPECT_TRUE(eng.free_sequence(*b).ok());
    return all;
  };

  auto serial_rows = eng.encode_images(ptrs);
  ASSERT_TRUE(serial_rows.ok()) << serial_rows.status().message();
  ASSERT_EQ(serial_rows->size(), 2u);
  const std::vector<float> serial_logits = run_steps();
  ASSERT_FALSE(serial_logits.empty());

  // The encoder thread runs the tower at least twice and until this thread has stepped two rounds,
  // so the rounds overlap encodes; each round against the serial logits.
  std::atomic<bool> encoding_done{false};
  std::atomic<int> rounds{0};
  std::vector<Result<std::vector<std::vector<float>>>> concurrent;
  std::thread encoder([&] {
    while (concurrent.size() < 2 || rounds.load() < 2) concurrent.push_back(eng.encode_images(ptrs));
    encoding_done.store(true);
  });
  while (!encoding_done.load() || rounds.load() < 2) {
    const std::vector<float> l = run_steps();
    EXPECT_EQ(l, serial_logits) << "round " << rounds.load();
    ++rounds;
  }
  encoder.join();
  ASSERT_GE(concurrent.size(), 2u);
  for (const auto& c : concurrent) {
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(*c, *serial_rows);
  }
  std::printf("%d step rounds, %zu tower batches of 2 images, concurrently\n", rounds.load(),
              concurrent.size());
}

}  // namespace
}  // namespace ds41::engine
