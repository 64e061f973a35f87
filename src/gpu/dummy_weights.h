// ds41 gpu: `--load-format dummy` — every weight of the device weight list generated on the device
// (backends/cuda/dummy_weight_kernels.h) with make-checkpoint's recipe per tensor role (the tensor
// contract's ParamRole, MODEL_SPEC 2 shapes and formats), seeded by (seed, name_hash(param name),
// element index): deterministic, independent of order, no host copy of any weight.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "gpu/device_weight_items.h"
#include "model/config.h"
#include "model/loader/tensor_contract.h"

namespace ds41::gpu {

// Gives each linear item the contract's storage format; InvalidArgument listing every name the
// contract lacks (a config the contract and the device list disagree on).
Status apply_contract_formats(const model::TensorContract& k, std::vector<WeightItem>& items);

// Fills every item (device pointers already assigned) on `stream`; the caller synchronises.
Status fill_dummy_weights(const model::ModelConfig& c, const model::TensorContract& k,
                          const std::vector<WeightItem>& items, uint64_t seed, cudaStream_t stream);

}  // namespace ds41::gpu
