// ds41 model: seeded random weights in the official storage formats, for `ds41 make-checkpoint`
// and tests. The recipe follows ../shared/golden/README.md "How the weights were drawn" so that a
// generated model is not degenerate: SwiGLU clamps (swiglu_limit) are exercised on ~1% of the
// expert pre-activations but far from saturated, attention and router softmaxes are not
// collapsed, logits have a std of about 2, and the indexer head weights stay mostly positive
// (a shared embedding offset along one unit vector d, also added to weights_proj).
//
// Master weights are float32 (Box-Muller over a splitmix64 stream seeded by (seed, hash(name))),
// so every tensor depends only on the seed and its own name, not on generation order; they are
// then quantized with src/quant/weight_formats.h (E4M3 + 32x32 E8M0 tiles, packed E2M1 + per-row
// E8M0, Engram rows) or rounded to BF16 / kept F32 as the contract says.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "model/loader/tensor_contract.h"

namespace ds41::model {

// Fills the tensors of one contract. Not thread-safe (one cached quantized pair).
class RandomWeights {
 public:
  // contract must outlive this object.
  RandomWeights(const ModelConfig& c, const TensorContract& contract, uint64_t seed);

  // Writes the bytes of contract.tensors[index] into out (nbytes must equal its size). For a
  // quantized pair the .weight and .scale halves come from one master draw; asking for them in
  // contract order (weight, then scale) quantizes once.
  Status fill(size_t index, uint8_t* out, uint64_t nbytes);

  // The float32 master values of param p (before quantization), row-major in its logical shape.
  // Used by tests and by fill(); allocates numel floats.
  std::vector<float> master(size_t param_index) const;

 private:
  struct Quantized {
    int32_t param = -1;
    std::vector<uint8_t> weight, scale;
  };
  Status quantize_param(int32_t p);
  void plain_rows(const ContractParam& p, uint8_t* out) const;

  const ModelConfig& c_;
  const TensorContract& contract_;
  uint64_t seed_;
  std::vector<float> direction_;  // unit vector d of length hidden_size
  Quantized cache_;
};

// Deterministic 64-bit hash of a tensor name (FNV-1a), for per-tensor seeds.
uint64_t name_hash(const std::string& name);

}  // namespace ds41::model
