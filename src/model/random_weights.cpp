// ds41 model: seeded random weights (golden README "How the weights were drawn").
#include "model/random_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/weight_formats.h"

namespace ds41::model {

uint64_t name_hash(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

namespace {

// splitmix64 stream: fast, full-period, good enough for weight draws.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double a, double b) { return a + (b - a) * uniform(); }
  double normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    // Marsaglia's polar method: one log + sqrt per pair, no trigonometry.
    double u, v, q;
    do {
      u = 2.0 * uniform() - 1.0;
      v = 2.0 * uniform() - 1.0;
      q = u * u + v * v;
    } while (q >= 1.0 || q == 0.0);
    const double f = std::sqrt(-2.0 * std::log(q) / q);
    spare_ = v * f;
    have_spare_ = true;
    return u * f;
  }

 private:
  uint64_t s_;
  double spare_ = 0;
  bool have_spare_ = false;
};

uint64_t mix(uint64_t a, uint64_t b) {
  Rng r(a ^ (b * 0x9e3779b97f4a7c15ull) ^ 0x5851f42d4c957f2dull);
  return r.next();
}

int64_t fan_in(const ContractParam& p) { return p.shape.size() > 1 ? p.shape[1] : p.shape[0]; }

// Streams the master rows of one param in order.
class RowGen {
 public:
  RowGen(const ContractParam& p, uint64_t seed, const std::vector<float>& d)
      : p_(p), rng_(mix(seed, name_hash(p.name))), d_(d) {
    rows_ = p.shape[0];
    cols_ = p.shape.size() > 1 ? p.shape[1] : 1;
    if (p.shape.size() == 1) {  // vectors: one row of shape[0]
      rows_ = 1;
      cols_ = p.shape[0];
    }
    const double in = static_cast<double>(fan_in(p));
    switch (p.role) {
      case ParamRole::kLinear: sigma_ = 1.0 / std::sqrt(in); break;
      case ParamRole::kLinearOut: sigma_ = 0.7 / std::sqrt(in); break;
      case ParamRole::kSharedUp:
      case ParamRole::kExpertUp: sigma_ = 3.6 / std::sqrt(in); break;
      case ParamRole::kSharedDown:
      case ParamRole::kExpertDown: sigma_ = 0.1 / std::sqrt(in); break;
      case ParamRole::kHead:
      case ParamRole::kCompressorWgate: sigma_ = 2.0 / std::sqrt(in); break;
      case ParamRole::kHcFn:
      case ParamRole::kRouterWeight:
      case ParamRole::kCompressorWkv:
      case ParamRole::kIndexerWk:
      case ParamRole::kDense: sigma_ = 1.0 / std::sqrt(in); break;
      default: sigma_ = 1.0; break;
    }
    // Gains 2^U(-1,1) so that quantization scales really differ: per 32x32 tile for FP8
    // linears, per row per 32 inputs for FP4 experts and Engram rows (drawn per row below).
    if (p.format == ParamFormat::kFp8Linear) {
      Rng g(mix(seed, name_hash(p.name) ^ 0x7ull));
      tile_cols_ = quant::ceil_div(cols_, quant::kFp8Tile);
      gains_.resize(static_cast<size_t>(quant::ceil_div(rows_, quant::kFp8Tile) * tile_cols_));
      for (float& x : gains_) x = static_cast<float>(std::exp2(g.uniform(-1, 1)));
    }
  }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }

  void next_row(float* out) {
    const int64_t r = row_++;
    switch (p_.role) {
      case ParamRole::kEmbed: {  // N(0,1) + 0.8 sqrt(H) d: keeps indexer head weights positive
        const double off = 0.8 * std::sqrt(static_cast<double>(cols_));
        for (int64_t j = 0; j < cols_; ++j)
          out[j] =
              static_cast<float>(rng_.normal() + (j < static_cast<int64_t>(d_.size()) ? off * d_[j] : 0.0));
        return;
      }
      case ParamRole::kNorm:
        for (int64_t j = 0; j < cols_; ++j)
          out[j] = static_cast<float>(std::clamp(1.0 + 0.15 * rng_.normal(), 0.5, 1.5));
        return;
      case ParamRole::kAttnSink:
        for (int64_t j = 0; j < cols_; ++j) out[j] = static_cast<float>(1.0 + rng_.normal());
        return;
      case ParamRole::kHcBase:
        for (int64_t j = 0; j < cols_; ++j) out[j] = static_cast<float>(0.5 * rng_.normal());
        return;
      case ParamRole::kHcScale:
      case ParamRole::kEngramQk:
        for (int64_t j = 0; j < cols_; ++j) out[j] = static_cast<float>(rng_.uniform(0.5, 1.5));
        return;
      case ParamRole::kRouterBias:
        for (int64_t j = 0; j < cols_; ++j) out[j] = static_cast<float>(0.15 * rng_.normal());
        return;
      case ParamRole::kBias:
        for (int64_t j = 0; j < cols_; ++j) out[j] = static_cast<float>(0.02 * rng_.normal());
        return;
      case ParamRole::kImageMarker:
        for (int64_t j = 0; j < cols_; ++j) out[j] = static_cast<float>(rng_.normal());
        return;
      case ParamRole::kRouterWeight: {  // N(0, 1/H) with d projected out
        double dot = 0;
        for (int64_t j = 0; j < cols_; ++j) {
          out[j] = static_cast<float>(sigma_ * rng_.normal());
          if (j < static_cast<int64_t>(d_.size())) dot += out[j] * d_[j];
        }
        for (int64_t j = 0; j < cols_ && j < static_cast<int64_t>(d_.size()); ++j)
          out[j] = static_cast<float>(out[j] - dot * d_[j]);
        return;
      }
      case ParamRole::kIndexerWeightsProj: {  // d / sqrt(H) + N(0, 0.1^2 / H)
        const double inv = 1.0 / std::sqrt(static_cast<double>(cols_));
        for (int64_t j = 0; j < cols_; ++j)
          out[j] = static_cast<float>((j < static_cast<int64_t>(d_.size()) ? d_[j] * inv : 0.0) +
                                      0.1 * inv * rng_.normal());
        return;
      }
      case ParamRole::kEngramTable:
      case ParamRole::kExpertUp:
      case ParamRole::kExpertDown:
        if (p_.format != ParamFormat::kFp8Linear) {  // per row per 32 inputs gain
          for (int64_t b = 0; b < cols_; b += 32) {
            const double g = sigma_ * std::exp2(rng_.uniform(-1, 1));
            for (int64_t j = b; j < std::min(cols_, b + 32); ++j)
              out[j] = static_cast<float>(g * rng_.normal());
          }
          return;
        }
        [[fallthrough]];
      default: {
        const float* g =
            gains_.empty() ? nullptr : &gains_[static_cast<size_t>((r / quant::kFp8Tile) * tile_cols_)];
        for (int64_t j = 0; j < cols_; ++j)
          out[j] = static_cast<float>(sigma_ * rng_.normal() * (g ? g[j / quant::kFp8Tile] : 1.0f));
        return;
      }
    }
  }

 private:
  const ContractParam& p_;
  Rng rng_;
  const std::vector<float>& d_;
  int64_t rows_ = 0, cols_ = 0, row_ = 0, tile_cols_ = 0;
  double sigma_ = 1.0;
  std::vector<float> gains_;
};

}  // namespace

RandomWeights::RandomWeights(const ModelConfig& c, const TensorContract& contract, uint64_t seed)
    : c_(c), contract_(contract), seed_(seed) {
  Rng r(mix(seed, name_hash("shared_direction")));
  direction_.resize(static_cast<size_t>(std::max<int64_t>(c.hidden_size, 0)));
  double n2 = 0;
  for (float& x : direction_) {
    x = static_cast<float>(r.normal());
    n2 += static_cast<double>(x) * x;
  }
  const double inv = n2 > 0 ? 1.0 / std::sqrt(n2) : 0.0;
  for (float& x : direction_) x = static_cast<float>(x * inv);
}

std::vector<float> RandomWeights::master(size_t param_index) const {
  const ContractParam& p = contract_.params[param_index];
  RowGen g(p, seed_, direction_);
  std::vector<float> out(static_cast<size_t>(g.rows() * g.cols()));
  for (int64_t r = 0; r < g.rows(); ++r) g.next_row(&out[static_cast<size_t>(r * g.cols())]);
  return out;
}

void RandomWeights::plain_rows(const ContractParam& p, uint8_t* out) const {
  RowGen g(p, seed_, direction_);
  std::vector<float> row(static_cast<size_t>(g.cols()));
  for (int64_t r = 0; r < g.rows(); ++r) {
    g.next_row(row.data());
    if (p.dtype == DType::kF32) {
      std::memcpy(out + r * g.cols() * 4, row.data(), static_cast<size_t>(g.cols()) * 4);
    } else {
      uint8_t* o = out + r * g.cols() * 2;
      for (int64_t j = 0; j < g.cols(); ++j) {
        uint16_t b = f32_to_bf16(row[static_cast<size_t>(j)]);
        std::memcpy(o + 2 * j, &b, 2);
      }
    }
  }
}

Status RandomWeights::quantize_param(int32_t pi) {
  const ContractParam& p = contract_.params[static_cast<size_t>(pi)];
  std::vector<float> w = master(static_cast<size_t>(pi));
  const int64_t out = p.shape[0], in = p.shape[1];
  cache_.param = -1;
  switch (p.format) {
    case ParamFormat::kFp8Linear:
      cache_.weight.resize(static_cast<size_t>(out * in));
      cache_.scale.resize(static_cast<size_t>(quant::ceil_div(out, 32) * quant::ceil_div(in, 32)));
      quant::fp8_tiles_quantize(w.data(), out, in, cache_.weight.data(), cache_.scale.data());
      break;
    case ParamFormat::kFp4Expert:
      cache_.weight.resize(static_cast<size_t>(out * in / 2));
      cache_.scale.resize(static_cast<size_t>(out * in / 32));
      quant::fp4_rows_quantize(w.data(), out, in, cache_.weight.data(), cache_.scale.data());
      break;
    case ParamFormat::kEngramTable:
      cache_.weight.resize(static_cast<size_t>(out * in));
      cache_.scale.resize(static_cast<size_t>(out * in / 32));
      quant::engram_rows_quantize(w.data(), out, in, cache_.weight.data(), cache_.scale.data());
      break;
    case ParamFormat::kPlain: return internal_error("quantize_param on a plain tensor");
  }
  cache_.param = pi;
  return ok_status();
}

Status RandomWeights::fill(size_t index, uint8_t* out, uint64_t nbytes) {
  if (index >= contract_.tensors.size())
    return out_of_range("tensor index " + std::to_string(index) + " out of range");
  const ExpectedTensor& t = contract_.tensors[index];
  if (nbytes != t.nbytes())
    return invalid_argument("tensor '" + t.name + "': buffer of " + std::to_string(nbytes) +
                            " bytes, needs " + std::to_string(t.nbytes()));
  const ContractParam& p = contract_.params[static_cast<size_t>(t.param)];
  if (p.format == ParamFormat::kPlain) {
    plain_rows(p, out);
    return ok_status();
  }
  if (cache_.param != t.param) DS41_RETURN_IF_ERROR(quantize_param(t.param));
  const std::vector<uint8_t>& src = t.is_scale ? cache_.scale : cache_.weight;
  if (src.size() != nbytes) return internal_error("tensor '" + t.name + "': quantized size mismatch");
  std::memcpy(out, src.data(), nbytes);
  return ok_status();
}

}  // namespace ds41::model
