// ds41 gpu: DeviceModel — the V4.1 text model's weights on one GPU, in their checkpoint formats
// (FP8 32x32 tiles, FP4 expert rows, BF16, FP8 Engram rows; MODEL_SPEC 2.1; never a dequantized
// copy), and with vision_config the vision tower's BF16 weights (MODEL_SPEC 2.5), with the config, layer
// schedule, KV layout and Engram hasher the executor needs. Loaded from a safetensors folder (the whole
// tensor contract validated first, pinned staging buffers, shards read in parallel, disk reads overlapped
// with host-to-device copies, progress), or generated on the device (`--load-format dummy`: seeded,
// deterministic, scaled like make-checkpoint's recipe) for any preset or config.json, the full released
// layout included.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/cuda/device_weight.h"
#include "core/status.h"
#include "gpu/device_load_options.h"
#include "engram/hasher.h"
#include "model/config.h"
#include "model/kv_layout.h"
#include "model/layer_schedule.h"

namespace ds41::gpu {

struct DeviceVec {  // float32 on the device
  const float* ptr = nullptr;
  int64_t size = 0;
};
struct DeviceHcSite {
  DeviceVec fn, base, scale;
};
struct DeviceExpert {
  cuda::DeviceWeight w1, w2, w3;
};
struct DeviceEngram {
  // Device memory, or mapped host-pinned memory (DeviceLoadOptions::engram_host_pinned).
  const uint8_t* table = nullptr;
  const uint8_t* table_scale = nullptr;
  int64_t rows = 0;
  cuda::DeviceWeight wkv;
  DeviceVec omega;  // q_weight * k_weight, [C, H]
};
struct DeviceLayer {
  DeviceVec attn_norm, ffn_norm, q_norm, kv_norm, attn_sink, c_norm, idx_k_norm, gate_bias, gate_bias_vl;
  cuda::DeviceWeight wq_a, wq_b, wkv, wo_a, wo_b, c_wkv, c_wgate, idx_wk, idx_wq_b, idx_weights_proj, gate;
  std::vector<DeviceExpert> experts;  // host copy of the structs
  // DEVICE arrays of n_routed_experts structs (for cuda::run_expert_linear).
  const cuda::DeviceWeight* d_w1 = nullptr;
  const cuda::DeviceWeight* d_w2 = nullptr;
  const cuda::DeviceWeight* d_w3 = nullptr;
  DeviceExpert shared;  // formats kNone when the config has no shared expert
  DeviceHcSite hc_attn, hc_ffn;
  std::optional<DeviceEngram> engram;
};
// The vision tower, the aligner and the image markers (MODEL_SPEC 2.2, 2.5; only with
// vision_config): BF16 linears in the checkpoint's fused layouts (the GPU tower runs the fused qkv
// as one GEMM and takes row slices of mlp.w1), biases, norms and markers as float32 vectors.
struct DeviceVisionBlock {
  DeviceVec norm1, norm2, bqkv, bo;  // bqkv [3 D]: q | k | v
  cuda::DeviceWeight wqkv;           // [3 D, D]: q | k | v rows, each head-major
  cuda::DeviceWeight wo;             // [D, D]
  cuda::DeviceWeight w1;             // [2 I, D]: gate rows, then up rows
  cuda::DeviceWeight w2;             // [D, I]
};
struct DeviceVisionWeights {
  cuda::DeviceWeight patch_embed;  // [D, 3 * patch^2]
  DeviceVec patch_bias, norm;
  std::vector<DeviceVisionBlock> blocks;
  cuda::DeviceWeight aligner_w1, aligner_w2;  // [hidden, D * k^2], [hidden, hidden]
  DeviceVec aligner_b1, aligner_b2;
  DeviceVec image_start, image_end, image_newline;  // [hidden] each
};
// The DSpark draft (MODEL_SPEC 3.10.1; only with num_nextn_predict_layers > 0): the stages as
// ratio-0 blocks with dspark_n_routed_experts experts, the context projection and norm, the draft's
// final norm, the Markov factors (markov_embed: the BF16 [V, R] table, read by the embedding
// kernel) and the confidence head.
struct DeviceDspark {
  std::vector<DeviceLayer> stages;
  cuda::DeviceWeight main_proj, markov_embed, markov_head, confidence_proj;
  DeviceVec main_norm, norm;
};
struct DeviceModelWeights {
  const uint8_t* embed = nullptr;  // BF16 [vocab, hidden]
  DeviceVec norm;
  cuda::DeviceWeight head;
  std::vector<DeviceLayer> layers;
  std::optional<DeviceVisionWeights> vision;  // set when the config has vision_config
  std::optional<DeviceDspark> dspark;         // set when the config has DSpark stages
};

class DeviceModel {
 public:
  // dir: a model folder (config.json + safetensors); with kDummy a folder with only config.json, or
  // empty with opt.preset. Validates the whole tensor contract like model::Model::load (every
  // mismatch reported); device OOM names the bytes needed and available.
  static Result<std::unique_ptr<DeviceModel>> load(const std::string& dir, const DeviceLoadOptions& opt);
  ~DeviceModel();

  const model::ModelConfig& config() const;
  const model::LayerSchedule& schedule() const;
  const model::KvLayout& kv_layout() const;
  const engram::EngramHasher* hasher() const;  // null without Engram layers
  const DeviceModelWeights& weights() const;
  const DeviceVec& rope_inv_freq(bool yarn) const;  // device copies of model::rope_inv_freq_*
  int device() const;
  uint64_t weight_bytes() const;  // device bytes held by weights

 private:
  DeviceModel();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds41::gpu
