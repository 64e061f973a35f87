// ds41 model: the DSpark context path (MODEL_SPEC 3.10.2-3.10.3): per committed position the
// 4-stream means entering the dspark_target_layer_ids layers (captured during every target
// forward), concatenated, projected by main_proj and normed (main_x); each stage's window row
// Q_win(RoPE_p(RMSNorm(wkv . main_x; kv_norm))) with base rope_theta and no YaRN, stored in the
// stage's ring for committed positions only. Also Dspark's construction and accessors.
#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "model/dspark.h"
#include "model/forward_pass.h"
#include "quant/fake_quant.h"

namespace ds41::model {

// Called at the start of block l, after its Engram (if any): the streams entering block l.
// The plain mean over the stream axis ([R] h.mean(dim=2)) is a collapse with weights 1/C.
void ForwardPass::capture_dspark_features(int64_t l) {
  const std::vector<int64_t>& ids = c_.dspark_target_layer_ids;
  const auto it = std::find(ids.begin(), ids.end(), l);
  if (it == ids.end()) return;
  const int64_t H = c_.hidden_size, C = c_.hc_mult, nt = static_cast<int64_t>(ids.size());
  const int64_t slot = it - ids.begin();
  std::vector<float> mean_w(n_ * C, 1.0f / static_cast<float>(C)), a(n_ * H);
  be_.hc_collapse(streams_.data(), mean_w.data(), n_, C, H, a.data());
  for (int64_t r = 0; r < n_; ++r)
    std::memcpy(&dspark_feat_[(r * nt + slot) * H], &a[r * H], H * sizeof(float));
}

Result<Dspark> Dspark::create(const Model& m) {
  if (!m.dspark_weights())
    return failed_precondition("DSpark: the checkpoint has no draft stages (num_nextn_predict_layers = 0)");
  return Dspark(m);
}

int64_t Dspark::block_size() const { return m_->config().dspark_block_size; }
int64_t Dspark::n_stages() const { return m_->dspark_weights()->n_stages(); }
int64_t Dspark::feature_width() const {
  return static_cast<int64_t>(m_->config().dspark_target_layer_ids.size()) * m_->config().hidden_size;
}

void Dspark::enable(SequenceState& st) const {
  if (st.dspark) return;
  st.dspark.emplace(n_stages(), m_->config().sliding_window, m_->kv_layout().window_row_bytes);
  st.dspark->set_next_position(st.position());
}

DsparkContextRows Dspark::context_rows(const float* features, int64_t n, int64_t first_pos) const {
  const ModelConfig& c = m_->config();
  const DsparkWeights& w = *m_->dspark_weights();
  ops::Backend& be = m_->backend();
  const int64_t H = c.hidden_size, hd = c.head_dim, wrb = m_->kv_layout().window_row_bytes;
  const float eps = static_cast<float>(c.rms_norm_eps);
  DsparkContextRows out;
  out.main_x.resize(n * H);
  if (n == 0) return out;
  be.linear(w.main_proj, features, n, out.main_x.data());
  be.rms_norm(out.main_x.data(), n, H, w.main_norm.data(), eps, out.main_x.data());
  std::vector<int64_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = first_pos + i;
  const std::vector<float>& inv = m_->rope_inv_freq(false);  // ratio-0 rule: base rope_theta, no YaRN
  for (int64_t s = 0; s < w.n_stages(); ++s) {
    const LayerWeights& sw = w.stages[s];
    std::vector<float> kv(n * hd);
    std::vector<uint8_t> packed(n * wrb);
    be.linear(sw.wkv, out.main_x.data(), n, kv.data());  // every stage reads the same main_x
    be.rms_norm(kv.data(), n, hd, sw.kv_norm.data(), eps, kv.data());
    be.rope(kv.data(), n, 1, hd, pos.data(), inv.data(), static_cast<int64_t>(inv.size()), false);
    for (int64_t r = 0; r < n; ++r) {
      quant::q_win_encode(&kv[r * hd], hd, &packed[r * wrb]);
      quant::q_win_decode(&packed[r * wrb], hd, &kv[r * hd]);
    }
    out.window_kv.push_back(std::move(kv));
    out.packed.push_back(std::move(packed));
  }
  return out;
}

Status Dspark::commit_context(SequenceState& st, const float* features, int64_t n, int64_t first_pos) const {
  if (!st.dspark) return failed_precondition("DSpark: the sequence has no draft state (Dspark::enable)");
  DsparkState& ds = *st.dspark;
  if (first_pos != ds.next_position())
    return failed_precondition("DSpark: context rows for positions " + std::to_string(first_pos) +
                               ".. but the " + "draft rings continue at " +
                               std::to_string(ds.next_position()));
  if (n <= 0) return ok_status();
  const int64_t W = ds.window(), skip = std::max<int64_t>(0, n - W);
  const int64_t F = feature_width(), wrb = ds.row_bytes();
  DsparkContextRows rows = context_rows(features + skip * F, n - skip, first_pos + skip);
  for (int64_t s = 0; s < ds.n_stages(); ++s)
    for (int64_t i = 0; i < n - skip; ++i)
      std::memcpy(ds.row(s, first_pos + skip + i), &rows.packed[s][i * wrb], wrb);
  ds.set_next_position(first_pos + n);
  return ok_status();
}

}  // namespace ds41::model
