// ds41 model: the attention sublayer (MODEL_SPEC 3.4): query path, window KV with Q_win and the
// per-layer RoPE policy, the compressor (ratio-r pooling with the pending group kept in the
// sequence state across calls), the indexer with the candidate pool and its restriction,
// Full / Reindex / Reuse ownership from the schedule, visibility by absolute position, the
// sink, inverse rotation of the output and the grouped output projection.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "model/forward_pass.h"
#include "model/spec_rollback.h"
#include "quant/fake_quant.h"

namespace ds41::model {

void ForwardPass::attention(int64_t l, const float* x, float* y) {
  const LayerPlan& p = m_.schedule().layers[l];
  const LayerWeights& w = m_.weights().layers[l];
  const int64_t n = n_, nh = c_.num_attention_heads, hd = c_.head_dim, qr = c_.q_lora_rank;
  const int64_t W = c_.sliding_window, wrb = m_.kv_layout().window_row_bytes;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const std::vector<float>& inv = m_.rope_inv_freq(p.yarn_rope);
  const int64_t nf = static_cast<int64_t>(inv.size());
  const std::string L = "layer" + std::to_string(l) + ".";

  // 3.4.2 query: q_r = RMSNorm(wq_a x), q = wq_b q_r, rotated per head (no per-head norm).
  std::vector<float> q_r(n * qr), q(n * nh * hd), kv(n * hd);
  be_.linear(w.wq_a, x, n, q_r.data());
  be_.rms_norm(q_r.data(), n, qr, w.q_norm.data(), eps, q_r.data());
  be_.linear(w.wq_b, q_r.data(), n, q.data());
  be_.rope(q.data(), n, nh, hd, pos_.data(), inv.data(), nf, false);
  // 3.4.3 window KV: RMSNorm(wkv x), rotate, Q_win over all channels; kept packed (lossless).
  be_.linear(w.wkv, x, n, kv.data());
  be_.rms_norm(kv.data(), n, hd, w.kv_norm.data(), eps, kv.data());
  be_.rope(kv.data(), n, 1, hd, pos_.data(), inv.data(), nf, false);
  std::vector<uint8_t> kvp(n * wrb);
  for (int64_t r = 0; r < n; ++r) {
    quant::q_win_encode(&kv[r * hd], hd, &kvp[r * wrb]);
    quant::q_win_decode(&kvp[r * wrb], hd, &kv[r * hd]);
  }
  dump(L + "window_kv", {n, hd}, kv.data());

  if (p.kv_source) compress(l, x);
  if (p.index_source) index(l, x, q_r.data());

  // 3.4.7 entry sets: window rows (this layer) + selected compressed entries (KV owner).
  const Published* sel = p.ratio > 0 ? &pub_.at(p.idx_owner) : nullptr;
  const int64_t kmax = sel ? sel->width : 0;
  std::vector<int64_t> offs(n + 1, 0);
  std::vector<const float*> ptrs;
  ptrs.reserve(n * (W + kmax));
  std::vector<float> comp(n * kmax * hd);
  std::vector<std::vector<float>> rings(seqs_.size());
  for (size_t si = 0; si < seqs_.size(); ++si) {
    const SeqRows& s = seqs_[si];
    SequenceState& st = *s.st;
    const int64_t floor = st.window_floor(l);
    // Ring rows needed by this chunk: positions [max(floor, start - W + 1), start).
    std::vector<float>& rf = rings[si];
    rf.assign(W * hd, 0.0f);
    for (int64_t t = std::max<int64_t>({floor, s.start_pos - W + 1, 0}); t < s.start_pos; ++t)
      quant::q_win_decode(st.window_row(l, t), hd, &rf[(t % W) * hd]);
    const KvSourceState* owner = p.ratio > 0 ? st.source(p.kv_owner) : nullptr;
    for (int64_t r = s.begin; r < s.end; ++r) {
      const int64_t pr = pos_[r];
      for (int64_t t = std::max<int64_t>({floor, pr - W + 1, 0}); t <= pr; ++t)
        ptrs.push_back(t >= s.start_pos ? &kv[(s.begin + t - s.start_pos) * hd] : &rf[(t % W) * hd]);
      if (sel) {
        DS41_CHECK(owner != nullptr, "reuse layer without a KV owner state");
        for (int64_t j = 0; j < kmax; ++j) {
          const int32_t k = sel->sel[r * kmax + j];
          if (k < 0) continue;
          DS41_CHECK_LT(k, owner->count, "selected compressed entry beyond the owner's cache");
          float* dst = &comp[(r * kmax + j) * hd];
          quant::q_kv_decode(owner->kv_row(k), hd, dst);
          ptrs.push_back(dst);
        }
      }
      offs[r + 1] = static_cast<int64_t>(ptrs.size());
    }
  }
  std::vector<float> o(n * nh * hd);
  ops::AttentionArgs a;
  a.n = n;
  a.n_heads = nh;
  a.head_dim = hd;
  a.q = q.data();
  a.kv_offsets = offs.data();
  a.kv = ptrs.data();
  a.sink = w.attn_sink.data();
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  a.out = o.data();
  be_.attention(a);
  // Undo the query rotation on the output (7.9), then the grouped output projection (3.4.8).
  be_.rope(o.data(), n, nh, hd, pos_.data(), inv.data(), nf, true);
  std::vector<float> z(n * c_.o_groups * c_.o_lora_rank);
  be_.grouped_linear(w.wo_a, c_.o_groups, o.data(), n, z.data());
  be_.linear(w.wo_b, z.data(), n, y);

  // Window ring update (after every query of the call has read the old rows).
  for (const SeqRows& s : seqs_) {
    const int64_t end_pos = s.start_pos + (s.end - s.begin);
    for (int64_t t = std::max(s.start_pos, end_pos - W); t < end_pos; ++t) {
      if (s.journal) s.journal->save_ring_row(l, t, s.st->window_row(l, t), wrb);  // 3.10.8 undo
      std::memcpy(s.st->window_row(l, t), &kvp[(s.begin + t - s.start_pos) * wrb], wrb);
    }
  }
}

// 3.4.4: compressed entries of a KV source. Groups of `ratio` consecutive positions; the
// partial group at the end of a call stays in the state (pend_*). An entry whose index the
// state already holds is not rewritten (encoder replay, MODEL_SPEC 4.5).
void ForwardPass::compress(int64_t l, const float* x) {
  const LayerPlan& p = m_.schedule().layers[l];
  const LayerWeights& w = m_.weights().layers[l];
  const int64_t n = n_, hd = c_.head_dim, dI = c_.index_head_dim, R = p.ratio;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  std::vector<float> a(n * hd), b;
  be_.linear(w.c_wkv, x, n, a.data());
  if (R > 1) {
    DS41_CHECK(w.c_wgate.present(), "ratio > 1 compressor without wgate");
    b.resize(n * hd);
    be_.linear(w.c_wgate, x, n, b.data());
  }
  struct Emit {
    KvSourceState* src;
    int64_t k;
  };
  std::vector<Emit> emits;
  std::vector<float> zs;
  for (const SeqRows& s : seqs_) {
    KvSourceState* src = s.st->source(l);
    DS41_CHECK(src != nullptr, "KV source without state");
    int64_t next = src->count;  // next entry index to emit
    for (int64_t r = s.begin; r < s.end; ++r) {
      const int64_t pr = pos_[r], k = pr / R, slot = pr % R;
      bool emit = false;
      if (R == 1) {
        emit = k >= next;
        if (emit) zs.insert(zs.end(), &a[r * hd], &a[(r + 1) * hd]);
      } else {
        std::memcpy(&src->pend_a[slot * hd], &a[r * hd], hd * sizeof(float));
        std::memcpy(&src->pend_b[slot * hd], &b[r * hd], hd * sizeof(float));
        src->pend_filled[slot] = 1;
        if (slot == R - 1) {
          bool full =
              std::all_of(src->pend_filled.begin(), src->pend_filled.end(), [](uint8_t f) { return f != 0; });
          std::fill(src->pend_filled.begin(), src->pend_filled.end(), 0);
          emit = k >= next;
          if (emit) {
            DS41_CHECK(full, "compressor group completed without all of its rows");
            zs.resize(zs.size() + hd);
            be_.softmax_pool(src->pend_a.data(), src->pend_b.data(), R, hd, zs.data() + zs.size() - hd);
          }
        }
      }
      // MODEL_SPEC 3.10.8: the half-pair buffer after every row, and which rows emitted.
      if (s.journal) s.journal->note_source_row(l, pr, *src, emit);
      if (!emit) continue;
      DS41_CHECK_EQ(k, next, "compressed entries must be emitted in order");
      emits.push_back({src, k});
      ++next;
    }
  }
  const int64_t m = static_cast<int64_t>(emits.size());
  if (m == 0) return;
  // u = RMSNorm(z); entry = Q_kv(rotate(u, first position)); key = Q_idx(rotate(RMSNorm(wk u))).
  std::vector<float> u(m * hd), e(m * hd), kk(m * dI);
  std::vector<int64_t> kpos(m);
  for (int64_t i = 0; i < m; ++i) kpos[i] = emits[i].k * R;
  be_.rms_norm(zs.data(), m, hd, w.c_norm.data(), eps, u.data());
  e = u;
  const std::vector<float>& inv = m_.rope_inv_freq(true);
  be_.rope(e.data(), m, 1, hd, kpos.data(), inv.data(), static_cast<int64_t>(inv.size()), false);
  be_.linear(w.idx_wk, u.data(), m, kk.data());
  be_.rms_norm(kk.data(), m, dI, w.idx_k_norm.data(), eps, kk.data());
  be_.rope(kk.data(), m, 1, dI, kpos.data(), inv.data(), static_cast<int64_t>(inv.size()), false);
  for (int64_t i = 0; i < m; ++i) {
    KvSourceState* src = emits[i].src;
    const int64_t kb = src->layout.kv_row_bytes, ib = src->layout.key_row_bytes;
    src->kv_rows.resize((src->count + 1) * kb);
    src->key_rows.resize((src->count + 1) * ib);
    quant::q_kv_encode(&e[i * hd], hd, src->kv_rows.data() + src->count * kb);
    quant::q_idx_encode(&kk[i * dI], dI, src->key_rows.data() + src->count * ib);
    ++src->count;
  }
  for (const SeqRows& s : seqs_) s.st->last_published_source = l;
  if (opt_.dump && *opt_.dump) {  // the entries as stored (decoded from the packed rows)
    std::vector<float> ev(m * hd), kv(m * dI);
    for (int64_t i = 0; i < m; ++i) {
      const KvSourceState* src = emits[i].src;
      const int64_t k = emits[i].k;
      quant::q_kv_decode(src->kv_row(k), hd, &ev[i * hd]);
      quant::q_idx_decode(src->key_row(k), dI, &kv[i * dI]);
    }
    dump("layer" + std::to_string(l) + ".compressed_kv", {m, hd}, ev.data());
    dump("layer" + std::to_string(l) + ".index_keys", {m, dI}, kv.data());
  }
}

// 3.4.6: indexer query, head weights, scores over the visible keys of the KV owner, the
// candidate pool (candidate source) or its restriction (later index sources), top-k.
void ForwardPass::index(int64_t l, const float* x, const float* q_r) {
  const LayerPlan& p = m_.schedule().layers[l];
  const LayerWeights& w = m_.weights().layers[l];
  const int64_t n = n_, nih = c_.index_n_heads, dI = c_.index_head_dim, K = c_.index_topk, R = p.ratio;
  const std::vector<float>& inv = m_.rope_inv_freq(true);
  std::vector<float> qi(n * nih * dI), wt(n * nih);
  be_.linear(w.idx_wq_b, q_r, n, qi.data());
  be_.rope(qi.data(), n, nih, dI, pos_.data(), inv.data(), static_cast<int64_t>(inv.size()), false);
  for (int64_t r = 0; r < n * nih; ++r) quant::q_idx_inplace(&qi[r * dI], dI);
  be_.linear(w.idx_weights_proj, x, n, wt.data());
  const float wscale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(nih)));
  for (float& v : wt) v *= wscale;

  Published& P = pub_[l];
  P.width = K;
  P.sel.assign(n * K, -1);
  P.cand.assign(seqs_.size(), {});
  P.cand_t.assign(seqs_.size(), 0);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t si = 0; si < seqs_.size(); ++si) {
    const SeqRows& s = seqs_[si];
    const int64_t rows = s.end - s.begin;
    int64_t key_layer = p.kv_owner;
    int64_t key_ratio = R;
    // MODEL_SPEC 7.21 (opt-in): the official reference's stale keys on incomplete-group steps.
    if (opt_.stale_index_keys && R > 1 && rows == 1 && (pos_[s.begin] + 1) % R != 0 &&
        s.st->last_published_source >= 0 && s.st->last_published_source != p.kv_owner) {
      key_layer = s.st->last_published_source;
      key_ratio = m_.schedule().layers[key_layer].ratio;
    }
    const KvSourceState* src = s.st->source(key_layer);
    DS41_CHECK(src != nullptr, "index source without a KV owner state");
    const int64_t T = src->count;
    std::vector<float> keys(T * dI);
    for (int64_t t = 0; t < T; ++t) quant::q_idx_decode(src->key_row(t), dI, &keys[t * dI]);
    std::vector<int64_t> vis(rows);
    for (int64_t r = 0; r < rows; ++r) vis[r] = std::min(T, (pos_[s.begin + r] + 1) / key_ratio);
    std::vector<float> sc(rows * T);
    ops::IndexerArgs ia;
    ia.n = rows;
    ia.n_heads = nih;
    ia.head_dim = dI;
    ia.n_keys = T;
    ia.q = &qi[s.begin * nih * dI];
    ia.w = &wt[s.begin * nih];
    ia.keys = keys.data();
    ia.visible = vis.data();
    ia.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dI)));
    ia.out = sc.data();
    if (T > 0) be_.indexer_scores(ia);
    if (p.candidate_source) {
      P.cand[si].assign(rows * T, 0);
      P.cand_t[si] = T;
      if (T > 0)
        be_.candidate_pool(sc.data(), vis.data(), rows, T, c_.candidate_block_size, c_.candidate_topk_blocks,
                           P.cand[si].data());
      if (opt_.record) {
        const int64_t B = c_.candidate_block_size, nb = c_.candidate_topk_blocks;
        auto& cb = records_[si].cand_blocks[l];
        cb.assign(rows * nb, -1);
        for (int64_t r = 0; r < rows; ++r) {
          int64_t j = 0;
          for (int64_t b0 = 0; b0 * B < T && j < nb; ++b0)
            if (P.cand[si][r * T + b0 * B]) cb[r * nb + j++] = static_cast<int32_t>(b0);
        }
      }
    } else if (p.candidate_restricted && key_layer == p.kv_owner) {
      const Published& C = pub_.at(c_.candidate_source_layer_id);
      const std::vector<uint8_t>& mask = C.cand[si];
      const int64_t Tc = C.cand_t[si];
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t t = 0; t < T; ++t)
          if (t >= Tc || !mask[r * Tc + t]) sc[r * T + t] = neg_inf;
    }
    be_.topk_rows(sc.data(), rows, T, K, &P.sel[s.begin * K]);
    if (key_layer != p.kv_owner) {  // stale keys: indices must still address the owner's cache
      const int64_t own = std::min(s.st->source(p.kv_owner)->count, (pos_[s.begin] + 1) / R);
      for (int64_t j = 0; j < K; ++j)
        if (P.sel[s.begin * K + j] >= own) P.sel[s.begin * K + j] = -1;
    }
    if (opt_.record) records_[si].topk[l].assign(&P.sel[s.begin * K], &P.sel[s.end * K]);
  }
}

}  // namespace ds41::model
