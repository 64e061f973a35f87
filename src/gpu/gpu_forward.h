// ds41 gpu: GpuForward — one forward step of the V4.1 text model on the device over a batch that
// mixes prefill chunks and decode tokens of many sequences; the GPU twin of model::ForwardPass.
// Exactly the CPU reference's math (src/model/*.cpp), op for op through the backends/cuda
// launchers; the layer files mirror the reference's one to one (docs/gpu_engine.md says why):
//   gpu_forward.cpp         ~ forward_pass.cpp    rows, embeddings, layer loop with the mHC lag, head
//   gpu_step_plan.cpp       ~ (host loops of the reference) the step plan built from positions alone
//   gpu_attention_layer.cpp ~ attention_layer.cpp window KV, compressor, indexer, sparse attention
//   gpu_moe_layer.cpp       ~ moe_layer.cpp       router, bucketing, grouped experts, shared expert
//   gpu_engram_layer.cpp    ~ engram_layer.cpp    table gather, projection, gated update
//
// A step: validate (nothing moves on error) -> plan on the host from positions (rows, window
// entry lists, compressor emit schedule, pages allocated for new entries, page tables, index
// visibility, Engram hash ids) written into a pinned arena -> ONE upload -> every layer's kernels
// on one stream, no host round trip (unless options.record) -> logits rows copied back -> commit
// of the host mirrors (positions, counts, pending flags, Engram look-back). No allocation: all
// buffers come from GpuWorkspace. Image spans (MODEL_SPEC 3.11) as the reference: the span rows
// replace the embeddings of the flagged rows, flagged rows select experts with gate.bias_vl
// (3.5) and are DEAD for Engram (3.2.3-3.2.4: no update, n-grams do not cross them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backends/cuda/fused_moe_kernels.h"
#include "backends/cuda/gx_step_kernels.h"
#include "backends/cuda/linear_epilogue.h"
#include "core/status.h"
#include "gpu/device_model.h"
#include "gpu/gpu_workspace.h"
#include "gpu/kv_block_pool.h"
#include "gpu/sequence_slots.h"
#include "gpu/step_graphs.h"
#include "gpu/tensor_core_linear.h"
#include "model/dspark.h"
#include "model/model.h"

namespace ds41::gpu {

struct GpuSeqInput {
  GpuSequence* seq = nullptr;
  std::span<const int32_t> tokens;
  model::LogitsRows logits = model::LogitsRows::kLast;
  // Image spans, as model::SequenceInput (MODEL_SPEC 3.11): one flag per token (router bias_vl,
  // Engram DEAD), and the rows replacing the flagged tokens' embeddings (empty: they keep theirs).
  std::span<const uint8_t> image_span = {};
  std::span<const float> span_embeds = {};
};

// Speculative verification (MODEL_SPEC 3.10.8; gpu_spec_rollback.cpp): a forward run with a journal
// records, before its kernels run, the host mirror of every sequence and on the device the window
// ring rows and pending-group rows its writes will overwrite, and during the call the compressor
// rows (a, b) of every ratio > 1 source; rollback_spec() then restores the state of each sequence to
// that after its first `keep` rows. A journaled call holds at most dspark_block_size + 1 rows per
// sequence.
struct GpuSpecJournal {
  struct Seq {
    GpuSequence* seq = nullptr;
    GpuSequence before;  // the host mirror before the call
    int64_t row_begin = 0, rows = 0;
    // (pending row index from SequenceSlots::pending_base(), row in the journal's save buffer)
    std::vector<std::pair<int64_t, int64_t>> pend_saved;
  };
  std::vector<Seq> seqs;
};

// The DSpark draft for one anchor (MODEL_SPEC 3.10.4): the sequence's draft rings must end at its
// position L (draft_next == position), the anchor is x_L.
struct GpuDraftInput {
  GpuSequence* seq = nullptr;
  int32_t anchor = 0;
};
struct GpuDraftOptions {
  // Chooses c_k from z_k on the host (sampling); empty: greedy argmax, lowest index on ties.
  std::function<int32_t(int64_t seq, int64_t k, std::span<const float> z)> choose;
  bool record = false;  // DraftOutput::base_logits, hidden, block_kv, router_experts (golden checks)
};
// Context rows to commit (MODEL_SPEC 3.10.2-3.10.3): rows [row_begin, row_begin + n) of the last
// forward's captured features, positions first_pos.. of seq (committed positions only).
struct GpuContextRows {
  GpuSequence* seq = nullptr;
  int64_t row_begin = 0, first_pos = 0, n = 0;
};

struct GpuForwardOptions {
  // Copy selections and routing to the host after each layer (tests; a host round trip per
  // layer): SequenceOutput::record's topk, cand_blocks, router_experts, router_weights, hash_ids.
  bool record = false;
  // Benchmarks: milliseconds of each layer (and the head, last), from CUDA events recorded between
  // layers on the stream (no extra synchronisation; read after the step's final one).
  std::vector<float>* layer_ms = nullptr;
  // Benchmarks: kernels launched by each layer (and the head, last), counted by cuda::launch() on
  // the calling thread (every kernel of the step; cuBLAS's are not counted: none in a decode step).
  std::vector<int64_t>* layer_launches = nullptr;
  // Run layers 0..last_layer only, and no head (-1: every layer): the first pass of MODEL_SPEC 4.4
  // decoder replay (cuda_engine.h), over the prompt rows the layers after the cut do not need.
  // Refused unless every input asks for no logits and no KV source lies after last_layer (its
  // entries and pending group would fall behind the committed position). The commit is the usual
  // one (positions, counts, pages, pending flags, Engram look-back over every row): the skipped
  // layers hold no per-position state except their window rows, which this step does not write —
  // the caller floors those layers' windows above these positions (GpuSequence::window_floor)
  // before they run again.
  int64_t last_layer = -1;
  // Speculative verification: fills the journal (see GpuSpecJournal); rollback_spec() uses it.
  GpuSpecJournal* journal = nullptr;
  // Greedy consumers: the logits rows are reduced on the device to their argmax (the largest
  // value, the lowest index on ties: engine::argmax_token) and only those tokens cross to the host,
  // one per logits row in row order; SequenceOutput::logits stays empty (positions are filled).
  std::vector<int32_t>* argmax = nullptr;
  // With argmax: engine::Sampler's greedy draw instead (CudaEngine::step for StepItem::greedy_only):
  // a row holding NaN or +inf, or every logit -inf, gives cuda::kArgmaxInvalidRow.
  bool argmax_checked = false;
  // Consumers with their own logits buffer (CudaEngine::step, bench decode): each sequence's logits
  // rows are handed over straight from the pinned arena, `logits_to(s, rows, n)` for sequence s of
  // the batch (n rows of vocab floats, valid during the call), and SequenceOutput::logits stays
  // empty. Fresh per-sequence vectors cost a page fault per 4 KB on every step: 33 MB of logits at
  // batch 64 took ~36 ms of host time per step on the H200 host (docs/perf/README.md).
  std::function<void(size_t s, const float* rows, int64_t n)> logits_to;
};

// Prefill chunks decode each compressed entry of the attention's KV owner once into a table when
// their n x K selections outnumber the entries (gpu_attention_layer.cpp); the attention's bits are
// the same either way. Tests: 1 on, 0 per selection, -1 the default (on; DS41_KV_TABLE=0 turns it off).
void set_kv_entry_table_for_tests(int on);

class GpuForward {
 public:
  // The model, pools and slots must outlive the forward; `stream` runs every kernel.
  static Result<std::unique_ptr<GpuForward>> create(const DeviceModel& m, const GpuLimits& limits,
                                                    KvBlockPool* pool, SequenceSlots* slots,
                                                    cudaStream_t stream);
  ~GpuForward();

  const GpuLimits& limits() const { return lim_; }
  // Decode steps replayed from captured graphs (null when GpuLimits::decode_graphs is 0).
  const StepGraphs* step_graphs() const { return graphs_.get(); }
  // The segments of a decode step replayed from graphs (enqueue(); the rest launch directly), for a
  // model of `layers` layers.
  static int64_t graphed_segments_per_step(int64_t layers);
  // Host time of the last run() (microseconds): the plan (validation, step plan, journal), the
  // enqueue (metadata upload, dry passes, graph launches, direct launches), the wait for the device
  // (cudaStreamSynchronize) and the outputs (logits rows, commit). Everything but `wait` is work of
  // the calling thread (benchmarks: the host's share of a decode step).
  // device_us (with set_device_span): the device's time from the step's first work to its last
  // (events around the enqueue; 0 otherwise): the wall time less device_us is the host's exposed part.
  struct HostTimes {
    double plan_us = 0, enqueue_us = 0, wait_us = 0, outputs_us = 0, device_us = 0;
  };
  const HostTimes& last_host_times() const { return host_times_; }
  // Benchmarks: time each step's device span (two events per step) into HostTimes::device_us.
  void set_device_span(bool on) { device_span_ = on; }
  size_t workspace_bytes() const { return ws_.device_bytes; }

  // One exact forward over the batch (distinct sequences, >= 1 token each). out gets one
  // SequenceOutput per input (positions + logits rows as requested, record when asked). Errors
  // from validation and planning leave every sequence unchanged.
  Status run(std::span<const GpuSeqInput> batch, const GpuForwardOptions& opt,
             std::vector<model::SequenceOutput>* out);

  // ---- DSpark (MODEL_SPEC 3.10; gpu_dspark.cpp, gpu_spec_rollback.cpp) ----
  // Allocates the draft rings (one per stage and slot), the feature buffer and the draft's and the
  // journal's buffers; from then on every forward captures the context features (the streams
  // entering each dspark_target_layer_ids layer after its Engram, averaged over the C streams).
  // FailedPrecondition without draft stages.
  Status enable_dspark();
  bool dspark_enabled() const { return ds_.on; }
  // Writes the stages' window rows of the given rows of the LAST forward's features (only the last
  // `window` rows of each item are computed) and advances the sequences' draft_next. An item whose
  // first_pos is not its draft_next restarts the rings there (a state restored without draft rows).
  Status dspark_commit(std::span<const GpuContextRows> rows);
  // One draft step per input, all blocks batched through the stages; DraftOutput's candidates,
  // confidence_logits, confidence (and with record base_logits, hidden, block_kv, router_experts).
  Status draft(std::span<const GpuDraftInput> batch, const GpuDraftOptions& opt,
               std::vector<model::DraftOutput>* out);
  // MODEL_SPEC 3.10.8: keep[i] (1 .. rows) rows of journal sequence i stay, tokens[i] its call's
  // tokens; every state the rejected rows wrote is restored (rings, pending groups, entry counts,
  // pages, Engram look-back, the most recent publisher, the position). Synchronises.
  Status rollback_spec(const GpuSpecJournal& j, std::span<const int64_t> keep,
                       std::span<const std::span<const int32_t>> tokens);
  // Copies slot src's draft rings to slot dst (fork), on the stream.
  Status copy_draft_rings(int32_t src, int32_t dst);
  // Draft ring rows to the host (tests): stage s, positions [first, first + n) of seq, packed.
  Status download_draft_rows(const GpuSequence& seq, int64_t s, int64_t first, int64_t n,
                             std::vector<uint8_t>* out);
  // The last forward's captured features to the host (tests): rows [row_begin, row_begin + n).
  Status download_features(int64_t row_begin, int64_t n, std::vector<float>* out);
  // The main_x rows (MODEL_SPEC 3.10.2, [rows, hidden]) the LAST dspark_commit computed, to the host
  // (tests, `ds41 score`): in commit order — per item of that commit (items with n > 0, in order)
  // its last min(n, window) rows. OutOfRange when n exceeds the rows of that commit.
  Status download_main_x(int64_t n, std::vector<float>* out);

 private:
  struct PlanSeq {
    GpuSequence* seq = nullptr;
    int64_t begin = 0, end = 0, start_pos = 0;
    model::LogitsRows logits = model::LogitsRows::kLast;
    std::vector<GpuSourceMirror> next_sources;  // the mirrors after this step
    engram::EngramHashState next_engram;
  };
  struct PlanSource {  // one per KvLayout source
    int64_t layer = 0, ratio = 1, pend_j = -1;
    int64_t groups = 0;                     // entries emitted this step
    const float* const* ga_ptrs = nullptr;  // [groups * ratio] rows of a (this call or pending)
    const float* const* gb_ptrs = nullptr;  // [groups * ratio] rows of b (ratio > 1)
    const int64_t* kpos = nullptr;          // [groups] first position of each group
    const int64_t* kv_enc = nullptr;        // [groups] byte offsets of the new Q_kv rows
    const int64_t* key_enc = nullptr;       // [groups] byte offsets of the new Q_idx rows
    const int64_t* pend_a = nullptr;        // [n] pending row of a (-1: none); null: no row
    const int64_t* pend_b = nullptr;
    const int32_t* pages = nullptr;           // the batch's page tables, concatenated
    const int64_t* seq_page_begin = nullptr;  // [seqs]
    const int64_t* key_row_begin = nullptr;   // [seqs + 1] rows of the decoded keys per sequence
    int64_t total_keys = 0, max_keys = 0;     // entries after this step: sum and max over sequences
    int64_t decode_keys = 0;                  // rows of decoded keys: total_keys, padded in decode steps
  };
  struct PlanIndex {                     // one per index-source layer
    const int64_t* key_begin = nullptr;  // [n]
    const int64_t* visible = nullptr;    // [n]
    const int64_t* t_mask = nullptr;     // [n] candidate source: entries its mask covers per row
    int64_t ts = 0;                      // score columns (the most visible keys, padded in decode steps)
  };

  GpuForward() = default;
  Status validate(std::span<const GpuSeqInput> batch, const GpuForwardOptions& opt) const;
  Status plan(std::span<const GpuSeqInput> batch);
  void rollback_pages();
  Status run_layer(int64_t l, const GpuForwardOptions& opt, std::vector<model::SequenceOutput>* out);
  Status head(const GpuForwardOptions& opt);
  void commit();
  // The step's device work after the plan: the metadata upload, the layers, the head and the
  // logits copy, in segments (graphed: each replayed from its own captured graph).
  Status enqueue(const GpuForwardOptions& opt, std::vector<model::SequenceOutput>* out, bool graphed);
  Status prologue();  // embeddings (image-span rows), mHC init
  Status journal_plan(const GpuForwardOptions& opt);    // host record + save lists (before the upload)
  Status journal_save();                                // device copies (after the upload)
  Status capture_dspark_features(int64_t l);
  // MODEL_SPEC 3.3: the mHC map of one site (pre / post / comb of n rows) from ws_.streams.
  Status hc_site_map(const DeviceHcSite& hw, int64_t n, float* pre, float* post, float* comb);
  // The site map, then x = RMSNorm(collapse(streams, collapse_w)) (one launch: cuda::run_hc_site).
  // collapse false: the map alone (the MoE entry kernel collapses: moe_entry).
  Status hc_site(const DeviceHcSite& hw, int64_t n, float* pre, float* post, float* comb,
                 const float* collapse_w, const float* norm_weight, float* x, bool collapse = true);
  // The site's arguments (hc_site's), with the side stream's map partials and counters where side_map.
  cuda::HcSiteArgs site_args(const DeviceHcSite& hw, int64_t n, float* pre, float* post, float* comb,
                             const float* collapse_w, const float* norm_weight, float* x, bool side_map) const;
  // The FFN site's collapse + norm into x, the gate and the routing of a one-row decode step in one
  // launch (cuda::run_moe_entry) where moe_entry_ok(); moe() then starts at the routed experts.
  bool moe_entry_ok(const DeviceLayer& w) const;
  Status moe_entry(const DeviceLayer& w, const float* collapse_w, const float* norm_weight, float* x);
  // A one-row site's collapse from ws_.streams (cuda::CollapseRow) with collapse_w and the norm, into x.
  cuda::CollapseRow collapse_row(const float* collapse_w, const float* norm_weight, float* x) const;
  // The router's arguments of the MoE of n_ rows through block w (E experts, top-k).
  cuda::MoeRouteArgs route_args(const DeviceLayer& w, int64_t E, int64_t k, const uint8_t* vl);
  // MODEL_SPEC 3.4.7-3.4.8: sparse attention of ws_.q over the ws_.kvf rows that kv_offsets /
  // kv_index list (with the layer's sink), the inverse rotation, the grouped output projection to y.
  // expand (nullable): y goes into the mHC streams (the layer's attention site: its post / comb) in
  // the output projection's launch where the decode GEMV takes it (cuda::run_linear_expand; y then not
  // written), after join_pending() (the site's map may still run on the side stream).
  Status attention_output(const DeviceLayer& w, int64_t n, const int64_t* kv_offsets, const int32_t* kv_index,
                          int64_t max_entries, const DeviceVec& inv, float* y,
                          const cuda::HcExpandEpilogue* expand = nullptr);
  Status draft_attention(int64_t s, const int64_t* ring_read, int64_t ctx_rows, const int64_t* kv_offsets,
                         const int32_t* kv_index, const float* x, float* y,
                         const cuda::HcExpandEpilogue* expand = nullptr);
  // The MoE of n_ rows into y. With expand_post / expand_comb set it also expands y into ws_.streams
  // (run_hc_expand with that post / comb), fused with the combine and the shared expert's add.
  // routed_ready: the gate and the routing ran already (moe_entry).
  // next (nullable): the next layer's attention-site collapse in the combine's launch (DS41_COMBINE_COLLAPSE;
  // sets carry_.x_collapsed, restored with the carry when a segment runs again; that layer's site then launches
  // its map alone).
  // map (nullable): the FFN site's map, not launched yet (run_layer: cuda::HcMapFold), carried by the routed pair's
  // launch with the shared units where it takes them, else launched here before the combine reads it.
  Status moe_rows(const DeviceLayer& w, int64_t E, int64_t k, const uint8_t* vl, const float* x, float* y,
                  const float* expand_post = nullptr, const float* expand_comb = nullptr, bool routed_ready = false,
                  const cuda::NextCollapse* next = nullptr, cuda::HcMapFold* map = nullptr);

  Status engram_stage(int64_t l);
  // map (nullable): the attention site's map, not launched yet (run_layer: cuda::HcMapFold), carried by wq_b's
  // launch where a layer's wq_b is a one-weight normed GEMV (no index source), else launched as hc_site would.
  Status attention(int64_t l, const float* x, float* y, const GpuForwardOptions& opt,
                   std::vector<model::SequenceOutput>* out, const cuda::HcExpandEpilogue* expand = nullptr,
                   cuda::HcMapFold* map = nullptr);
  // A site's map part alone (the arguments of site_args(..., side_map = true)): on the side stream where hc_site
  // would put it there (joined before the expand), else on the main one.
  Status site_map(const cuda::HcSiteArgs& m);
  Status compress(int64_t l, const float* x);
  // qi_done: idx_wq_b already ran into ws_.qi (with wq_b in one launch, DS41_QKV_DUAL); then only the rotation.
  Status index_queries(int64_t l, float* q_r, const float* q_norm, bool qi_done = false);
  Status index_side(int64_t l, const float* x);
  Status index_weights(int64_t l, const float* x);
  float index_weight_scale() const;
  static bool index_side_on();
  static bool index_norm_staged_on();
  static bool index_paged_on();
  static bool qkv_dual_on();
  static bool qb_dual_normed_on();
  Status index_keys(int64_t l);
  bool index_packed() const;
  cuda::PagedRowsArgs source_rows(const PlanSource& src, bool keys) const;
  Status index(int64_t l, const GpuForwardOptions& opt, std::vector<model::SequenceOutput>* out);
  Status moe(int64_t l, const float* x, float* y, const GpuForwardOptions& opt,
             std::vector<model::SequenceOutput>* out, const float* expand_post = nullptr,
             const float* expand_comb = nullptr, bool routed_ready = false, const cuda::NextCollapse* next = nullptr,
             cuda::HcMapFold* map = nullptr);

  // --numerics fp8-act (GpuLimits::numerics): the input of a linear over a weight of format f, rows x k
  // values, quantized per 32 along K into ws_.xq (cuda::run_act_quant_rows, the CPU reference's
  // quant::act_quant_fp8_rows bit for bit); x itself where the mode or the format leaves x as it is.
  // Every linear entry point below takes its input through it (the one-launch forms that normalize x in
  // their staging or carry the shared expert's units do not run in that mode).
  Result<const float*> act_input(quant::WeightFormat f, const float* x, int64_t rows, int64_t k);
  bool act_quantized(quant::WeightFormat f) const { return quant::act_quant_applies(lim_.numerics, f); }

  // The linears: tensor cores (TensorCoreLinear) for prefill-sized calls, else the GEMV / tile
  // kernels of backends/cuda/linear_kernels.h.
  Status linear(const cuda::DeviceWeight& w, const float* x, int64_t n, float* y);
  // y = RMSNorm(x; norm_weight) . W^T (the query path's q_r into wq_b): the norm inside the decode GEMV's
  // staging of x where it takes the call (cuda::run_linear_normed), else x normalized in place first (the
  // prefill GEMMs too): x holds the raw rows only until this call.
  Status linear_normed(const cuda::DeviceWeight& w, float* x, int64_t n, float* y, const float* norm_weight,
                       cuda::HcMapFold* map = nullptr);
  // linear_normed's one-launch form alone (cuda::try_linear_normed): *took false, nothing launched, x raw,
  // where the call is not a decode-sized tensor-core GEMV.
  Status try_linear_normed(const cuda::DeviceWeight& w, const float* x, int64_t n, float* y, const float* norm_weight,
                           bool* took);
  Status grouped_linear(const cuda::DeviceWeight& w, int64_t groups, const float* x, int64_t n, float* y);
  // y = x . W^T expanded into the rows' mHC streams (cuda::run_linear_expand at decode sizes: one launch,
  // y not written; prefill: the GEMM, then run_hc_expand).
  Status linear_expand(const cuda::DeviceWeight& w, const float* x, int64_t n, float* y,
                       const cuda::HcExpandEpilogue& ex);
  // Two weights over the same x (the shared expert's w1 and w3): one launch at decode sizes
  // (cuda::run_linear_pair), else as two linear() calls.
  Status linear_pair(const cuda::DeviceWeight& w, const cuda::DeviceWeight& w2, const float* x, int64_t n, float* y,
                     float* y2);
  // Two weights of one input width over the same x, each its own output width (the attention's wq_a and
  // wkv): *took true where one launch ran them at decode sizes (cuda::try_linear_dual: each output the
  // bits of its own linear()); false with nothing launched otherwise (prefill: the GEMMs; the caller runs
  // the two linears).
  // norm_weight (nullable): over x's rows normalized in the shared staging (cuda::try_linear_dual_normed; x not
  // written).
  Status try_linear_dual(const cuda::DeviceWeight& w, const cuda::DeviceWeight& w2, const float* x, int64_t n,
                         float* y, float* y2, bool* took, const float* norm_weight = nullptr);
  // routing_early: the routing (ws_.offsets) was written two or more launches back on stream_ (the
  // MoE's w2 after its pair: cuda::run_expert_linear's routing_early).
  Status expert_linear(const std::vector<DeviceExpert>& experts, cuda::DeviceWeight DeviceExpert::*which,
                       const cuda::DeviceWeight* d_w, int64_t out_dim, int64_t in_dim, const float* x,
                       int64_t m_max, float* y, bool routing_early = false, cuda::SharedUnits* shared = nullptr);
  // Two expert matrices over the same rows (w1 and w3): one launch at decode sizes
  // (cuda::run_expert_linear_pair_rows), else two expert_linear calls. The routed rows are token rows
  // x[x_rows[i]], i < m_max: the tensor-core GEMMs of prefill split them straight from x, and so does
  // the decode GEMV (its staging reads them through x_rows); the other paths gather them into
  // `gathered` [m_max, in_dim] first.
  Status expert_linear_pair(const std::vector<DeviceExpert>& experts, cuda::DeviceWeight DeviceExpert::*which,
                            cuda::DeviceWeight DeviceExpert::*which2, const cuda::DeviceWeight* d_w,
                            const cuda::DeviceWeight* d_w2, int64_t out_dim, int64_t in_dim, const float* x,
                            const int64_t* x_rows, float* gathered, int64_t m_max, float* y, float* y2);
  // The same pairs followed by their SwiGLU (cuda/linear_epilogue.h: act = row_scale * swiglu(y, y2)):
  // at decode sizes one launch (the tensor-core GEMV's SwiGLU epilogue; y / y2 not written), else the
  // pair and run_swiglu. Every decode-sized call of a pair goes through the fused launch, so a row's
  // bits do not depend on the batch or on the side stream.
  Status linear_pair_swiglu(const cuda::DeviceWeight& w, const cuda::DeviceWeight& w2, const float* x, int64_t n,
                            float* y, float* y2, const cuda::SwigluEpilogue& sw);
  Status expert_linear_pair_swiglu(const std::vector<DeviceExpert>& experts, cuda::DeviceWeight DeviceExpert::*which,
                                   cuda::DeviceWeight DeviceExpert::*which2, const cuda::DeviceWeight* d_w,
                                   const cuda::DeviceWeight* d_w2, int64_t out_dim, int64_t in_dim, const float* x,
                                   const int64_t* x_rows, float* gathered, int64_t m_max, float* y, float* y2,
                                   const cuda::SwigluEpilogue& sw, cuda::SharedUnits* shared = nullptr);
  // The shared expert folded into the routed launches (cuda::moe_shared_fold, DS41_MOE_SHARED_FOLD) for a MoE of
  // nk routed rows: at the sizes whose routed pairs take the decode GEMV (the branch that runs them with their
  // SwiGLU) and whose dense pairs take the tensor-core GEMV's epilogue (row-invariant calls, or <= 16 rows), so
  // the shared expert's bits are the same whether a launch folded it or not.
  bool shared_fold_ok(int64_t nk) const;

  // Decode steps pad key and score counts to multiples of this, or of the power of two in
  // (count / 128, count / 64] when larger (gpu_step_plan.cpp).
  static constexpr int64_t kDecodeBucket = 128;
  template <class T>
  const T* put(const std::vector<T>& v);  // into the metadata arena; device address
  Status meta_fits() const;

  const DeviceModel* m_ = nullptr;
  const model::ModelConfig* c_ = nullptr;
  GpuLimits lim_;
  KvBlockPool* pool_ = nullptr;
  SequenceSlots* slots_ = nullptr;
  cudaStream_t stream_ = nullptr;
  GpuWorkspace ws_;
  std::unique_ptr<TensorCoreLinear> tc_;
  std::unique_ptr<StepGraphs> graphs_;  // decode steps as graphs (null: off)  // null: tensor-core prefill off (GpuLimits::tensor_core_min_rows 0)
  std::vector<cuda::DeviceWeight> expert_scratch_;  // host list of one expert matrix (expert_linear)
  std::vector<cuda::DeviceWeight> expert_scratch2_;  // the second matrix of a pair (expert_linear_pair)

  // The step plan.
  int64_t n_ = 0;
  std::vector<PlanSeq> seqs_;
  std::vector<int64_t> pos_host_;
  std::vector<int32_t> hash_ids_;  // [n, engram layers, cols]
  size_t meta_off_ = 0;
  bool meta_overflow_ = false;
  const int32_t* ids_ = nullptr;
  const int64_t* pos_ = nullptr;
  // Image spans of the step: per-row flags (null when no row is flagged: the router and Engram
  // kernels then skip them), and the span rows to upload (host sources in row order) with the
  // rows they replace.
  const uint8_t* vl_ = nullptr;
  std::vector<std::span<const float>> span_src_;
  const int64_t* span_dst_ = nullptr;
  int64_t span_rows_ = 0;
  const int32_t* row_seq_ = nullptr;
  const int64_t* win_offsets_ = nullptr;  // the current layer's window entry lists (run_layer sets them)
  const int32_t* win_index_ = nullptr;
  std::vector<const int64_t*> win_offsets_list_;  // one per distinct set of window floors
  std::vector<const int32_t*> win_index_list_;
  std::vector<int32_t> win_list_of_layer_;  // [n_layers]
  int64_t ring_rows_ = 0;
  const int64_t* ring_read_ = nullptr;      // [ring_rows_] byte offsets in a layer's rings
  const int64_t* ring_write_ = nullptr;     // [n] byte offsets or -1
  // No ring slot written by this call's rows is read as an earlier row (a decode step: the slot written
  // is the one whose row left the window): the window KV step may run in one launch (gx_step_kernels.h).
  bool ring_disjoint_ = false;
  std::vector<const int64_t*> engram_ids_;  // per engram layer index: [n, cols]
  std::vector<PlanSource> sources_;
  std::vector<int64_t> source_of_layer_;
  std::vector<PlanIndex> index_;  // per layer (used by index sources)
  std::vector<int64_t> logit_rows_host_;
  const int64_t* logit_rows_ = nullptr;
  std::vector<int32_t> new_pages_;
  // Host state one layer leaves to the next within a step (enqueue restores it at the start of a
  // segment that runs more than once): which source's keys are ready (-1: none): their pool offsets in
  // ws_.key_offsets, and for steps that score float keys (prefill-shaped: not
  // cuda::indexer_scores_packed_supported) the keys decoded in ws_.keys; the candidate mask's stride
  // and per-row extents.
  struct Carry {
    int64_t keys_of_source = -1;
    int64_t cand_stride = 0;
    const int64_t* cand_t_mask = nullptr;
    bool x_collapsed = false;  // the previous layer's combine wrote this layer's attention-site x (moe_rows' next)
  };
  Carry carry_;
  std::vector<cudaEvent_t> events_;  // n_layers + 2, created with the forward (layer_ms)
  std::vector<uint64_t> launch_marks_;  // cuda::thread_launch_count() at each event (layer_launches)

  // DSpark buffers (enable_dspark), carved from one allocation.
  struct Dspark {
    bool on = false;
    int64_t F = 0, J = 0, n_pend = 0, max_draft_seqs = 0;
    DeviceBuffer buf;
    PinnedBuffer host;
    float *feat = nullptr, *featg = nullptr, *main_x = nullptr, *kvd = nullptr, *mean_w = nullptr;
    uint8_t* rings = nullptr;  // [stage][slot][window][row]
    int64_t stage_stride = 0;
    float *U = nullptr, *h = nullptr, *hn = nullptr, *me = nullptr, *mz = nullptr, *zk = nullptr, *hz = nullptr,
          *gamma = nullptr;
    int32_t *prev = nullptr, *cand = nullptr;  // anchors [seqs]; candidates [B, seqs]
    float* zk_host = nullptr;   // pinned [seqs, V]
    int32_t* prev_host = nullptr;  // pinned [seqs]
    // Journal: ring rows [seqs][layer][J][row], pending rows [seqs * J * 2 * n_pend][kv_dim],
    // compressor rows a / b per ratio > 1 source [n_pend][seqs * J][kv_dim].
    uint8_t* ring_save = nullptr;
    float *pend_save = nullptr, *jca = nullptr, *jcb = nullptr, *rscratch = nullptr;
    int64_t jrows = 0;  // seqs * J
    int64_t main_x_rows = 0;  // rows of main_x the last dspark_commit computed
  } ds_;
  GpuSpecJournal* journal_ = nullptr;  // the running forward's journal
  // The running forward's rows must not depend on the batch: a verification (journal_) or a
  // decode step (one row per sequence). See linear() in gpu_forward.cpp.
  bool row_invariant_ = false;
  // Whether prefill chunks may decode the KV owner's entries once (set_kv_entry_table_for_tests).
  static bool table_decode_enabled();
  static bool compress_pair();  // DS41_COMPRESS_PAIR (gpu_forward.cpp)
  std::vector<std::pair<int64_t, int64_t>> jpend_;  // (plan sequence, pending row) written this call
  const int64_t* jpend_rows_ = nullptr;              // device copy of the rows to save

  // Side stream. A batch-1 decode layer is a chain of ~25 kernels, many of them a few blocks wide
  // (norms, the router, the ring decode, small GEMVs) that leave the GPU nearly idle while they
  // run. Two chains of a layer that share no buffer run concurrently: the window KV and the
  // compressor beside the query path (attention), the shared expert beside the router and the
  // routed experts (MoE). concurrently() forks the side stream off the main one, enqueues `side`
  // there (stream_ is the side stream meanwhile) and `main` on the main stream, and joins before it
  // returns, also on error. The kernels, their arguments and the buffers they write are the same as
  // in order, so every result keeps its bits; a captured graph holds the two branches. Only where no
  // call can reach the tensor-core GEMMs (their scratch and cuBLAS handle are single-stream):
  // side_ok(). Kernels on either stream keep the PDL contract (launch.h): each waits before reading.
  // The mHC sites (hc_site) also put their map on the side stream and only the collapse + norm on
  // the main one: the map's pre / post / comb are read only at the expand (and the next site's
  // collapse), so the side work stays pending until join_pending() there, or until a
  // concurrently() joins; its partials and counters are ws_.hc_scratch / ws_.hc_counters, since
  // the router and the attention use ws_.scratch / ws_.counters meanwhile. DS41_HC_SPLIT=0: one launch.
  bool side_ok() const;
  Status concurrently(const std::function<Status()>& side, const std::function<Status()>& main);
  Status join_pending();
  cudaStream_t side_ = nullptr;                                // null: off (GpuLimits::side_stream)
  cudaEvent_t fork_ev_ = nullptr, join_ev_ = nullptr;
  bool side_pending_ = false;  // side-stream work not yet joined into the main stream
  HostTimes host_times_;
  bool device_span_ = false;
  cudaEvent_t span_ev_[2] = {nullptr, nullptr};
};

}  // namespace ds41::gpu
