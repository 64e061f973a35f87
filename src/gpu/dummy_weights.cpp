// ds41 gpu: dummy weights on the device (dummy_weights.h); recipe of src/model/random_weights.cpp.
#include "gpu/dummy_weights.h"

#include <cmath>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/dummy_weight_kernels.h"
#include "gpu/device_buffer.h"
#include "model/random_weights.h"

namespace ds41::gpu {
namespace {

using model::ContractParam;
using model::ParamFormat;
using model::ParamRole;

const ContractParam* param_of(const model::TensorContract& k, const std::string& tensor) {
  const model::ExpectedTensor* t = k.find(tensor);
  return t ? &k.params[static_cast<size_t>(t->param)] : nullptr;
}

// The tensor name that identifies an item's param in the contract.
std::string contract_name(const WeightItem& it) {
  switch (it.kind) {
    case WeightItemKind::kLinear:
    case WeightItemKind::kEngramTable: return it.name + ".weight";
    case WeightItemKind::kOmega: return it.name + "q_weight";
    default: return it.name;
  }
}

// make-checkpoint's sigma per role (random_weights.cpp RowGen).
double role_sigma(const ContractParam& p) {
  const double in = static_cast<double>(p.shape.size() > 1 ? p.shape[1] : p.shape[0]);
  switch (p.role) {
    case ParamRole::kLinear: return 1.0 / std::sqrt(in);
    case ParamRole::kLinearOut: return 0.7 / std::sqrt(in);
    case ParamRole::kSharedUp:
    case ParamRole::kExpertUp: return 3.6 / std::sqrt(in);
    case ParamRole::kSharedDown:
    case ParamRole::kExpertDown: return 0.1 / std::sqrt(in);
    case ParamRole::kHead:
    case ParamRole::kCompressorWgate: return 2.0 / std::sqrt(in);
    case ParamRole::kHcFn:
    case ParamRole::kRouterWeight:
    case ParamRole::kCompressorWkv:
    case ParamRole::kIndexerWk:
    case ParamRole::kDense: return 1.0 / std::sqrt(in);
    default: return 1.0;
  }
}

cuda::DummyParams params_for(const ContractParam& p, uint64_t seed, const float* dir, int64_t dir_len) {
  cuda::DummyParams d;
  d.seed = seed;
  d.stream = model::name_hash(p.name);
  d.direction = dir;
  d.dir_len = dir_len;
  const double sigma = role_sigma(p);
  const int64_t cols = p.shape.size() > 1 ? p.shape[1] : p.shape[0];
  d.dist = cuda::DummyDist::kNormal;
  d.a = static_cast<float>(sigma);
  switch (p.role) {
    case ParamRole::kEmbed:
      d.dist = cuda::DummyDist::kEmbed;
      d.a = static_cast<float>(0.8 * std::sqrt(static_cast<double>(cols)));
      break;
    case ParamRole::kNorm: d.dist = cuda::DummyDist::kNormClamp; break;
    case ParamRole::kAttnSink:
      d.dist = cuda::DummyDist::kShifted;
      d.a = 1.0f;
      d.b = 1.0f;
      break;
    case ParamRole::kHcBase: d.a = 0.5f; break;
    case ParamRole::kHcScale:
    case ParamRole::kEngramQk:
      d.dist = cuda::DummyDist::kUniform;
      d.a = 0.5f;
      d.b = 1.5f;
      break;
    case ParamRole::kRouterBias: d.a = 0.15f; break;
    case ParamRole::kBias: d.a = 0.02f; break;
    case ParamRole::kImageMarker: d.a = 1.0f; break;
    case ParamRole::kRouterWeight: d.dist = cuda::DummyDist::kRouter; break;
    case ParamRole::kIndexerWeightsProj:
      d.dist = cuda::DummyDist::kWeightsProj;
      d.a = static_cast<float>(1.0 / std::sqrt(static_cast<double>(cols)));
      break;
    default:
      // FP8 linears: per-tile gains; FP4 experts and Engram rows: per row per 32 (recipe).
      d.gains = p.format != ParamFormat::kPlain;
      break;
  }
  return d;
}

// The shared unit direction d of the recipe (length H), drawn on the host from the seed.
std::vector<float> shared_direction(uint64_t seed, int64_t n) {
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const uint64_t k = mix(seed ^ mix(model::name_hash("shared_direction") + 0x9e3779b97f4a7c15ull));
  std::vector<double> v(static_cast<size_t>(n));
  double n2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = mix(k + static_cast<uint64_t>(i + 1) * 0x9e3779b97f4a7c15ull);
    const double u1 = static_cast<double>((h >> 11) + 1) * 0x1.0p-53;
    const double u2 = static_cast<double>(h & 0xffffffull) * 0x1.0p-24;
    v[static_cast<size_t>(i)] = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
    n2 += v[static_cast<size_t>(i)] * v[static_cast<size_t>(i)];
  }
  const double inv = n2 > 0 ? 1.0 / std::sqrt(n2) : 0.0;
  std::vector<float> d(static_cast<size_t>(n));
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<float>(v[i] * inv);
  return d;
}

}  // namespace

Status apply_contract_formats(const model::TensorContract& k, std::vector<WeightItem>& items) {
  std::vector<std::string> missing;
  for (WeightItem& it : items) {
    const ContractParam* p = param_of(k, contract_name(it));
    if (!p) {
      missing.push_back(contract_name(it));
      continue;
    }
    if (it.kind != WeightItemKind::kLinear) continue;
    switch (p->format) {
      case ParamFormat::kFp8Linear: it.format = quant::WeightFormat::kFp8Tiles; break;
      case ParamFormat::kFp4Expert: it.format = quant::WeightFormat::kFp4Rows; break;
      case ParamFormat::kPlain:
        it.format = p->dtype == DType::kF32 ? quant::WeightFormat::kF32 : quant::WeightFormat::kBF16;
        break;
      case ParamFormat::kEngramTable: it.format = quant::WeightFormat::kEngramRows; break;
    }
  }
  if (missing.empty()) return ok_status();
  std::string m =
      "tensor contract lacks " + std::to_string(missing.size()) + " weight(s) the device model needs:";
  for (size_t i = 0; i < missing.size() && i < 20; ++i) m += "\n  " + missing[i];
  return invalid_argument(m);
}

Status fill_dummy_weights(const model::ModelConfig& c, const model::TensorContract& k,
                          const std::vector<WeightItem>& items, uint64_t seed, cudaStream_t stream) {
  const std::vector<float> dir = shared_direction(seed, c.hidden_size);
  DS41_ASSIGN_OR_RETURN(DeviceBuffer d_dir,
                        DeviceBuffer::allocate(dir.size() * sizeof(float), "dummy direction"));
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpyAsync(d_dir.data(), dir.data(), dir.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
      "upload of the dummy direction"));
  const float* dd = d_dir.as<float>();
  const int64_t dl = static_cast<int64_t>(dir.size());
  for (const WeightItem& it : items) {
    const ContractParam* p = param_of(k, contract_name(it));
    if (!p) return internal_error("dummy weights: " + contract_name(it) + " not in the contract");
    const cuda::DummyParams dp = params_for(*p, seed, dd, dl);
    Status s;
    switch (it.kind) {
      case WeightItemKind::kVec:
        s = cuda::run_dummy_plain(dp, it.rows, it.cols, DType::kF32, p->dtype == DType::kBF16,
                                  const_cast<float*>(it.vec->ptr), stream);
        break;
      case WeightItemKind::kEmbed:
        s = cuda::run_dummy_plain(dp, it.rows, it.cols, DType::kBF16, false, const_cast<uint8_t*>(*it.data),
                                  stream);
        break;
      case WeightItemKind::kEngramTable:
        s = cuda::run_dummy_engram_rows(dp, it.rows, it.cols, const_cast<uint8_t*>(*it.data),
                                        const_cast<uint8_t*>(*it.scale), stream);
        break;
      case WeightItemKind::kOmega: {
        const ContractParam* kp = param_of(k, it.name + "k_weight");
        if (!kp) return internal_error("dummy weights: " + it.name + "k_weight not in the contract");
        s = cuda::run_dummy_uniform_product(seed, model::name_hash(p->name), model::name_hash(kp->name), 0.5f,
                                            1.5f, it.rows * it.cols, const_cast<float*>(it.vec->ptr), stream);
        break;
      }
      case WeightItemKind::kLinear: {
        uint8_t* w = const_cast<uint8_t*>(it.weight->data);
        uint8_t* sc = const_cast<uint8_t*>(it.weight->scale);
        switch (it.format) {
          case quant::WeightFormat::kFp8Tiles:
            s = cuda::run_dummy_fp8_tiles(dp, it.rows, it.cols, w, sc, stream);
            break;
          case quant::WeightFormat::kFp4Rows:
            s = cuda::run_dummy_fp4_rows(dp, it.rows, it.cols, w, sc, stream);
            break;
          case quant::WeightFormat::kBF16:
          case quant::WeightFormat::kF32:
            s = cuda::run_dummy_plain(dp, it.rows, it.cols,
                                      it.format == quant::WeightFormat::kBF16 ? DType::kBF16 : DType::kF32,
                                      false, w, stream);
            break;
          default: return internal_error("dummy weights: " + it.name + ": no generator for its format");
        }
        break;
      }
    }
    DS41_RETURN_IF_ERROR(s.with_context("dummy weight " + it.name));
  }
  // d_dir is freed on return: wait for the kernels that read it.
  return cuda::cuda_status(cudaStreamSynchronize(stream), "dummy weight generation");
}

}  // namespace ds41::gpu
