// ds41 model/loader: the tensor contract — every tensor a checkpoint must hold (name, dtype,
// shape), derived from a ModelConfig and its LayerSchedule only (MODEL_SPEC 2), and the check of
// a Checkpoint against it that reports every mismatch at once (missing, unexpected, wrong dtype,
// wrong shape), naming file, tensor, expected and found.
//
// A contract is a list of logical parameters ("params"). Each param is stored as one tensor
// (BF16/F32) or as a quantized pair (MODEL_SPEC 2.1):
//   FP8 linear  P [out, in]   -> P.weight F8_E4M3 [out, in] + P.scale F8_E8M0 [ceil(out/32), ceil(in/32)]
//   FP4 expert  P [out, in]   -> P.weight I8 [out, in/2]    + P.scale F8_E8M0 [out, in/32]
//   Engram table P [rows, dim] -> P.weight F8_E4M3 [rows, dim] + P.scale F8_E8M0 [rows, dim/32]
// The params also carry a role (how `make-checkpoint` draws it) and a group (how `inspect`
// counts it); neither affects validation.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/config.h"
#include "model/layer_schedule.h"

namespace ds41::model {

class Checkpoint;

enum class ParamFormat {
  kPlain,        // one BF16 or F32 tensor with the param's full name
  kFp8Linear,    // P.weight E4M3 + P.scale E8M0 (32x32 tiles)
  kFp4Expert,    // P.weight I8 (packed E2M1) + P.scale E8M0 (per row per 32 inputs)
  kEngramTable,  // P.weight E4M3 rows + P.scale E8M0 (per row per 32 values)
};

// Where a param belongs when counting (inspect) — MODEL_SPEC 2.2-2.5.
enum class ParamGroup { kEmbedding, kBackbone, kRoutedExpert, kEngramTable, kEngramProj, kDspark, kVision };
const char* param_group_name(ParamGroup g);

// What a param is, for the random-weight recipe (golden README "How the weights were drawn").
enum class ParamRole {
  kEmbed,       // embed.weight
  kHead,        // head.weight, markov head
  kNorm,        // any RMSNorm weight
  kLinear,      // FP8 linear with gain 1 (wq_a, wq_b, wkv, wo_a, indexer wq_b, engram wkv, main_proj)
  kLinearOut,   // attn.wo_b (gain 0.7)
  kSharedUp,    // shared expert w1/w3 (gain 3.6)
  kSharedDown,  // shared expert w2 (gain 0.1)
  kExpertUp,    // routed expert w1/w3 (gain 3.6)
  kExpertDown,  // routed expert w2 (gain 0.1)
  kAttnSink,    // attn.attn_sink
  kHcFn,
  kHcBase,
  kHcScale,
  kRouterWeight,
  kRouterBias,
  kCompressorWkv,
  kCompressorWgate,
  kIndexerWk,
  kIndexerWeightsProj,
  kEngramTable,
  kEngramQk,
  kDense,        // other BF16 matrices (vision, aligner, markov embed, confidence): N(0, 1/fan_in)
  kBias,         // BF16 biases (vision, aligner): small
  kImageMarker,  // image_start / image_end / image_newline
};

struct ContractParam {
  std::string name;  // full tensor name for kPlain, the prefix P otherwise
  ParamFormat format = ParamFormat::kPlain;
  DType dtype = DType::kBF16;  // kPlain only
  std::vector<int64_t> shape;  // logical shape ([out, in] for linears, [rows, dim] for tables)
  ParamRole role = ParamRole::kDense;
  ParamGroup group = ParamGroup::kBackbone;
  int64_t numel() const;  // logical element count (parameters)
};

// One stored tensor of the contract.
struct ExpectedTensor {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  int32_t param = 0;      // index into TensorContract::params
  bool is_scale = false;  // the E8M0 half of a quantized pair
  uint64_t nbytes() const;
};

struct DtypeTotals {
  uint64_t count = 0;
  uint64_t bytes = 0;
};

struct TensorContract {
  std::vector<ContractParam> params;
  // Stored tensors in param order; a quantized pair is .weight then .scale (adjacent).
  std::vector<ExpectedTensor> tensors;

  uint64_t payload_bytes() const;
  std::map<DType, DtypeTotals> by_dtype() const;
  // Logical parameter count per group.
  std::map<ParamGroup, uint64_t> params_by_group() const;
  // nullptr when the name is not in the contract.
  const ExpectedTensor* find(const std::string& name) const;

 private:
  friend Result<TensorContract> derive_tensor_contract(const ModelConfig&, const LayerSchedule&);
  std::map<std::string, int32_t> index_;  // name -> position in tensors
};

// Derives the contract (MODEL_SPEC 2.2-2.5) from the config: backbone layers with their
// schedule-dependent extras (compressor/indexer keys on KV sources, wgate only for ratio > 1,
// indexer query on index sources, Engram on engram layers), DSpark stages mtp.{i} when
// num_nextn_predict_layers > 0, vision tensors when vision_config exists. Errors name the
// config field that makes a shape impossible (e.g. a dimension not divisible by 2 for FP4).
Result<TensorContract> derive_tensor_contract(const ModelConfig& c, const LayerSchedule& s);

struct ContractMismatch {
  enum class Kind { kMissing, kUnexpected, kWrongDtype, kWrongShape };
  Kind kind = Kind::kMissing;
  std::string file;  // shard file holding the tensor ("" when missing)
  std::string tensor;
  std::string expected;  // e.g. "F8_E4M3 [1280, 5120]"
  std::string found;
  std::string to_string() const;
};
const char* mismatch_kind_name(ContractMismatch::Kind k);

struct ContractReport {
  uint64_t expected_tensors = 0;
  uint64_t found_tensors = 0;
  uint64_t matched_tensors = 0;
  std::vector<ContractMismatch> mismatches;
  bool ok() const { return mismatches.empty(); }
  // One line per mismatch; at most max_lines, then "... and N more".
  std::string to_string(size_t max_lines = 50) const;
};

// Compares every tensor of the checkpoint with the contract; never stops at the first problem.
ContractReport check_checkpoint(const Checkpoint& ck, const TensorContract& contract);
// check_checkpoint as a Status: ok, or InvalidArgument listing every mismatch.
Status validate_checkpoint(const Checkpoint& ck, const TensorContract& contract);

std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace ds41::model
