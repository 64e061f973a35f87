// Seeded mutation test of the two untrusted-input parsers (issue 2, §3): parse_safetensors_header
// and parse_model_config (+ derive_layer_schedule on accepted configs). Each case stacks 1-3
// mutations of a valid input: bit flips, byte overwrites, truncation, insertion of big/odd
// numbers, deep or unbalanced nesting, splices, deletions, bad UTF-8 / escapes, and structural
// edits of one JSON node (replaced by a value of another type or an extreme number). Asserts:
// no crash, every rejection carries a message, and every accepted safetensors header satisfies
// the parser's own contract (offsets in range, sizes = numel * dtype size, no overlap).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "fuzz/mutation/seed_inputs.h"
#include "model/config.h"
#include "model/layer_schedule.h"
#include "model/loader/safetensors.h"

namespace ds41::fuzz {
namespace {

using json = nlohmann::json;

const char* const kBigNumbers[] = {
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "-9223372036854775808",
    "-9223372036854775809",
    "1099511627776",
    "1099511627777",
    "4611686018427387904",
    "1e308",
    "1e309",
    "-1e309",
    "4.9e-324",
    "-0",
    "0.5",
    "1e2",
    "99999999999999999999999999999999",
    "-1",
    "2147483648",
    "4294967296",
    "NaN",
    "Infinity",
    "0x10",
    "00",
    "1.",
};

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  std::string mutate(const std::string& base) {
    std::string s = base;
    int n = 1 + static_cast<int>(pick(3));
    for (int i = 0; i < n; ++i) s = mutate_once(s);
    return s;
  }
  uint64_t pick(uint64_t n) { return n ? rng_() % n : 0; }

 private:
  std::string mutate_once(std::string s) {
    switch (pick(11)) {
      case 0: {  // bit flips
        for (int k = 1 + static_cast<int>(pick(4)); k > 0 && !s.empty(); --k)
          s[pick(s.size())] ^= 1 << pick(8);
        return s;
      }
      case 1: {  // overwrite bytes with JSON-significant or random characters
        static const char kChars[] = "{}[]\":,-+.0123456789eE \\ntfu\x00\xff";
        for (int k = 1 + static_cast<int>(pick(3)); k > 0 && !s.empty(); --k)
          s[pick(s.size())] = pick(2) ? kChars[pick(sizeof(kChars) - 1)] : static_cast<char>(pick(256));
        return s;
      }
      case 2:  // truncation
        return s.substr(0, pick(s.size() + 1));
      case 3: {  // insert a big / odd number at a random place
        std::string num = kBigNumbers[pick(std::size(kBigNumbers))];
        return s.insert(pick(s.size() + 1), num);
      }
      case 4: {  // replace an existing number literal
        std::vector<size_t> starts;
        for (size_t i = 0; i < s.size(); ++i)
          if ((s[i] >= '0' && s[i] <= '9') && (i == 0 || !(s[i - 1] >= '0' && s[i - 1] <= '9')))
            starts.push_back(i);
        if (starts.empty()) return s;
        size_t b = starts[pick(starts.size())], e = b;
        while (e < s.size() && ((s[e] >= '0' && s[e] <= '9') || s[e] == '.' || s[e] == 'e' || s[e] == '-'))
          ++e;
        return s.replace(b, e - b, kBigNumbers[pick(std::size(kBigNumbers))]);
      }
      case 5: {  // nested garbage: deep arrays/objects, balanced or not
        size_t depth = pick(16) == 0 ? 20000 + pick(80000) : 1 + pick(100);
        std::string open, close;
        bool obj = pick(2);
        for (size_t i = 0; i < depth; ++i) open += obj ? "{\"a\":" : "[";
        for (size_t i = 0; i < depth; ++i) close += obj ? "}" : "]";
        std::string g =
            open + (pick(2) ? "1" : "null") + (pick(4) ? close : close.substr(0, pick(close.size() + 1)));
        if (pick(2)) {  // as the value of an existing key
          size_t colon = s.find(':', pick(s.size() + 1));
          if (colon != std::string::npos) {
            size_t end = s.find_first_of(",}", colon);
            if (end != std::string::npos) return s.replace(colon + 1, end - colon - 1, g);
          }
        }
        return s.insert(pick(s.size() + 1), g);
      }
      case 6: {  // splice: duplicate a random range somewhere
        if (s.empty()) return s;
        size_t b = pick(s.size()), len = pick(std::min<size_t>(s.size() - b, 400) + 1);
        return s.insert(pick(s.size() + 1), s.substr(b, len));
      }
      case 7: {  // delete a range
        if (s.empty()) return s;
        size_t b = pick(s.size()), len = pick(std::min<size_t>(s.size() - b, 64) + 1);
        return s.erase(b, len);
      }
      case 8: {  // bad UTF-8 and escapes inside strings
        static const char* kBad[] = {
            "\\u0000", "\\ud800", "\\udfff\\ud800", "\xc3\x28", "\xf0\x28\x8c\xbc", "\xff\xfe", "\\x41",
            "\\",      "\"",      "\x01\x1f"};
        size_t q = s.find('"', pick(s.size() + 1));
        size_t at = q == std::string::npos ? pick(s.size() + 1) : q + 1;
        return s.insert(at, kBad[pick(std::size(kBad))]);
      }
      default:  // structural edit of one node (twice as likely: reaches the validators)
        return structural(s);
    }
  }

  json random_value(int depth = 0) {
    switch (pick(depth > 2 ? 8 : 11)) {
      case 0: return nullptr;
      case 1: return pick(2) == 1;
      case 2: return static_cast<int64_t>(rng_());
      case 3: return static_cast<uint64_t>(rng_());
      case 4: return -static_cast<int64_t>(pick(1000));
      case 5: return std::ldexp(static_cast<double>(pick(1000)) - 500, static_cast<int>(pick(2000)) - 1000);
      case 6: return std::string(pick(40), 'x');
      case 7: return static_cast<int64_t>(pick(70000));
      case 8: {
        json a = json::array();
        for (int i = static_cast<int>(pick(6)); i > 0; --i) a.push_back(random_value(depth + 1));
        return a;
      }
      case 9: {
        json o = json::object();
        for (int i = static_cast<int>(pick(4)); i > 0; --i)
          o["k" + std::to_string(pick(5))] = random_value(depth + 1);
        return o;
      }
      default: {  // a long array of integers (shape / offsets / id lists)
        json a = json::array();
        for (int i = static_cast<int>(pick(12)); i > 0; --i) a.push_back(static_cast<int64_t>(pick(5)) - 1);
        return a;
      }
    }
  }

  std::string structural(const std::string& s) {
    // Inputs already made deep by a nesting mutation are left alone: dump() recurses.
    bool too_deep = false;
    json j = json::parse(
        s, [&](int depth, json::parse_event_t, json&) { return !(too_deep |= depth > 64); }, false);
    if (too_deep || j.is_discarded() || !j.is_object() || j.empty()) return s;
    // Walk down a random path of objects/arrays and edit the node found there.
    json* node = &j;
    for (int d = 0; d < 4; ++d) {
      if (node->is_object() && !node->empty() && pick(3)) {
        auto it = node->begin();
        std::advance(it, pick(node->size()));
        if (pick(4) == 0) {  // edit this member: delete, rename or replace
          switch (pick(3)) {
            case 0: node->erase(it); break;
            case 1: {
              json v = *it;
              std::string k = it.key();
              node->erase(it);
              (*node)[k + (pick(2) ? "x" : "")] = v;
              break;
            }
            default: *it = random_value(); break;
          }
          return j.dump();
        }
        node = &*it;
      } else if (node->is_array() && !node->empty() && pick(3)) {
        node = &(*node)[pick(node->size())];
      } else {
        break;
      }
    }
    if (node->is_array() && pick(2)) {
      node->push_back(random_value());
    } else if (node->is_number_integer() && pick(2)) {
      // Wrapping (unsigned) arithmetic: the mutations may overflow int64 on purpose, which must
      // not be undefined behaviour in the test itself (UBSan).
      const uint64_t v = static_cast<uint64_t>(node->get<int64_t>());
      const uint64_t deltas[] = {~uint64_t{0}, 1, v, uint64_t{0} - v, uint64_t{0} - 2 * v, uint64_t{1} << 20};
      *node = static_cast<int64_t>(v + deltas[pick(std::size(deltas))]);
    } else {
      *node = random_value();
    }
    return j.dump();
  }

  std::mt19937_64 rng_;
};

TEST(ParserMutation, SafetensorsHeaderSurvivesMutations) {
  Mutator m(0x5afe7e115);
  const std::string base = kValidHeaderJson;
  auto ok0 = model::parse_safetensors_header(base, kValidHeaderDataSize);
  ASSERT_TRUE(ok0.ok()) << ok0.status().message();
  ASSERT_EQ(ok0->tensors.size(), 6u);
  int accepted = 0, rejected = 0;
  const int kCases = 52000;  // x 2 parsers = 104k cases (issue 2 asks for >= 100k)
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCases; ++i) {
    std::string text = m.mutate(base);
    uint64_t sizes[] = {kValidHeaderDataSize, kValidHeaderDataSize - 1, 0, UINT64_MAX, m.pick(20000)};
    uint64_t data_size = sizes[m.pick(std::size(sizes))];
    auto r = model::parse_safetensors_header(text, data_size);
    if (!r.ok()) {
      ++rejected;
      ASSERT_FALSE(r.status().message().empty()) << "case " << i << ": empty message for\n"
                                                 << text.substr(0, 400);
      continue;
    }
    ++accepted;
    std::vector<const model::TensorInfo*> spans;
    for (const auto& [name, t] : r->tensors) {
      ASSERT_LE(t.begin, t.end) << "case " << i;
      ASSERT_LE(t.end, data_size) << "case " << i << " tensor " << name;
      unsigned __int128 n = 1;
      for (int64_t d : t.shape) {
        ASSERT_GE(d, 0);
        n *= static_cast<uint64_t>(d);
      }
      ASSERT_TRUE(n * dtype_size(t.dtype) == t.nbytes()) << "case " << i << " tensor " << name;
      if (t.nbytes()) spans.push_back(&t);
    }
    std::sort(spans.begin(), spans.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
    for (size_t k = 1; k < spans.size(); ++k) ASSERT_GE(spans[k]->begin, spans[k - 1]->end) << "case " << i;
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("safetensors header: %d cases, %d accepted, %d rejected, %.1f s\n", kCases, accepted, rejected,
              secs);
  // The mutations must reach both outcomes, or the test only exercises the JSON syntax check.
  EXPECT_GT(accepted, kCases / 100);
  EXPECT_GT(rejected, kCases / 2);
}

TEST(ParserMutation, ModelConfigSurvivesMutations) {
  Mutator m(0xc0f16);
  const std::string base = kTinyConfigJson;
  auto ok0 = model::parse_model_config(base);
  ASSERT_TRUE(ok0.ok()) << ok0.status().message();
  int accepted = 0, rejected = 0, schedules = 0;
  const int kCases = 52000;  // x 2 parsers = 104k cases (issue 2 asks for >= 100k)
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCases; ++i) {
    std::string text = m.mutate(base);
    auto c = model::parse_model_config(text);
    if (!c.ok()) {
      ++rejected;
      ASSERT_FALSE(c.status().message().empty()) << "case " << i << ": empty message for\n"
                                                 << text.substr(0, 400);
      continue;
    }
    ++accepted;
    ASSERT_TRUE(model::validate_model_config(*c).ok()) << "case " << i;
    auto s = model::derive_layer_schedule(*c);
    if (s.ok()) {
      ++schedules;
      ASSERT_EQ(static_cast<int64_t>(s->layers.size()), c->num_hidden_layers) << "case " << i;
    } else {
      ASSERT_FALSE(s.status().message().empty()) << "case " << i;
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("config: %d cases, %d accepted (%d with a schedule), %d rejected, %.1f s\n", kCases, accepted,
              schedules, rejected, secs);
  EXPECT_GT(accepted, kCases / 100);
  EXPECT_GT(rejected, kCases / 2);
}

}  // namespace
}  // namespace ds41::fuzz

namespace ds41::fuzz {
namespace {

// Regression tests (issue 2): a config value nested ~60k levels deep overflowed the stack in the
// error path (FieldReader::bad dumps the value; dump() recurses). Both parsers now refuse deep
// nesting while parsing, with a message.
std::string nested(const std::string& open, const std::string& close, int depth, const std::string& leaf) {
  std::string s;
  s.reserve(depth * (open.size() + close.size()) + leaf.size());
  for (int i = 0; i < depth; ++i) s += open;
  s += leaf;
  for (int i = 0; i < depth; ++i) s += close;
  return s;
}

TEST(ParserMutation, Issue2DeeplyNestedConfigValueIsRejectedNotACrash) {
  std::string cfg = kTinyConfigJson;
  size_t at = cfg.find("\"hidden_size\":");
  ASSERT_NE(at, std::string::npos);
  size_t b = cfg.find(':', at) + 1, e = cfg.find_first_of(",}", b);
  cfg.replace(b, e - b, nested("[", "]", 200000, "1"));
  auto c = model::parse_model_config(cfg);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("nesting deeper than"), std::string::npos) << c.status().message();
  // Moderately nested values still get the ordinary type error.
  std::string cfg2 = kTinyConfigJson;
  cfg2.replace(b, e - b, nested("[", "]", 5, "1"));
  auto c2 = model::parse_model_config(cfg2);
  ASSERT_FALSE(c2.ok());
  EXPECT_NE(c2.status().message().find("hidden_size: expected an integer"), std::string::npos)
      << c2.status().message();
}

// Regression (issue 2, found by the libFuzzer config target under UBSan): an integer field given
// as a huge float (3.3e83) was cast double -> int64 (undefined behaviour); unsigned values above
// INT64_MAX wrapped to negative numbers.
TEST(ParserMutation, Issue2OutOfRangeIntegersAreRejectedWithoutUB) {
  for (const char* bad :
       {"333333333333333333333333333333333333333333333333333333333333333333333333333333333192", "3.3e83",
        "-1e300", "9223372036854775808", "18446744073709551615", "2.5"}) {
    std::string cfg = kTinyConfigJson;
    size_t at = cfg.find("\"hidden_size\":");
    size_t b = cfg.find(':', at) + 1, e = cfg.find_first_of(",}", b);
    cfg.replace(b, e - b, bad);
    auto c = model::parse_model_config(cfg);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().message().find("hidden_size: expected an integer"), std::string::npos)
        << bad << ": " << c.status().message();
  }
  std::string cfg = kTinyConfigJson;
  size_t at = cfg.find("\"compress_ratios\":");
  size_t b = cfg.find('[', at) + 1;
  cfg.insert(b, "18446744073709551615, ");
  auto c = model::parse_model_config(cfg);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("compress_ratios: expected a list of integers"), std::string::npos)
      << c.status().message();
  // Integral floats in range stay accepted, as before the fix.
  std::string ok = kTinyConfigJson;
  size_t hs = ok.find("\"hidden_size\":");
  size_t hb = ok.find(':', hs) + 1, he = ok.find_first_of(",}", hb);
  std::string v = ok.substr(hb, he - hb);
  ok.replace(hb, he - hb, v + ".0");
  auto c2 = model::parse_model_config(ok);
  EXPECT_TRUE(c2.ok()) << c2.status().message();
}

TEST(ParserMutation, Issue2DeeplyNestedHeaderIsRejected) {
  auto r = model::parse_safetensors_header("{\"a\":" + nested("{\"b\":", "}", 100000, "1") + "}", 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nests deeper than"), std::string::npos) << r.status().message();
  auto ok = model::parse_safetensors_header(kValidHeaderJson, kValidHeaderDataSize);
  EXPECT_TRUE(ok.ok());
}

}  // namespace
}  // namespace ds41::fuzz
