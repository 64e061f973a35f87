// ds41 model: the Engram module (MODEL_SPEC 3.2.4): gather the dequantized table rows of the
// position's hash ids (computed by ds41_engram's hasher in ForwardPass::setup), project with
// engram.wkv into one key per stream and a shared value, and update every stream with its own
// gate. DEAD positions (image spans) are left unchanged.
#include <cmath>
#include <vector>

#include "core/check.h"
#include "model/forward_pass.h"

namespace ds41::model {

void ForwardPass::engram_stage(int64_t l) {
  const EngramWeights* ew = m_.weights().layers[l].engram.get();
  DS41_CHECK(ew != nullptr && m_.hasher() != nullptr, "engram layer without weights or hasher");
  const int64_t n = n_, H = c_.hidden_size, C = c_.hc_mult, ed = c_.engram_head_dim;
  const int64_t li = c_.engram_index(l), nel = static_cast<int64_t>(c_.engram_layer_ids.size());
  const int64_t cols = m_.hasher()->n_cols();
  std::vector<int64_t> ids(n * cols);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t id = hash_ids_[(r * nel + li) * cols + j];
      DS41_CHECK(id >= 0 && id < ew->rows, "engram row id %lld outside the table of %lld rows",
                 static_cast<long long>(id), static_cast<long long>(ew->rows));
      ids[r * cols + j] = id;
    }
  std::vector<float> rows(n * cols * ed), z(n * (C + 1) * H), keys(n * C * H), value(n * H), gates(n * C);
  be_.engram_gather(ew->table, ew->table_scale, ed, ids.data(), n, cols, rows.data());
  be_.linear(ew->wkv, rows.data(), n, z.data());
  for (int64_t r = 0; r < n; ++r) {
    std::copy(&z[r * (C + 1) * H], &z[r * (C + 1) * H + C * H], &keys[r * C * H]);
    std::copy(&z[r * (C + 1) * H + C * H], &z[(r + 1) * (C + 1) * H], &value[r * H]);
  }
  be_.engram_update(streams_.data(), keys.data(), value.data(), ew->omega.data(),
                    any_dead_ ? dead_.data() : nullptr, n, C, H, static_cast<float>(c_.rms_norm_eps),
                    gates.data());
  dump("layer" + std::to_string(l) + ".engram_out", {n, C, H}, streams_.data());
  dump("layer" + std::to_string(l) + ".engram_gate", {n, C}, gates.data());
  if (opt_.dump && *opt_.dump) {
    // RMS over streams and channels of the update g_c * value (the golden engram_delta_rms;
    // exactly 0 at DEAD positions, whose gates are 0).
    std::vector<float> rms(n);
    for (int64_t r = 0; r < n; ++r) {
      double g2 = 0, v2 = 0;
      for (int64_t c = 0; c < C; ++c) g2 += static_cast<double>(gates[r * C + c]) * gates[r * C + c];
      for (int64_t h = 0; h < H; ++h) v2 += static_cast<double>(value[r * H + h]) * value[r * H + h];
      rms[r] = static_cast<float>(std::sqrt(g2 * v2 / static_cast<double>(C * H)));
    }
    dump("layer" + std::to_string(l) + ".engram_delta_rms", {n}, rms.data());
  }
}

}  // namespace ds41::model
