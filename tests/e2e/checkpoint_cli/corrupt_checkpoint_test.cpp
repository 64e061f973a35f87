// Corrupted checkpoints (issue 2 section 3): `ds41 inspect` must name the problem (file, tensor,
// expected vs found), exit 1 and never crash, for a truncated shard, a wrong dtype, a missing and
// an extra tensor, overlapping offsets, a header larger than the file, an absurd header length,
// a bad index JSON, an index naming a missing shard and a malformed config.json.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "model/checkpoint_maker.h"
#include "model/presets.h"

namespace ds41::testing_cli {
namespace {

using json = nlohmann::json;

constexpr const char* kShard1 = "model-00001-of-00003.safetensors";
constexpr const char* kShard2 = "model-00002-of-00003.safetensors";

// A valid 3-shard tiny checkpoint with random weights.
std::string make_tiny(const std::string& name) {
  std::string dir = fresh_dir(name);
  std::filesystem::remove_all(dir);
  auto c = model::preset_config("tiny");
  EXPECT_TRUE(c.ok());
  model::MakeCheckpointOptions o;
  o.seed = 3;
  o.shards = 3;
  auto m = model::make_checkpoint(dir, *c, o);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return dir;
}

// Rewrites a shard: edit(header, data) may change both; the header length is recomputed.
template <typename Edit>
void rewrite_shard(const std::string& path, Edit edit) {
  std::string bytes = slurp(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  json h = json::parse(bytes.substr(8, n));
  std::string data = bytes.substr(8 + n);
  edit(h, data);
  std::string text = h.dump();
  while (text.size() % 8) text.push_back(' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  out += text + data;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << out;
}

void edit_index(const std::string& dir, const std::function<void(json&)>& edit) {
  json idx = json::parse(slurp(dir + "/model.safetensors.index.json"));
  edit(idx);
  std::ofstream(dir + "/model.safetensors.index.json", std::ios::trunc) << idx.dump(1);
}

// A tensor name stored in the shard (first non-metadata entry matching pred).
std::string first_tensor(const std::string& path,
                         const std::function<bool(const std::string&, const json&)>& pred) {
  std::string bytes = slurp(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  json h = json::parse(bytes.substr(8, n));
  for (auto it = h.begin(); it != h.end(); ++it)
    if (it.key() != "__metadata__" && pred(it.key(), it.value())) return it.key();
  return "";
}

// Runs inspect (text and JSON) and checks: exit 1, no crash, every expected fragment named.
void expect_clear_failure(const std::string& dir, const std::vector<std::string>& fragments) {
  for (bool as_json : {false, true}) {
    SCOPED_TRACE(as_json ? "--json" : "text");
    RunResult r = run_ds41("inspect " + dir + (as_json ? " --json" : ""));
    EXPECT_EQ(r.signal, 0) << "crashed";
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    std::string all = r.out + r.err;
    for (const auto& f : fragments)
      EXPECT_NE(all.find(f), std::string::npos) << "'" << f << "' not in:\n" << all;
    if (as_json) {
      json j = json::parse(r.out, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << r.out;
      EXPECT_FALSE(j["contract_ok"].get<bool>());
      EXPECT_FALSE(j["errors"].empty());
    }
  }
}

TEST(CorruptCheckpoint, ValidTinyPasses) {
  std::string dir = make_tiny("corrupt_valid");
  RunResult r = run_ds41("inspect " + dir + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::filesystem::remove_all(dir);
}

TEST(CorruptCheckpoint, TruncatedShard) {
  std::string dir = make_tiny("corrupt_trunc");
  std::string p = dir + "/" + kShard2;
  auto size = std::filesystem::file_size(p);
  std::filesystem::resize_file(p, size - 1000);
  expect_clear_failure(dir, {kShard2, "beyond the data section", "truncated"});
  std::filesystem::remove_all(dir);
}

TEST(CorruptCheckpoint, WrongDtype) {
  std::string dir = make_tiny("corrupt_dtype");
  std::string p = dir + "/" + kShard1;
  std::string victim =
      first_tensor(p, [](const std::string&, const json& v) { return v["dtype"] == "F8_E4M3"; });
  ASSERT_FALSE(victim.empty());
  rewrite_shard(p, [&](json& h, std::string&) { h[victim]["dtype"] = "I8"; });  // same element size
  expect_clear_failure(dir, {"wrong dtype: tensor '" + victim + "' in " + dir + "/" + kShard1,
                             "expected F8_E4M3", "found I8"});
  std::filesystem::remove_all(dir);
}

TEST(CorruptCheckpoint, MissingTensor) {
  std::string dir = make_tiny("corrupt_missing");
  std::string p = dir + "/" + kShard1;
  std::string victim =
      first_tensor(p, [](const std::string& n, const json&) { return n.ends_with("attn_sink"); });
  ASSERT_FALSE(victim.empty());
  rewrite_shard(p, [&](json& h, std::string&) { h.erase(victim); });
  edit_index(dir, [&](json& idx) { idx["weight_map"].erase(victim); });
  expect_clear_failure(dir, {"missing: tensor '" + victim + "', expected F32 [4]"});
  // Still listed in the index but gone from the shard: the loader names both.
  edit_index(dir, [&](json& idx) { idx["weight_map"][victim] = kShard1; });
  expect_clear_failure(
      dir, {"tensor '" + victim + "' listed for shard '" + std::string(kShard1) + "' is missing"});
  std::filesystem::remove_all(dir);
}

TEST(CorruptCheckpoint, ExtraTensor) {
  std::string dir = make_tiny("corrupt_extra");
  std::string p = dir + "/" + kShard2;
  rewrite_shard(p, [&](json& h, std::string& data) {
    uint64_t end = data.size();
    h["layers.0.attn.compressor.wgate.weight"] = {
        {"dtype", "BF16"}, {"shape", {2, 2}}, {"data_offsets", {end, end + 8}}};
    data.append(8, '\0');
  });
  edit_index(dir, [&](json& idx) { idx["weight_map"]["layers.0.attn.compressor.wgate.weight"] = kShard2; });
  expect_clear_failure(
      dir, {"unexpected: tensor 'layers.0.attn.compressor.wgate.weight' in " + dir + "/" + kShard2,
            "found BF16 [2, 2]"});
  std::filesystem::remove_all(dir);
}

TEST(CorruptCheckpoint, OverlappingOffsets) {
  std::string dir = make_tiny("corrupt_overlap");
  std::string p = dir + "/" + kShard1;
  rewrite_shard(p, [&](json& h, std::string&) {
    // Move the second-placed tensor onto the first one's bytes (keeping its own length).
    std::string a, b;
    uint64_t amin = UINT64_MAX;
    for (auto it = h.begin(); it != h.end(); ++it)
      if (it.key() != "__metadata__" && it.value()["data_offsets"][0].get<uint64_t>() < amin) {
        amin = it.value()["data_offsets"][0].get<uint64_t>();
        a = it.key();
      }
    for (auto it = h.begin(); it != h.end(); ++it)
      if (it.key() != "__metadata__" && it.key() != a) {
        b = it.key();
        break;
      }
    uint64_t len = h[b]["data_offsets"][1].get<uint64_t>() - h[b]["data_offsets"][0].get<uint64_t>();
    uint64_t start = h[a]["data_offsets"][0].get<uint64_t>();
    h[b]["data_offsets"] = {start, start + len};
  });
  expect_clear_failure(dir, {kShard1, "overlap"});
  std::filesystem::remove_all(dir);
}

TEST(CorruptCheckpoint, HeaderLargerThanFileAndAbsurdHeader) {
  std::string dir = make_tiny("corrupt_header");
  std::string p = dir + "/" + kShard2;
  std::string bytes = slurp(p);
  uint64_t big = bytes.size() + 100;
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((big >> (8 * i)) & 0xff);
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
  expect_clear_failure(dir, {kShard2, "header length " + std::to_string(big) + " exceeds the file"});
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>(i == 7 ? 0x10 : 0);  // 2^60
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
  expect_clear_failure(dir, {kShard2, "is absurd"});
  std::filesystem::resize_file(p, 5);  // shorter than the length field
  expect_clear_failure(dir, {kShard2, "shorter than the 8-byte header length"});
  std::filesystem::remove_all(dir);
}

TEST(CorruptCheckpoint, BadIndexJsonAndMissingShard) {
  std::string dir = make_tiny("corrupt_index");
  std::string idx = slurp(dir + "/model.safetensors.index.json");
  std::ofstream(dir + "/model.safetensors.index.json", std::ios::trunc) << idx.substr(0, idx.size() / 2);
  expect_clear_failure(dir, {"model.safetensors.index.json: not valid JSON"});
  std::ofstream(dir + "/model.safetensors.index.json", std::ios::trunc) << "{\"metadata\": {}}";
  expect_clear_failure(dir, {"model.safetensors.index.json: missing object 'weight_map'"});
  std::ofstream(dir + "/model.safetensors.index.json", std::ios::trunc) << idx;
  std::filesystem::remove(dir + "/" + kShard2);
  expect_clear_failure(dir, {kShard2, "cannot open"});
  std::filesystem::remove_all(dir);
}

TEST(CorruptCheckpoint, MalformedConfig) {
  std::string dir = make_tiny("corrupt_config");
  std::ofstream(dir + "/config.json", std::ios::trunc) << "{\"text_config\": {\"hidden_size\": \"wide\"}}";
  expect_clear_failure(dir, {"config.json", "text_config.hidden_size: expected an integer"});
  std::filesystem::remove(dir + "/config.json");
  expect_clear_failure(dir, {"config.json: cannot open"});
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ds41::testing_cli
