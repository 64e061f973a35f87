// ds41 model (internal): Binder — looks up checkpoint tensors by name, checks dtype and shape,
// and builds WeightRefs / float vectors, collecting every problem (one line each) instead of
// stopping at the first. Shared by model_weights.cpp (MODEL_SPEC 2.2-2.3), vision_weights.cpp
// (2.5) and dspark_weights.cpp (the DSpark stages, 3.10.1; as WeightBinder, with
// bind_layer_weights for the blocks they share with the text layers).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"
#include "model/layer_schedule.h"
#include "model/loader/safetensors.h"
#include "model/model_weights.h"
#include "ops/weight_ref.h"

namespace ds41::model::detail {

using ops::WeightFormat;
using ops::WeightRef;

inline std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

class Binder {
 public:
  explicit Binder(const Checkpoint& ck) : ck_(ck) {}
  std::vector<std::string> errors;

  const TensorRef* get(const std::string& name, DType dt, const std::vector<int64_t>& shape) {
    const TensorRef* t = ck_.find(name);
    if (!t) {
      errors.push_back(name + ": missing");
      return nullptr;
    }
    if (t->info->dtype != dt) {
      errors.push_back(name + ": dtype " + dtype_name(t->info->dtype) + ", expected " + dtype_name(dt));
      return nullptr;
    }
    if (t->info->shape != shape) {
      errors.push_back(name + ": shape " + shape_str(t->info->shape) + ", expected " + shape_str(shape));
      return nullptr;
    }
    return t;
  }

  // BF16 or F32 vector -> float.
  std::vector<float> vec(const std::string& name, int64_t n, DType dt) {
    std::vector<float> v;
    const TensorRef* t = get(name, dt, {n});
    if (!t) return v;
    v.resize(n);
    if (dt == DType::kBF16) {
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, t->data + 2 * i, 2);
        v[i] = bf16_to_f32(b);
      }
    } else {
      std::memcpy(v.data(), t->data, n * sizeof(float));
    }
    return v;
  }
  std::vector<float> f32_matrix(const std::string& name, int64_t r, int64_t c) {
    std::vector<float> v;
    const TensorRef* t = get(name, DType::kF32, {r, c});
    if (!t) return v;
    v.resize(r * c);
    std::memcpy(v.data(), t->data, r * c * sizeof(float));
    return v;
  }

  // A linear weight `base` of logical shape [out, in], in whichever checkpoint format it has.
  WeightRef linear(const std::string& base, int64_t out, int64_t in) {
    WeightRef w;
    const std::string wn = base + ".weight";
    const TensorRef* t = ck_.find(wn);
    if (!t) {
      errors.push_back(wn + ": missing");
      return w;
    }
    names_.push_back(std::make_unique<std::string>(base));
    w.name = names_.back()->c_str();
    w.out_dim = out;
    w.in_dim = in;
    switch (t->info->dtype) {
      case DType::kF8E4M3: {
        const TensorRef* q = get(wn, DType::kF8E4M3, {out, in});
        const TensorRef* s = get(base + ".scale", DType::kF8E8M0, {(out + 31) / 32, (in + 31) / 32});
        if (!q || !s) return w;
        w.format = WeightFormat::kFp8Tiles;
        w.data = q->data;
        w.scale = s->data;
        return w;
      }
      case DType::kI8: {
        if (in % 32 != 0) {
          errors.push_back(wn + ": FP4 input width " + std::to_string(in) + " is not a multiple of 32");
          return w;
        }
        const TensorRef* q = get(wn, DType::kI8, {out, in / 2});
        const TensorRef* s = get(base + ".scale", DType::kF8E8M0, {out, in / 32});
        if (!q || !s) return w;
        w.format = WeightFormat::kFp4Rows;
        w.data = q->data;
        w.scale = s->data;
        return w;
      }
      case DType::kBF16:
      case DType::kF32: {
        const TensorRef* q = get(wn, t->info->dtype, {out, in});
        if (!q) return w;
        w.format = t->info->dtype == DType::kBF16 ? WeightFormat::kBF16 : WeightFormat::kF32;
        w.data = q->data;
        if (w.format == WeightFormat::kF32 && reinterpret_cast<uintptr_t>(q->data) % alignof(float) != 0) {
          errors.push_back(wn + ": F32 data is not 4-byte aligned in the file");
          w.format = WeightFormat::kNone;
        }
        return w;
      }
      default:
        errors.push_back(wn + ": unsupported dtype " + std::string(dtype_name(t->info->dtype)) +
                         " for a linear weight");
        return w;
    }
  }
  std::vector<std::unique_ptr<std::string>>& names() { return names_; }

 private:
  const Checkpoint& ck_;
  std::vector<std::unique_ptr<std::string>> names_;
};

}  // namespace ds41::model::detail

namespace ds41::model {

using WeightBinder = detail::Binder;

// One block's tensors under prefix L ("layers.{l}." or "mtp.{s}."): attention, the compressor and
// indexer parts the plan asks for, the MoE with n_experts routed experts, both mHC sites, Engram.
LayerWeights bind_layer_weights(WeightBinder& b, const ModelConfig& c, const std::string& L,
                                const LayerPlan& p, int64_t n_experts);

}  // namespace ds41::model
