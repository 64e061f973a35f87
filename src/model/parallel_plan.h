// ds41 model: the parallel plan — which bytes of the checkpoint each of W ranks (GPUs of one
// node) holds, for the two regimes issue 14 asks for:
//   kTensorAttention (batch-1 latency): attention heads split by rank (wq_b rows, wo_a groups,
//     the sinks; wo_b by columns, then an all-reduce), the shared expert split by its
//     intermediate dimension, the head split by vocabulary rows; routed experts by EP;
//   kDataAttention (throughput, what DeepSeek serves with): every dense weight replicated, each
//     rank runs attention for its own sequences; routed experts by EP.
// In both, the routed experts of every layer (and of each DSpark stage) are split into W
// contiguous ranges (384 / 8 = 48 per GPU at the released size) and the Engram tables live once
// in host memory, shared by the ranks (tech report placement), never on a device.
//
// The plan is a pure function of the config, the tensor contract and (W, regime): the real
// loader reads exactly the listed slices (model/loader/shard_reader.h: a rank reads only its
// bytes), `ds41 inspect --world W --parallel tp|dp` prints it, and the memory check uses its
// per-rank totals. Slices are in stored-tensor units: a row range of an FP8 weight comes with the
// matching range of its 32x32 scale tiles, so every split must fall on a tile boundary; splits
// that do not are errors naming the dimension and the world size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "model/loader/tensor_contract.h"

namespace ds41::model {

enum class ParallelRegime { kTensorAttention, kDataAttention };
const char* parallel_regime_name(ParallelRegime r);  // "tp" | "dp"
Result<ParallelRegime> parse_parallel_regime(const std::string& s);

// Part of one stored tensor a rank holds.
struct TensorSlice {
  enum class Axis { kWhole, kRows, kCols };
  int32_t tensor = 0;  // index into TensorContract::tensors
  Axis axis = Axis::kWhole;
  int64_t begin = 0, end = 0;  // rows or columns [begin, end) of the stored shape (kWhole: unused)
  uint64_t bytes = 0;
};

struct RankPlan {
  int rank = 0;
  std::vector<TensorSlice> slices;  // in contract order
  uint64_t device_bytes = 0;        // sum of slice bytes
  uint64_t replicated_bytes = 0, split_bytes = 0, expert_bytes = 0;  // device_bytes by kind
  int64_t expert_begin = 0, expert_end = 0;  // routed experts of every backbone layer
  int64_t head_begin = 0, head_end = 0;      // attention heads (kTensorAttention; else all)
};

struct ParallelPlan {
  int world = 1;
  ParallelRegime regime = ParallelRegime::kTensorAttention;
  std::vector<RankPlan> ranks;
  uint64_t host_bytes = 0;     // Engram tables, once per node (shared by the ranks)
  uint64_t checkpoint_bytes = 0;  // the whole contract (every rank's device bytes + host, less replicas)
};

// InvalidArgument naming the field when W does not divide what the regime splits (experts,
// heads, o_groups, vocabulary, scale tiles).
Result<ParallelPlan> plan_parallel(const ModelConfig& c, const TensorContract& contract, int world,
                                   ParallelRegime regime);

}  // namespace ds41::model
