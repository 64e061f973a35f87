// ds41 gpu: the attention sublayer on the device (MODEL_SPEC 3.4) — the twin of
// src/model/attention_layer.cpp: query path, window KV through Q_win (packed into the ring after
// the earlier rows were decoded), the compressor with the pending group kept on the device across
// calls, the indexer over decoded Q_idx keys with the candidate pool and its restriction, top-k,
// sparse attention over window + selected compressed entries with the sink, inverse RoPE and the
// grouped output projection. Selections stay on the device: gx_step_kernels turn them into row
// offsets and entry lists.
#include <cmath>
#include <string>

#include "backends/cuda/attention_kernels.h"
#include "backends/cuda/compressor_kernels.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/fused_rows_kernels.h"
#include "backends/cuda/gx_step_kernels.h"
#include "backends/cuda/indexer_kernels.h"
#include "backends/cuda/kv_rows_kernels.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/linear_kernels.h"
#include "backends/cuda/topk_kernels.h"
#include "gpu/gpu_forward.h"

namespace ds41::gpu {

using cuda::FakeQuantOp;

Status GpuForward::attention(int64_t l, const float* x, float* y, const GpuForwardOptions& opt,
                             std::vector<model::SequenceOutput>* out, const cuda::HcExpandEpilogue* expand,
                             cuda::HcMapFold* map) {
  const model::LayerPlan& p = m_->schedule().layers[l];
  // The site's map (run_layer left it to this call, DS41_HC_MAP_FOLD): carried by wq_b's one-weight normed launch
  // below; an index source's wq_b runs with idx_wq_b, so its map goes out now, as hc_site would launch it.
  if (map != nullptr && p.index_source) {
    DS41_RETURN_IF_ERROR(site_map(map->site));
    map = nullptr;
  }
  const DeviceLayer& w = m_->weights().layers[l];
  const int64_t n = n_, hd = c_->head_dim, qr = c_->q_lora_rank;
  const int64_t W = c_->sliding_window, K = c_->index_topk;
  const float eps = static_cast<float>(c_->rms_norm_eps);
  const DeviceVec& inv = m_->rope_inv_freq(p.yarn_rope);

  // 3.4.7 entry sets: window rows + the selected compressed entries of the KV owner, decoded
  // into kvf rows comp_base + r * K + j; or, in a prefill chunk whose n * K selections outnumber the
  // owner's entries (a 16K chunk: 8.4M selections of <= 16K entries), every entry decoded once into
  // kvf rows comp_base + (the sequence's first entry row) + e. The same values either way (the
  // decode is exact), so the attention's bits do not depend on the choice; decode steps and
  // verifications keep the per-selection rows (their launch shapes stay fixed for the graphs).
  // They read the selections (ws_.sel) and the owner's pages only: a layer that is no index source
  // reads the selections of an earlier layer, so its entries are decoded on the side stream with the
  // window rows (kvf rows from comp_base on, after the window's [0, comp_base)).
  const int64_t* kv_offsets = win_offsets_;
  const int32_t* kv_index = win_index_;
  int64_t max_entries = W;
  // The decode-shaped form's arguments (selected_entries), or false for the table form.
  cuda::SelectedEntriesArgs se;
  auto selected_args = [&]() -> bool {
    const PlanSource& src = sources_[source_of_layer_[p.kv_owner]];
    const int64_t comp_base = n + ring_rows_;
    se.pages = source_rows(src, /*keys=*/false);
    se.sel = ws_.sel;
    se.n = n;
    se.k = K;
    se.row_seq = row_seq_;
    se.op = FakeQuantOp::kKv;
    se.channels = hd;
    se.base = pool_->base();
    se.rows = ws_.kvf + comp_base * hd;
    se.win_offsets = win_offsets_;
    se.win_index = win_index_;
    se.comp_base = comp_base;
    se.kv_offsets = ws_.kv_offsets;
    se.kv_index = ws_.kv_index;
    return row_invariant_ || src.total_keys >= n * K || !table_decode_enabled();
  };
  auto entries_listed = [&]() {  // the attention reads the lists the entries' launch wrote
    kv_offsets = ws_.kv_offsets;
    kv_index = ws_.kv_index;
    max_entries = W + K;
  };
  auto entries = [&]() -> Status {
    if (p.ratio == 0) return ok_status();
    cudaStream_t s = stream_;
    if (!selected_args()) {
      const PlanSource& src = sources_[source_of_layer_[p.kv_owner]];
      const int64_t n_seqs = static_cast<int64_t>(seqs_.size());
      DS41_RETURN_IF_ERROR(
          cuda::run_paged_row_offsets(se.pages, src.key_row_begin, n_seqs, src.total_keys, ws_.sel_offsets, s));
      if (src.total_keys > 0)
        DS41_RETURN_IF_ERROR(cuda::run_decode_rows_gather(FakeQuantOp::kKv, hd, pool_->base(), ws_.sel_offsets,
                                                          src.total_keys, se.rows, s));
      DS41_RETURN_IF_ERROR(cuda::run_build_sparse_index(win_offsets_, win_index_, ws_.sel, n, K, se.comp_base,
                                                        ws_.kv_offsets, ws_.kv_index, s, row_seq_,
                                                        src.key_row_begin, src.total_keys));
    } else {
      // Decode-shaped calls: the selections' rows and the entry lists in one launch.
      DS41_RETURN_IF_ERROR(cuda::run_selected_entries(se, ws_.sel_offsets, s));
    }
    entries_listed();
    return ok_status();
  };

  // DS41_QKV_DUAL (default on; qkv_dual_on): wq_a and wkv of a decode step in one launch on the main stream
  // before the fork (try_linear_dual: both read x; each output the bits of its own launch), so the side
  // chain starts at the window step; one launch fewer per layer. Otherwise (or =0) wkv opens the side chain.
  bool dual = false;
  if (qkv_dual_on()) DS41_RETURN_IF_ERROR(try_linear_dual(w.wq_a, w.wkv, x, n, ws_.q_r, ws_.kvf, &dual));
  // Two chains that share no buffer until the indexer scores keys: the window KV and the compressor
  // (ws_.kvf, the rings, the compressor buffers and pages) on the side stream, the query path with
  // the indexer's queries (ws_.q_r, ws_.q, ws_.qi, ws_.wt) on the main one (gpu_forward.h "Side
  // stream"; without it: the query path, then the window KV, as the reference).
  DS41_RETURN_IF_ERROR(concurrently(
      [&]() -> Status {
        // 3.4.3 window KV: RMSNorm(wkv x), rotate, Q_win. This call's rows are kvf rows [0, n).
        cudaStream_t s = stream_;
        float* kv = ws_.kvf;
        if (!dual) DS41_RETURN_IF_ERROR(linear(w.wkv, x, n, kv));
        // Earlier calls' window rows (kvf rows [n, n + ring_rows_)), decoded before this call's rows take
        // their ring slots; then in one launch the norm, the rotation, the ring update (packed from the
        // unquantized rows, as the reference's kvp) and Q_win in place.
        // A layer that neither writes nor scores keys (Reuse) decodes its selected entries in the same launch
        // (gx_step_kernels.h run_window_kv_step: one launch for the three where the plan found the ring
        // slots read and written disjoint, ring_disjoint_; the same bits either way).
        uint8_t* ring = slots_->ring_layer_base(l);
        cuda::WindowKvStepArgs wk;
        wk.rows = cuda::window_kv_rows(n, hd, kv, w.kv_norm.ptr, eps, pos_, inv.ptr, inv.size, ring, ring_write_, true);
        wk.ring_read = ring_read_;
        wk.ring_rows = ring_rows_;
        wk.ring_out = ws_.kvf + n * hd;
        wk.slots_disjoint = ring_disjoint_;
        const bool with_entries = p.ratio != 0 && !p.kv_source && !p.index_source && selected_args();
        if (with_entries) wk.entries = &se;
        DS41_RETURN_IF_ERROR(cuda::run_window_kv_step(wk, ws_.sel_offsets, s));
        if (with_entries) {
          entries_listed();
          return ok_status();
        }
        if (p.kv_source) DS41_RETURN_IF_ERROR(compress(l, x).with_context("compressor"));
        // An index source's head weights and key offsets read x and the plan only: with DS41_INDEX_SIDE=1
        // here, beside the query path (measured slower: index_side_on).
        if (p.index_source) return index_side_on() ? index_side(l, x).with_context("indexer") : ok_status();
        return entries();
      },
      [&]() -> Status {
        // 3.4.2 query: q_r = RMSNorm(wq_a x), q = wq_b q_r, rotated per head (no per-head norm).
        cudaStream_t s = stream_;
        if (!dual) DS41_RETURN_IF_ERROR(linear(w.wq_a, x, n, ws_.q_r));
        if (!p.index_source)  // q_r has no other reader: the norm inside wq_b's staging (with the site's map)
          return linear_normed(w.wq_b, ws_.q_r, n, ws_.q, w.q_norm.ptr, map);  // q rotated in attention_output
        // q_r feeds wq_b and the indexer's queries: with DS41_INDEX_NORM_STAGED=1, where wq_b's GEMV normalizes
        // it in its staging (decode steps), q_r stays raw for idx_wq_b's to do the same (one norm launch
        // fewer on the chain); by default normalized in place first (index_norm_staged_on).
        bool normed = false;
        bool qi_done = false;
        // DS41_QB_DUAL_NORMED: both projections and the norm in one launch; q_r stays raw (no other reader).
        if (qkv_dual_on() && qb_dual_normed_on() && !index_norm_staged_on())
          DS41_RETURN_IF_ERROR(try_linear_dual(w.wq_b, w.idx_wq_b, ws_.q_r, n, ws_.q, ws_.qi, &qi_done, w.q_norm.ptr));
        if (qi_done) {
          DS41_RETURN_IF_ERROR(index_queries(l, ws_.q_r, nullptr, true).with_context("indexer"));
          return index_side_on() ? ok_status() : index_weights(l, x).with_context("indexer");
        }
        if (index_norm_staged_on())
          DS41_RETURN_IF_ERROR(try_linear_normed(w.wq_b, ws_.q_r, n, ws_.q, w.q_norm.ptr, &normed));
        // With DS41_QKV_DUAL (default) wq_b and idx_wq_b (both over the normalized q_r) in one launch too.
        if (!normed) {
          DS41_RETURN_IF_ERROR(cuda::run_rms_norm(ws_.q_r, n, qr, w.q_norm.ptr, eps, ws_.q_r, s));
          if (qkv_dual_on()) DS41_RETURN_IF_ERROR(try_linear_dual(w.wq_b, w.idx_wq_b, ws_.q_r, n, ws_.q, ws_.qi, &qi_done));
          if (!qi_done) DS41_RETURN_IF_ERROR(linear(w.wq_b, ws_.q_r, n, ws_.q));  // rotated in attention_output
        }
        DS41_RETURN_IF_ERROR(
            index_queries(l, ws_.q_r, normed ? w.q_norm.ptr : nullptr, qi_done).with_context("indexer"));
        return index_side_on() ? ok_status() : index_weights(l, x).with_context("indexer");
      }));
  if (map != nullptr && !map->folded) DS41_RETURN_IF_ERROR(site_map(map->site));  // wq_b's launch did not carry it
  if (p.index_source) {
    DS41_RETURN_IF_ERROR(index(l, opt, out).with_context("indexer"));
    DS41_RETURN_IF_ERROR(entries());
  }
  return attention_output(w, n, kv_offsets, kv_index, max_entries, inv, y, expand);
}

Status GpuForward::attention_output(const DeviceLayer& w, int64_t n, const int64_t* kv_offsets,
                                    const int32_t* kv_index, int64_t max_entries, const DeviceVec& inv, float* y,
                                    const cuda::HcExpandEpilogue* expand) {
  const int64_t nh = c_->num_attention_heads, hd = c_->head_dim;
  cudaStream_t s = stream_;
  cuda::SparseAttentionArgs a;
  a.n = n;
  a.n_heads = nh;
  a.head_dim = hd;
  a.q = ws_.q;
  a.kv_offsets = kv_offsets;
  a.kv_index = kv_index;
  a.kv = ws_.kvf;
  a.sink = w.attn_sink.ptr;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  // Every kvf row attended here is fake-quantized (Q_win window and block rows, Q_kv compressed
  // rows: 3.9), hence exact in bf16: prefill-shaped calls may take the tensor-core kernel. Not in a
  // verification forward, whose rows keep the float kernels' bits (as its linears do).
  a.entries_on_bf16_grid = !journal_;
  a.row_invariant = row_invariant_;  // decode steps and verifications: a row's bits, whatever the batch
  a.out = ws_.o;
  a.max_entries_per_row = max_entries;
  a.workspace = ws_.scratch;
  a.workspace_bytes = ws_.scratch_bytes;
  a.counters = ws_.counters;  // the split combine in the split kernel's tail (main stream, as hc_site's)
  a.counters_size = ws_.counters_size;
  // Rotate the query (3.4.2; inside the decode kernel's load of q), undo the rotation on the output
  // (7.9; inside the decode combine), then the grouped output projection (3.4.8).
  a.rope_pos = pos_;
  a.rope_inv_freq = inv.ptr;
  a.rope_n_freq = inv.size;
  a.rotate_q = true;
  DS41_RETURN_IF_ERROR(cuda::run_sparse_attention(a, s));
  DS41_RETURN_IF_ERROR(grouped_linear(w.wo_a, c_->o_groups, ws_.o, n, ws_.z));
  if (expand == nullptr) return linear(w.wo_b, ws_.z, n, y);
  DS41_RETURN_IF_ERROR(join_pending());  // the site's map (post / comb), if it ran on the side stream
  return linear_expand(w.wo_b, ws_.z, n, y, *expand);
}

// 3.4.4: compressed entries of a KV source: the emit schedule (groups of `ratio` positions, rows
// from this call or the pending group) comes from the plan; a trailing partial group's rows go to
// the pending buffers after the groups that completed were gathered.
Status GpuForward::compress(int64_t l, const float* x) {
  const DeviceLayer& w = m_->weights().layers[l];
  const PlanSource& src = sources_[source_of_layer_[l]];
  const int64_t n = n_, hd = c_->head_dim, dI = c_->index_head_dim, R = src.ratio, m = src.groups;
  const float eps = static_cast<float>(c_->rms_norm_eps);
  cudaStream_t s = stream_;
  carry_.keys_of_source = -1;  // this source's keys change
  if (R > 1 && compress_pair()) {
    if (!w.c_wgate.present()) return internal_error("ratio > 1 compressor without wgate");
    // a and b over the same x: one launch where the GEMV takes the pair (decode steps), two otherwise.
    // In a decode step this is the side stream's chain, the longer one in a ratio-2 KV source (H100,
    // session of 2026-12-06 08:47 UTC: full/r2+Engram layer 361-365 us against 372-376 as two launches).
    DS41_RETURN_IF_ERROR(linear_pair(w.c_wkv, w.c_wgate, x, n, ws_.ca, ws_.cb));
  } else {
    DS41_RETURN_IF_ERROR(linear(w.c_wkv, x, n, ws_.ca));
    if (R > 1) {
      if (!w.c_wgate.present()) return internal_error("ratio > 1 compressor without wgate");
      DS41_RETURN_IF_ERROR(linear(w.c_wgate, x, n, ws_.cb));
    }
  }
  if (m > 0) {
    if (R == 1) {
      DS41_RETURN_IF_ERROR(cuda::run_gather_row_ptrs(src.ga_ptrs, m, hd, ws_.zs, s));
    } else {
      DS41_RETURN_IF_ERROR(cuda::run_gather_row_ptrs(src.ga_ptrs, m * R, hd, ws_.ga, s));
      DS41_RETURN_IF_ERROR(cuda::run_gather_row_ptrs(src.gb_ptrs, m * R, hd, ws_.gb, s));
      DS41_RETURN_IF_ERROR(cuda::run_softmax_pool(ws_.ga, ws_.gb, m, R, hd, ws_.zs, s));
    }
    // u = RMSNorm(z); entry = Q_kv(rotate(u, first position)); key = Q_idx(rotate(RMSNorm(wk u))).
    // One launch each for the entry (norm, u kept, rotation, packing) and the key.
    const DeviceVec& inv = m_->rope_inv_freq(true);
    cuda::RowsNormRopeQuantArgs a;
    a.rows = m;
    a.dim = hd;
    a.in = ws_.zs;
    a.out = ws_.e;
    a.norm = true;
    a.norm_weight = w.c_norm.ptr;
    a.eps = eps;
    a.normed = ws_.u;
    a.pos = src.kpos;
    a.inv_freq = inv.ptr;
    a.n_freq = inv.size;
    a.quant = true;
    a.op = FakeQuantOp::kKv;
    a.base = pool_->base();
    a.offsets = src.kv_enc;
    DS41_RETURN_IF_ERROR(cuda::run_rows_norm_rope_quant(a, s));
    DS41_RETURN_IF_ERROR(linear(w.idx_wk, ws_.u, m, ws_.kk));
    a.dim = dI;
    a.in = ws_.kk;
    a.out = ws_.kk;
    a.norm_weight = w.idx_k_norm.ptr;
    a.normed = nullptr;
    a.op = FakeQuantOp::kIdx;
    a.offsets = src.key_enc;
    DS41_RETURN_IF_ERROR(cuda::run_rows_norm_rope_quant(a, s));
  }
  if (journal_ && R > 1) {  // MODEL_SPEC 3.10.8: every row's (a, b) for a speculative rollback
    float* ja = ds_.jca + src.pend_j * ds_.jrows * hd;
    float* jb = ds_.jcb + src.pend_j * ds_.jrows * hd;
    const size_t bytes = static_cast<size_t>(n * hd) * sizeof(float);
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cuda::copy_async(ja, ws_.ca, bytes, cudaMemcpyDeviceToDevice, s),
                                           "journal the compressor rows"));
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cuda::copy_async(jb, ws_.cb, bytes, cudaMemcpyDeviceToDevice, s),
                                           "journal the compressor rows"));
  }
  if (src.pend_a) {
    DS41_RETURN_IF_ERROR(cuda::run_scatter_rows(ws_.ca, src.pend_a, n, hd, slots_->pending_base(), s));
    DS41_RETURN_IF_ERROR(cuda::run_scatter_rows(ws_.cb, src.pend_b, n, hd, slots_->pending_base(), s));
  }
  return ok_status();
}

// 3.4.6 the indexer's queries: Q_idx(rotate(idx_wq_b q_r)) per head into ws_.qi (the query path's q_r
// only; the head weights are index_side's). q_norm set: q_r is raw, RMSNorm(q_r; q_norm) is the input
// (normalized in idx_wq_b's staging, or in place first where the GEMV does not take the call).
Status GpuForward::index_queries(int64_t l, float* q_r, const float* q_norm, bool qi_done) {
  const DeviceLayer& w = m_->weights().layers[l];
  const int64_t n = n_, nih = c_->index_n_heads, dI = c_->index_head_dim;
  const DeviceVec& inv = m_->rope_inv_freq(true);
  cudaStream_t s = stream_;
  bool normed = false;
  if (q_norm != nullptr) DS41_RETURN_IF_ERROR(try_linear_normed(w.idx_wq_b, q_r, n, ws_.qi, q_norm, &normed));
  if (q_norm != nullptr && !normed)
    DS41_RETURN_IF_ERROR(
        cuda::run_rms_norm(q_r, n, c_->q_lora_rank, q_norm, static_cast<float>(c_->rms_norm_eps), q_r, s));
  if (!normed && !qi_done) DS41_RETURN_IF_ERROR(linear(w.idx_wq_b, q_r, n, ws_.qi));
  {  // rotate every head, Q_idx in place: one launch
    cuda::RowsNormRopeQuantArgs a;
    a.rows = n * nih;
    a.dim = dI;
    a.in = ws_.qi;
    a.out = ws_.qi;
    a.pos = pos_;
    a.rows_per_pos = nih;
    a.inv_freq = inv.ptr;
    a.n_freq = inv.size;
    a.quant = true;
    a.op = FakeQuantOp::kIdx;
    a.quant_inplace = true;
    DS41_RETURN_IF_ERROR(cuda::run_rows_norm_rope_quant(a, s));
  }
  return ok_status();
}

// The head weights (3.4.6: idx_weights_proj x / sqrt(index heads)) and, for a source whose keys this step
// has not yet listed, the byte offsets of its Q_idx rows (and, for float-key calls, their decode), in
// the order the reference needs them: after this layer's compressor wrote its new keys (the side
// stream's chain; index() runs after the join).
Status GpuForward::index_side(int64_t l, const float* x) {
  DS41_RETURN_IF_ERROR(index_weights(l, x));
  return index_keys(l);
}

// The weights' factor 1 / sqrt(index heads) (3.4.6) is applied by the packed indexer as it reads them (the same
// float product: IndexerDeviceArgs::w_scale), else by run_scale here: one launch fewer per index layer of a
// decode-shaped step.
float GpuForward::index_weight_scale() const {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(c_->index_n_heads)));
}

Status GpuForward::index_weights(int64_t l, const float* x) {
  const DeviceLayer& w = m_->weights().layers[l];
  const int64_t n = n_, nih = c_->index_n_heads;
  DS41_RETURN_IF_ERROR(linear(w.idx_weights_proj, x, n, ws_.wt));
  if (index_packed()) return ok_status();
  return cuda::run_scale(ws_.wt, n * nih, index_weight_scale(), stream_);
}

// DS41_INDEX_SIDE=1: an index source's head weights and key offsets on the side stream (index_side);
// DS41_INDEX_NORM_STAGED=1: its q_r normalized in both GEMVs' staging (try_linear_normed). Both on together
// were measured slower, so both are opt-in (H100, same machine, alternating, session of 2026-12-07 00:38
// UTC: batch-1 layers 2,106 / 2,108 us with both against 2,080 / 2,079 without, the three index layers 8-13
// us longer each); each alone is not yet timed. Off: the weights and the keys on the main stream after the
// queries, q_r normalized in place. The same bits either way.
bool GpuForward::index_side_on() {
  static const bool on = cuda::switch_opt_in("DS41_INDEX_SIDE");
  return on;
}
// DS41_INDEX_PAGED (on by default since the session of 2026-12-07 12:01 UTC; =0 off): a decode step's packed
// indexer computes its keys' offsets from the KV owner's pages (IndexerDeviceArgs::key_pages / row_seq), so
// index_keys launches nothing: one launch fewer per index source. The same bytes read, the same scores
// (AttentionParity.IndexerScoresPackedKeys*, paged rows, on an H100). Timed on an H100 with DS41_QB_DUAL_NORMED,
// alternating in one call: batch-1 layers 2,071 / 2,089 / 2,078 us against 2,084 / 2,082 / 2,056 (neutral), 168
// kernels per step against 173.
bool GpuForward::index_paged_on() {
  static const bool on = cuda::switch_on("DS41_INDEX_PAGED");
  return on;
}
bool GpuForward::index_norm_staged_on() {
  static const bool on = cuda::switch_opt_in("DS41_INDEX_NORM_STAGED");
  return on;
}
// DS41_QKV_DUAL (on by default; =0 two launches each): wq_a with wkv, and an index source's wq_b with
// idx_wq_b, in one launch each (H100, alternating in one call, session of 2026-12-07 07:09 UTC: batch-1
// layers 2,190-2,210 us against 2,233-2,281, batch 8 6,677-6,713 against 6,781-6,794; 11 launches fewer
// per step). The same bits either way (LinearParity.LinearDual*).
bool GpuForward::qkv_dual_on() {
  static const bool on = cuda::switch_on("DS41_QKV_DUAL");
  return on;
}
// DS41_QB_DUAL_NORMED (on by default since the session of 2026-12-07 12:01 UTC; =0 off): an index source's
// wq_b and idx_wq_b in one launch with q_r's norm in the staging they share (try_linear_dual_normed), so the
// norm's own launch leaves the chain. The same bits (LinearParity.LinearDualNormed*, the released wq_b | idx_wq_b
// on an H100). Timed with DS41_INDEX_PAGED (above): neutral in time, one launch fewer per index source.
bool GpuForward::qb_dual_normed_on() {
  static const bool on = cuda::switch_on("DS41_QB_DUAL_NORMED");
  return on;
}

// The index keys of layer l's KV owner for this step (the offsets of its packed Q_idx rows; float keys
// decoded from them where the indexer does not read the packed rows), once per source and step
// (carry_.keys_of_source).
Status GpuForward::index_keys(int64_t l) {
  const model::LayerPlan& p = m_->schedule().layers[l];
  const int64_t dI = c_->index_head_dim;
  const PlanIndex& pi = index_[l];
  const int64_t j = source_of_layer_[p.kv_owner];
  const PlanSource& src = sources_[j];
  if (pi.ts == 0 || carry_.keys_of_source == j) return ok_status();
  if (index_packed() && index_paged_on()) return ok_status();  // the indexer reads the pages itself
  cudaStream_t s = stream_;
  const int64_t n_seqs = static_cast<int64_t>(seqs_.size());
  DS41_RETURN_IF_ERROR(cuda::run_paged_row_offsets(source_rows(src, /*keys=*/true), src.key_row_begin, n_seqs,
                                                   src.decode_keys, ws_.key_offsets, s));
  if (!index_packed())
    DS41_RETURN_IF_ERROR(cuda::run_decode_rows_gather(FakeQuantOp::kIdx, dI, pool_->base(), ws_.key_offsets,
                                                      src.decode_keys, ws_.keys, s));
  carry_.keys_of_source = j;
  return ok_status();
}

// A KV source's rows in the pool: its Q_kv entries, or (keys) its Q_idx keys (MODEL_SPEC 5.2).
cuda::PagedRowsArgs GpuForward::source_rows(const PlanSource& src, bool keys) const {
  const KvPageGeometry& g = pool_->geometry();
  cuda::PagedRowsArgs pa;
  pa.pages = src.pages;
  pa.seq_page_begin = src.seq_page_begin;
  pa.entries_per_page = g.entries_per_page;
  pa.page_bytes = g.page_bytes();
  pa.offset_in_page = keys ? g.key_offset_in_page() : g.kv_offset_in_page();
  pa.row_bytes = keys ? g.key_row_bytes : g.kv_row_bytes;
  return pa;
}

// Whether this call's indexer scores the packed Q_idx rows (the step's shape only: the same for every
// index layer of the step).
bool GpuForward::index_packed() const {
  cuda::IndexerDeviceArgs ia;
  ia.n = n_;
  ia.n_heads = c_->index_n_heads;
  ia.head_dim = c_->index_head_dim;
  return cuda::indexer_scores_packed_supported(ia);
}

// 3.4.6: scores of the queries (index_queries) over the visible keys of the KV owner (decoded once
// per owner and step), the candidate pool (candidate source) or its restriction (later index
// sources), top-k into ws_.sel (read by this layer and the following ones up to the next index
// source).
Status GpuForward::index(int64_t l, const GpuForwardOptions& opt, std::vector<model::SequenceOutput>* out) {
  const model::LayerPlan& p = m_->schedule().layers[l];
  const int64_t n = n_, nih = c_->index_n_heads, dI = c_->index_head_dim, K = c_->index_topk;
  const PlanIndex& pi = index_[l];
  const int64_t j = source_of_layer_[p.kv_owner];
  cudaStream_t s = stream_;
  const bool none = pi.ts == 0 || (p.candidate_restricted && !p.candidate_source && carry_.cand_stride == 0);
  if (p.candidate_source) {
    carry_.cand_stride = pi.ts;
    carry_.cand_t_mask = pi.t_mask;
  }
  if (none) {  // no visible key anywhere: every selection is padding
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cuda::fill_async(ws_.sel, 0xff, static_cast<size_t>(n * K) * sizeof(int32_t), s), "clear selection"));
  } else {
    cuda::IndexerDeviceArgs ia;
    ia.n = n;
    ia.n_heads = nih;
    ia.head_dim = dI;
    ia.t_stride = pi.ts;
    ia.q = ws_.qi;
    ia.w = ws_.wt;
    ia.key_begin = pi.key_begin;
    ia.visible = pi.visible;
    ia.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dI)));
    ia.out = ws_.scores;
    // Decode-shaped calls score the packed Q_idx rows in the pool directly (the same bits); the others
    // (prefill chunks: the tensor cores) read float keys decoded once per source and step. The choice
    // depends on the step's shape only, so it is the same for every index layer of the step.
    const bool packed = index_packed();
    DS41_RETURN_IF_ERROR(index_keys(l));  // listed on the side stream already, unless this call had none
    if (packed) {
      ia.key_base = pool_->base();
      if (index_paged_on()) {  // the keys' offsets from the owner's pages, in the kernel
        ia.key_pages = source_rows(sources_[j], /*keys=*/true);
        ia.row_seq = row_seq_;
      } else {
        ia.key_offsets = ws_.key_offsets;
      }
      ia.w_scale = index_weight_scale();  // index_weights left ws_.wt unscaled
    } else {
      ia.keys = ws_.keys;
    }
    DS41_RETURN_IF_ERROR(cuda::run_indexer_scores(ia, s));
    if (p.candidate_source) {
      DS41_RETURN_IF_ERROR(cuda::run_candidate_pool(ws_.scores, pi.visible, n, pi.ts,
                                                    c_->candidate_block_size, c_->candidate_topk_blocks,
                                                    ws_.cand, ws_.scratch, s));
    } else if (p.candidate_restricted) {
      DS41_RETURN_IF_ERROR(
          cuda::run_mask_restrict(ws_.scores, n, pi.ts, ws_.cand, carry_.cand_stride, carry_.cand_t_mask, s));
    }
    DS41_RETURN_IF_ERROR(cuda::run_topk_rows(ws_.scores, n, pi.ts, K, ws_.sel, ws_.scratch, s));
  }
  if (!opt.record) return ok_status();
  // Tests: the selections as the reference records them (a host round trip per layer).
  std::vector<int32_t> sel(n * K);
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cuda::copy_async(sel.data(), ws_.sel, sel.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, s),
      "copy selections"));
  std::vector<uint8_t> mask;
  if (p.candidate_source && pi.ts > 0) {
    mask.resize(n * pi.ts);
    DS41_RETURN_IF_ERROR(
        cuda::cuda_status(cuda::copy_async(mask.data(), ws_.cand, mask.size(), cudaMemcpyDeviceToHost, s),
                          "copy candidate mask"));
  }
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamSynchronize(s), "record selections"));
  const int64_t B = c_->candidate_block_size, nb = c_->candidate_topk_blocks;
  for (size_t si = 0; si < seqs_.size(); ++si) {
    const PlanSeq& q = seqs_[si];
    model::ForwardRecord& rec = (*out)[si].record;
    rec.topk[l].assign(sel.begin() + q.begin * K, sel.begin() + q.end * K);
    if (!p.candidate_source) continue;
    const int64_t T = q.next_sources[j].count, rows = q.end - q.begin;
    auto& cb = rec.cand_blocks[l];
    cb.assign(rows * nb, -1);
    for (int64_t r = 0; r < rows && !mask.empty(); ++r) {
      int64_t jj = 0;
      for (int64_t b0 = 0; b0 * B < T && jj < nb; ++b0)
        if (mask[(q.begin + r) * pi.ts + b0 * B]) cb[r * nb + jj++] = static_cast<int32_t>(b0);
    }
  }
  return ok_status();
}

}  // namespace ds41::gpu
