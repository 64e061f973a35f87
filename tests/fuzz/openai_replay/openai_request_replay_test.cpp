// CI side of the OpenAI request fuzzer (issue 12): every body of tests/fuzz/corpus/openai_request
// goes through the libFuzzer target's entry point (openai_request_entry.h), then a short seeded
// mutation run over the same corpus (byte flips, truncations, splices, dictionary tokens), so gcc
// builds without libFuzzer still exercise the parsers with hostile input. The entry point checks
// the invariants (400 with a message for bad input, nothing out of range accepted).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "openai_request_entry.h"

namespace ds41::fuzz {
namespace {

namespace fs = std::filesystem;

std::vector<std::pair<std::string, std::string>> corpus() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e :
       fs::directory_iterator(std::string(DS41_SOURCE_DIR) + "/tests/fuzz/corpus/openai_request")) {
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    out.emplace_back(e.path().filename().string(), ss.str());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(OpenAiRequestFuzzReplay, CorpusHoldsValidAndInvalidBodies) {
  auto c = corpus();
  ASSERT_GE(c.size(), 20u);
  int chat_ok = 0, cmpl_ok = 0, both_bad = 0;
  for (const auto& [name, body] : c) {
    EXPECT_EQ(fuzz_openai_request(body), "") << name;
    const bool a = server::parse_chat_request(body).ok(), b = server::parse_completion_request(body).ok();
    chat_ok += a;
    cmpl_ok += b;
    both_bad += !a && !b;
  }
  // The seeds reach deep into both parsers (accepted bodies) and into their rejections.
  EXPECT_GE(chat_ok, 4);
  EXPECT_GE(cmpl_ok, 3);
  EXPECT_GE(both_bad, 10);
}

TEST(OpenAiRequestFuzzReplay, SeededMutationsKeepTheInvariants) {
  const auto c = corpus();
  const char* dict[] = {"{",
                        "}",
                        "[",
                        "]",
                        "\"",
                        ",",
                        ":",
                        "null",
                        "true",
                        "-1",
                        "1e308",
                        "0.5",
                        "18446744073709551616",
                        "\\ud800",
                        "\"messages\"",
                        "\"role\"",
                        "\"content\"",
                        "\"prompt\"",
                        "\"max_tokens\"",
                        "\"stop\"",
                        "\"tools\"",
                        "\"top_logprobs\""};
  uint64_t s = 12345;
  auto rnd = [&s] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return s >> 33;
  };
  int runs = 0;
  for (int i = 0; i < 30000; ++i) {
    std::string b = c[rnd() % c.size()].second;
    const int edits = 1 + static_cast<int>(rnd() % 4);
    for (int k = 0; k < edits; ++k) {
      const size_t pos = b.empty() ? 0 : rnd() % (b.size() + 1);
      switch (rnd() % 5) {
        case 0:
          if (!b.empty()) b[std::min(pos, b.size() - 1)] = static_cast<char>(rnd() & 0xff);
          break;
        case 1: b.resize(pos); break;
        case 2: b.insert(pos, dict[rnd() % (sizeof dict / sizeof *dict)]); break;
        case 3:
          if (!b.empty()) b.erase(std::min(pos, b.size() - 1), 1 + rnd() % 8);
          break;
        default: {
          const std::string& o = c[rnd() % c.size()].second;
          if (!o.empty()) b.insert(pos, o.substr(rnd() % o.size(), 1 + rnd() % 32));
        }
      }
    }
    const std::string broken = fuzz_openai_request(b);
    ASSERT_EQ(broken, "") << "input: " << b;
    ++runs;
  }
  EXPECT_EQ(runs, 30000);
}

}  // namespace
}  // namespace ds41::fuzz
