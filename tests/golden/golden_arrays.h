// Test support: read the public golden arrays with the loader's SafetensorsFile, build the
// golden model on the CPU reference backend, and the golden README's row error
// e_r = max_j |c - g| / rms(g).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "model/loader/safetensors.h"
#include "model/model.h"

namespace ds41::testing {

inline std::string golden_dir() { return std::string(DS41_SHARED_DIR) + "/golden/v41-tiny-public"; }
inline std::string dspark_golden_dir() {
  return std::string(DS41_SHARED_DIR) + "/golden/v41-tiny-dspark-public";
}
inline std::string tokenizer_dir() { return std::string(DS41_SHARED_DIR) + "/tokenizer-v41"; }

template <typename T>
struct Array {
  std::vector<int64_t> shape;
  std::vector<T> v;
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  int64_t row_size() const { return rows() ? static_cast<int64_t>(v.size()) / rows() : 0; }
};

class GoldenFile {
 public:
  explicit GoldenFile(const std::string& path) {
    auto f = model::SafetensorsFile::open(path);
    EXPECT_TRUE(f.ok()) << f.status().message();
    if (f.ok()) f_ = std::move(f).value();
  }
  bool has(const std::string& name) const { return f_ && f_->header().tensors.count(name); }
  template <typename T>
  Array<T> get(const std::string& name) const {
    Array<T> a;
    auto it = f_->header().tensors.find(name);
    if (it == f_->header().tensors.end()) {
      ADD_FAILURE() << "golden array missing: " << name;
      return a;
    }
    a.shape = it->second.shape;
    a.v.resize(it->second.nbytes() / sizeof(T));
    std::memcpy(a.v.data(), f_->data(it->second), it->second.nbytes());
    return a;
  }

 private:
  std::unique_ptr<model::SafetensorsFile> f_;
};

struct TestModel {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<backends::cpu::CpuBackend> backend;
  std::unique_ptr<model::Model> model;
};

inline TestModel load_golden_model(int threads = 2, const std::string& dir = golden_dir(),
                                   backends::cpu::CpuBackendOptions opt = {}) {
  TestModel t;
  t.pool = std::make_unique<ThreadPool>(threads);
  t.backend = std::make_unique<backends::cpu::CpuBackend>(t.pool.get(), opt);
  model::LoadOptions lo;
  lo.tokenizer_dir = tokenizer_dir();
  auto m = model::Model::load(dir, lo, t.backend.get());
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (m.ok()) t.model = std::move(m).value();
  return t;
}

// The golden owner state layer l of prompt2 reads in the teacher-forced check (golden README "How to check
// an engine"): its KV owner's compressed KV and index keys, its index owner's top-k, the candidate mask; the
// arrays live here, `in` points into them (tokens / streams / pi are the caller's).
struct TeacherForcedOwners {
  Array<float> okv, okeys;
  Array<int32_t> otopk;
  Array<uint8_t> cmask;
  void fill(const GoldenFile& gold, const model::ModelConfig& c, const model::LayerPlan& p, int64_t l,
            model::TeacherForcedInput* in) {
    const std::string L = "prompt2.layer";
    if (p.ratio > 0 && p.kv_owner != l) {
      okv = gold.get<float>(L + std::to_string(p.kv_owner) + ".compressed_kv");
      okeys = gold.get<float>(L + std::to_string(p.kv_owner) + ".index_keys");
      in->owner_kv = okv.v.data();
      in->owner_keys = okeys.v.data();
      in->owner_entries = okv.rows();
    }
    if (p.ratio > 0 && p.idx_owner != l) {
      otopk = gold.get<int32_t>(L + std::to_string(p.idx_owner) + ".topk_indices");
      in->owner_topk = otopk.v.data();
      in->owner_topk_width = otopk.row_size();
    }
    if (p.candidate_restricted) {
      cmask = gold.get<uint8_t>(L + std::to_string(c.candidate_source_layer_id) + ".candidate_mask");
      in->cand_mask = cmask.v.data();
      in->cand_width = cmask.row_size();
    }
  }
};

// Golden README row error.
inline double row_error(const float* g, const float* c, int64_t n) {
  double mx = 0, ss = 0;
  for (int64_t j = 0; j < n; ++j) {
    mx = std::max(mx, std::fabs(static_cast<double>(c[j]) - g[j]));
    ss += static_cast<double>(g[j]) * g[j];
  }
  return mx / std::max(std::sqrt(ss / n), 1e-30);
}

// Sets of non-negative ids of one row.
inline std::vector<int32_t> id_set(const int32_t* p, int64_t n) {
  std::vector<int32_t> s;
  for (int64_t i = 0; i < n; ++i)
    if (p[i] >= 0) s.push_back(p[i]);
  std::sort(s.begin(), s.end());
  return s;
}

}  // namespace ds41::testing
