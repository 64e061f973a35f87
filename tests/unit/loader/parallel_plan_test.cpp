// The parallel plan (issue 14's layout on the CPU; no GPU needed) and the rank-sharded reader:
//   - the released config on 8 ranks: 48 experts per rank, the Engram tables in host memory, every
//     byte of the checkpoint accounted for once (or once per rank for replicated tensors), and a
//     rank's share fits one H200 in both regimes;
//   - world sizes that do not divide what a regime splits are errors naming the field;
//   - a tiny checkpoint on disk (2 shards): each rank reads exactly its planned bytes with pread,
//     only its own experts, and the ranks' slices put together give every tensor byte for byte.
#include "model/parallel_plan.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "model/checkpoint_maker.h"
#include "model/layer_schedule.h"
#include "model/loader/safetensors.h"
#include "model/loader/shard_reader.h"
#include "model/presets.h"

namespace ds41::model {
namespace {

TensorContract contract_of(const ModelConfig& c) {
  auto s = derive_layer_schedule(c);
  EXPECT_TRUE(s.ok()) << s.status().message();
  auto k = derive_tensor_contract(c, *s);
  EXPECT_TRUE(k.ok()) << k.status().message();
  return std::move(*k);
}

TEST(ParallelPlan, ReleasedModelOnEightH200s) {
  auto c = preset_config("v41-flash");
  ASSERT_TRUE(c.ok());
  const TensorContract k = contract_of(*c);
  const auto groups = [&] {
    std::map<ParamGroup, uint64_t> bytes;
    for (const ExpectedTensor& t : k.tensors) bytes[k.params[static_cast<size_t>(t.param)].group] += t.nbytes();
    return bytes;
  }();
  const uint64_t h200 = 139ull << 30;
  uint64_t tp_rank0 = 0, dp_rank0 = 0;
  for (ParallelRegime regime : {ParallelRegime::kTensorAttention, ParallelRegime::kDataAttention}) {
    SCOPED_TRACE(parallel_regime_name(regime));
    auto plan = plan_parallel(*c, k, 8, regime);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    ASSERT_EQ(plan->ranks.size(), 8u);
    EXPECT_EQ(plan->host_bytes, groups.at(ParamGroup::kEngramTable));
    EXPECT_GT(plan->host_bytes, 150ull * 1000 * 1000 * 1000) << "the two Engram tables are ~98 GB each";
    uint64_t once = plan->host_bytes, replicated = 0;
    for (const RankPlan& r : plan->ranks) {
      EXPECT_EQ(r.expert_end - r.expert_begin, 48);
      EXPECT_EQ(r.expert_begin, 48 * r.rank);
      // Routed experts of the backbone (EP) and of the DSpark stages (their own 128 / 8).
      EXPECT_EQ(r.expert_bytes * 8, groups.at(ParamGroup::kRoutedExpert) + [&] {
        uint64_t b = 0;
        for (const ExpectedTensor& t : k.tensors)
          if (k.params[static_cast<size_t>(t.param)].name.find(".ffn.experts.") != std::string::npos &&
              k.params[static_cast<size_t>(t.param)].group == ParamGroup::kDspark)
            b += t.nbytes();
        return b;
      }());
      EXPECT_EQ(r.device_bytes, r.replicated_bytes + r.split_bytes + r.expert_bytes);
      EXPECT_LT(r.device_bytes, h200) << "rank " << r.rank << " holds " << r.device_bytes << " bytes";
      once += r.split_bytes + r.expert_bytes;
      if (r.rank == 0) replicated = r.replicated_bytes;
      EXPECT_EQ(r.replicated_bytes, replicated);
    }
    EXPECT_EQ(once + replicated, plan->checkpoint_bytes) << "every byte is held once, replicas once per rank";
    (regime == ParallelRegime::kTensorAttention ? tp_rank0 : dp_rank0) = plan->ranks[0].device_bytes;
    std::printf("[ parallel plan ] v41-flash %s x8: %.1f GB per rank (replicated %.1f, split %.1f, experts %.1f), "
                "host %.1f GB\n",
                parallel_regime_name(regime), plan->ranks[0].device_bytes / 1e9,
                plan->ranks[0].replicated_bytes / 1e9, plan->ranks[0].split_bytes / 1e9,
                plan->ranks[0].expert_bytes / 1e9, plan->host_bytes / 1e9);
  }
  EXPECT_LT(tp_rank0, dp_rank0) << "tensor-parallel attention holds less per rank";
}

TEST(ParallelPlan, WorldSizesThatDoNotDivideAreErrorsNamingTheField) {
  auto c = preset_config("v41-flash");
  ASSERT_TRUE(c.ok());
  const TensorContract k = contract_of(*c);
  auto msg = [&](int world, ParallelRegime r) {
    auto p = plan_parallel(*c, k, world, r);
    return p.ok() ? std::string("ok") : p.status().message();
  };
  EXPECT_NE(msg(5, ParallelRegime::kDataAttention).find("n_routed_experts (384"), std::string::npos);
  // 384 = 3 x 128, but each DSpark stage has 128 experts.
  EXPECT_NE(msg(3, ParallelRegime::kDataAttention).find("dspark_n_routed_experts (128"), std::string::npos);
  // 128 ranks: every expert count divides, the 64 heads do not (tp); dp splits only the experts.
  EXPECT_NE(msg(128, ParallelRegime::kTensorAttention).find("num_attention_heads (64"), std::string::npos);
  EXPECT_EQ(msg(128, ParallelRegime::kDataAttention), "ok");
  EXPECT_NE(msg(0, ParallelRegime::kDataAttention).find("world size 0"), std::string::npos);
  EXPECT_EQ(msg(1, ParallelRegime::kTensorAttention), "ok");
  EXPECT_FALSE(parse_parallel_regime("medium").ok());
  EXPECT_NE(parse_parallel_regime("medium").status().message().find("tp"), std::string::npos);
  // The tiny preset: 2 o_groups cannot be split over 4 ranks by tensor-parallel attention.
  auto t = preset_config("tiny");
  ASSERT_TRUE(t.ok());
  auto p = plan_parallel(*t, contract_of(*t), 4, ParallelRegime::kTensorAttention);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("o_groups (2"), std::string::npos) << p.status().message();
}

// The full tensor from the ranks' slices; replicated tensors must agree on every rank.
TEST(ParallelPlan, EachRankReadsExactlyItsBytesAndTheSlicesRebuildTheCheckpoint) {
  auto c = preset_config("tiny");
  ASSERT_TRUE(c.ok());
  const TensorContract k = contract_of(*c);
  const std::string dir = ::testing::TempDir() + "/parallel_plan_tiny";
  std::filesystem::remove_all(dir);
  MakeCheckpointOptions mo;
  mo.seed = 7;
  mo.shards = 2;
  ASSERT_TRUE(make_checkpoint(dir, *c, mo).ok());
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  struct Case {
    int world;
    ParallelRegime regime;
  };
  for (const Case cs : {Case{2, ParallelRegime::kTensorAttention}, Case{2, ParallelRegime::kDataAttention},
                        Case{4, ParallelRegime::kDataAttention}, Case{8, ParallelRegime::kDataAttention}}) {
    SCOPED_TRACE(std::to_string(cs.world) + " " + parallel_regime_name(cs.regime));
    auto plan = plan_parallel(*c, k, cs.world, cs.regime);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    std::vector<std::vector<uint8_t>> rebuilt(k.tensors.size());
    std::vector<bool> seen(k.tensors.size(), false);
    bool any_split = false;
    for (const RankPlan& r : plan->ranks) {
      SliceReadStats st;
      for (const TensorSlice& s : r.slices) {
        const ExpectedTensor& t = k.tensors[static_cast<size_t>(s.tensor)];
        const TensorRef* ref = (*ck)->find(t.name);
        ASSERT_NE(ref, nullptr) << t.name;
        const std::string& pname = k.params[static_cast<size_t>(t.param)].name;
        const size_t at = pname.find(".ffn.experts.");
        if (at != std::string::npos) {  // only this rank's experts
          const int64_t e = std::stoll(pname.substr(at + 13));
          EXPECT_GE(e, r.expert_begin) << pname << " on rank " << r.rank;
          EXPECT_LT(e, r.expert_end) << pname << " on rank " << r.rank;
        }
        std::vector<uint8_t> part;
        ASSERT_TRUE(read_tensor_slice(**ck, k, s, &part, &st).ok()) << t.name;
        ASSERT_EQ(part.size(), s.bytes) << t.name;
        std::vector<uint8_t>& full = rebuilt[static_cast<size_t>(s.tensor)];
        const uint64_t n = ref->info->nbytes();
        if (s.axis == TensorSlice::Axis::kWhole) {
          if (seen[static_cast<size_t>(s.tensor)]) {
            EXPECT_EQ(full, part) << t.name << ": replicas differ";
          }
          full = part;
        } else {
          any_split = true;
          full.resize(n);
          const int64_t rows = ref->info->shape[0];
          const uint64_t row_bytes = n / static_cast<uint64_t>(rows);
          if (s.axis == TensorSlice::Axis::kRows) {
            std::memcpy(full.data() + row_bytes * s.begin, part.data(), part.size());
          } else {
            const uint64_t elem = row_bytes / static_cast<uint64_t>(ref->info->shape[1]);
            const uint64_t seg = elem * static_cast<uint64_t>(s.end - s.begin);
            for (int64_t row = 0; row < rows; ++row)
              std::memcpy(full.data() + row_bytes * row + elem * s.begin, part.data() + seg * row, seg);
          }
        }
        seen[static_cast<size_t>(s.tensor)] = true;
      }
      EXPECT_EQ(st.bytes_read, r.device_bytes) << "rank " << r.rank << " reads exactly its bytes";
    }
    EXPECT_EQ(any_split, cs.regime == ParallelRegime::kTensorAttention);
    uint64_t host = 0;
    for (size_t i = 0; i < k.tensors.size(); ++i) {
      const ExpectedTensor& t = k.tensors[i];
      const TensorRef* ref = (*ck)->find(t.name);
      ASSERT_NE(ref, nullptr);
      if (k.params[static_cast<size_t>(t.param)].format == ParamFormat::kEngramTable) {
        EXPECT_FALSE(seen[i]) << t.name << " is host memory, read by no rank";
        host += t.nbytes();
        continue;
      }
      ASSERT_TRUE(seen[i]) << t.name << " is held by no rank";
      ASSERT_EQ(rebuilt[i].size(), ref->info->nbytes()) << t.name;
      EXPECT_EQ(std::memcmp(rebuilt[i].data(), ref->data, rebuilt[i].size()), 0) << t.name;
    }
    EXPECT_EQ(host, plan->host_bytes);
  }
  // A slice outside the tensor is an error naming it.
  TensorSlice bad{0, TensorSlice::Axis::kRows, 0, 1 << 30, 0};
  std::vector<uint8_t> out;
  const Status s = read_tensor_slice(**ck, k, bad, &out);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(k.tensors[0].name), std::string::npos) << s.message();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ds41::model
