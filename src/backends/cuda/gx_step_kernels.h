// ds41 backends/cuda: the GPU executor's index-list kernels (docs/gpu_engine.md). They turn the
// step plan's page tables (MODEL_SPEC 5.2 rows in fixed pages) and the device-resident top-k
// selections into the byte offsets and entry lists that the KV-row and attention launchers take,
// so no selection ever travels to the host inside a forward. Graph-capturable: no allocation,
// no synchronisation, last argument the stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/fake_quant_kernels.h"
#include "backends/cuda/fused_rows_kernels.h"
#include "core/status.h"

namespace ds41::cuda {

// Paged per-sequence rows: sequence s (of the step) holds its entries in pages
// pages[seq_page_begin[s] ...], `entries_per_page` entries per page; entry k of s lies at byte
// pages[seq_page_begin[s] + k / E] * page_bytes + offset_in_page + (k % E) * row_bytes.
struct PagedRowsArgs {
  const int32_t* pages = nullptr;           // device
  const int64_t* seq_page_begin = nullptr;  // device [n_seqs]
  int64_t entries_per_page = 0, page_bytes = 0, offset_in_page = 0, row_bytes = 0;
};

// The page geometry of p: positive sizes, entries_per_page rows of row_bytes from offset_in_page within a page
// (invalid_argument naming what is wrong). The launchers here and the packed indexer's paged keys check it.
Status check_paged_rows(const PagedRowsArgs& p);

// All entries of every sequence, concatenated: for i < total, s is the sequence with
// seq_row_begin[s] <= i < seq_row_begin[s + 1] (seq_row_begin: device [n_seqs + 1], ascending),
// k = i - seq_row_begin[s], out[i] = the byte offset of entry k of s; out[i] = -1 for
// seq_row_begin[n_seqs] <= i < total (padding rows: a decode step pads its key count to a bucket so
// that consecutive steps make the same launches, gpu/step_graphs.h; decode_rows_gather writes
// zeros for them).
Status run_paged_row_offsets(const PagedRowsArgs& p, const int64_t* seq_row_begin, int64_t n_seqs,
                             int64_t total, int64_t* out, cudaStream_t stream);

// Selected entries: out[r * k + j] = byte offset of entry sel[r * k + j] of sequence row_seq[r],
// or -1 where sel < 0 (top-k padding).
Status run_selection_row_offsets(const PagedRowsArgs& p, const int32_t* sel, int64_t n, int64_t k,
                                 const int32_t* row_seq, int64_t* out, cudaStream_t stream);

// The entry lists of cuda::run_sparse_attention (MODEL_SPEC 3.4.7): row r attends to its window
// entries win_index[win_offsets[r] .. win_offsets[r + 1]) followed, when sel is not null, by one
// entry for each j (ascending) with sel[r * k + j] >= 0: comp_base + r * k + j (the rows where the
// selections were decoded one by one), or, with a table (seq_entry_begin not null),
// comp_base + seq_entry_begin[row_seq[r]] + sel[r * k + j] (every entry of every sequence decoded
// once, concatenated: table_rows rows; a prefill chunk's n * k selections name far fewer distinct
// entries). kv_offsets: [n + 1], kv_index: room for win_offsets[n] + n * k entries. One block (a scan
// over rows), a warp per row for the counts and the lists.
Status run_build_sparse_index(const int64_t* win_offsets, const int32_t* win_index, const int32_t* sel,
                              int64_t n, int64_t k, int64_t comp_base, int64_t* kv_offsets, int32_t* kv_index,
                              cudaStream_t stream, const int32_t* row_seq = nullptr,
                              const int64_t* seq_entry_begin = nullptr, int64_t table_rows = 0);

// A decode step's selected entries in one launch (MODEL_SPEC 3.4.7): the rows of run_selection_row_offsets
// + run_decode_rows_gather(op, channels, base, those offsets, n * k, rows) and the lists of
// run_build_sparse_index(win_offsets, win_index, sel, n, k, comp_base, kv_offsets, kv_index) (no
// table), bit for bit: one block builds the lists while the others decode the selected rows straight
// from the pages (each element computes its row's offset; none is stored). Calls of 256 rows or
// more (prefill chunks) run the three launches, with offsets_scratch (n * k) for the offsets.
struct SelectedEntriesArgs {
  PagedRowsArgs pages;                  // the KV owner's pages (its Q_kv rows)
  const int32_t* sel = nullptr;         // [n, k] entry of the row's sequence, < 0 padding
  int64_t n = 0, k = 0;
  const int32_t* row_seq = nullptr;     // [n] the row's sequence (of the step)
  FakeQuantOp op = FakeQuantOp::kKv;
  int64_t channels = 0;                 // per row
  const uint8_t* base = nullptr;        // the pool's bytes
  float* rows = nullptr;                // [n * k, channels] the decoded rows (zeros for padding)
  const int64_t* win_offsets = nullptr;  // as run_build_sparse_index
  const int32_t* win_index = nullptr;
  int64_t comp_base = 0;
  int64_t* kv_offsets = nullptr;
  int32_t* kv_index = nullptr;
};
Status run_selected_entries(const SelectedEntriesArgs& a, int64_t* offsets_scratch, cudaStream_t stream);

// A decode-shaped call's window KV step in one launch (MODEL_SPEC 3.4.3, 3.4.7; issue 11: launches per
// layer). Equivalent to, in this order,
//   run_decode_rows_gather(rows.op, rows.dim, rows.base, ring_read, ring_rows, ring_out)  (earlier rows)
//   run_rows_norm_rope_quant(rows)                          (this call's rows into their ring slots)
//   run_selected_entries(*entries, offsets_scratch)         (entries set: a layer that scores no keys)
// bit for bit: the parts write disjoint outputs and read nothing another part writes, provided the
// ring slots read (ring_read) and written (rows.offsets) are disjoint. The caller's step plan knows
// (one row per sequence: the slot written is the one whose row left the window) and says so in
// slots_disjoint; without it, or for shapes the kernel does not take (rows.op not Q_win, no packing,
// dim > 1024, entries of a wide call or not Q_kv), the sequence above runs instead.
// The ring and entry blocks read data written two or more launches back only (the ring of an earlier
// step, the selections and pages of earlier layers), so they run before the kernel's PDL wait; the
// rows' blocks read this call's rows (the previous launch's output) after it.
struct WindowKvStepArgs {
  RowsNormRopeQuantArgs rows;         // window_kv_rows(...): its base is the layer's ring
  const int64_t* ring_read = nullptr;  // [ring_rows] byte offsets of the earlier rows in the ring
  int64_t ring_rows = 0;
  float* ring_out = nullptr;           // [ring_rows, rows.dim] their decoded values
  const SelectedEntriesArgs* entries = nullptr;  // nullable
  bool slots_disjoint = false;
};
// Whether run_window_kv_step takes a's shape in one launch (the host's checks only).
bool window_kv_step_fused(const WindowKvStepArgs& a);
// DS41_WINDOW_KV_STEP=0 turns the one launch off (measurements); default on.
bool window_kv_step_enabled();
void set_window_kv_step_for_tests(int mode);  // -1 the environment, 0 off, 1 on
Status run_window_kv_step(const WindowKvStepArgs& a, int64_t* offsets_scratch, cudaStream_t stream);

}  // namespace ds41::cuda
