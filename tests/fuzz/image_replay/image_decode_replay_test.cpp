// CI side of the image decoder fuzzer (issue 16): every file of tests/fuzz/corpus/image through
// the fuzz entry point, then a seeded mutation run over the same corpus (byte flips, truncations,
// header-field overwrites, splices), so gcc builds without libFuzzer still feed the decoders
// hostile input. No crash, and every rejection carries a message.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "image_decode_entry.h"

namespace ds41::fuzz {
namespace {

namespace fs = std::filesystem;

std::vector<std::pair<std::string, std::vector<uint8_t>>> corpus() {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
  for (const auto& e : fs::directory_iterator(std::string(DS41_SOURCE_DIR) + "/tests/fuzz/corpus/image")) {
    std::ifstream in(e.path(), std::ios::binary);
    out.emplace_back(e.path().filename().string(), std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                                                                        std::istreambuf_iterator<char>()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ImageDecodeFuzzReplay, CorpusHoldsEveryFormatAndCorruptSeeds) {
  auto c = corpus();
  ASSERT_GE(c.size(), 25u);
  int ok = 0, bad = 0;
  for (const auto& [name, bytes] : c) {
    EXPECT_EQ(fuzz_image_decode(bytes), "") << name;
    (image::decode_image(bytes).ok() ? ok : bad)++;
  }
  EXPECT_GE(ok, 20);
  EXPECT_GE(bad, 6);
}

TEST(ImageDecodeFuzzReplay, SeededMutationsNeverCrash) {
  auto c = corpus();
  std::mt19937_64 rng(16);
  int cases = 0;
  for (int round = 0; round < 120; ++round)
    for (const auto& [name, seed] : c) {
      if (seed.empty()) continue;
      std::vector<uint8_t> b = seed;
      switch (rng() % 4) {
        case 0:  // byte flips
          for (int i = 0, n = 1 + rng() % 8; i < n; ++i)
            b[rng() % b.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
          break;
        case 1:  // truncation
          b.resize(rng() % b.size());
          break;
        case 2:  // a header field (first 64 bytes) overwritten with 0xff or 0x00 runs
          for (size_t i = rng() % std::min<size_t>(64, b.size()), n = 1 + rng() % 4; n-- && i < b.size(); ++i)
            b[i] = (rng() & 1) ? 0xff : 0x00;
          break;
        default: {  // splice with another seed's tail
          const auto& other = c[rng() % c.size()].second;
          if (!other.empty()) {
            b.resize(rng() % b.size());
            b.insert(b.end(), other.begin() + static_cast<std::ptrdiff_t>(rng() % other.size()), other.end());
          }
        }
      }
      ASSERT_EQ(fuzz_image_decode(b), "") << name << " round " << round;
      ++cases;
    }
  EXPECT_GE(cases, 3000);
}

}  // namespace
}  // namespace ds41::fuzz
