// ds41 backends/cuda: fused row kernels of the decode step (issue 11: fewer launches per layer).
// Each entry point is bit-identical to the unfused op sequence it names (the same float operations
// in the same order per element, the same order of every reduction), and falls back to that
// sequence for shapes the fused kernel does not take. Contract shared by the GPU executor (src/gpu)
// and the kernels: device pointers, the stream last, errors as Status, no allocation or
// synchronisation (graph-capturable); tests/parity/cuda/fused_rows_parity_test.cpp compares each
// with its unfused sequence bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/fake_quant_kernels.h"
#include "backends/cuda/mhc_kernels.h"
#include "core/status.h"

namespace ds41::cuda {

// RMSNorm -> RoPE -> fake quantization of `rows` rows of `dim` floats, one launch. Equivalent to
//   run_rms_norm(in, rows, dim, norm_weight, eps, normed ? normed : out)        (norm on)
//   copy normed -> out                                                           (normed set)
//   run_rope(out, rows / rows_per_pos, rows_per_pos, dim, pos, inv_freq, n_freq, inverse)
//   run_encode_rows_scatter(op, dim, out, rows, base, offsets)                   (offsets set)
//   run_fake_quant_inplace(op, dim, out, rows)                                   (quant_inplace)
// Each stage is optional; `in` may alias `out` (not `normed`). Without norm, `in` is the rope input.
struct RowsNormRopeQuantArgs {
  int64_t rows = 0, dim = 0;
  const float* in = nullptr;  // [rows, dim]
  float* out = nullptr;       // [rows, dim] the final rows (nullable: only scattered)
  // RMSNorm over each row (MODEL_SPEC 3.4.1).
  bool norm = false;
  const float* norm_weight = nullptr;  // nullable: 1
  float eps = 0.0f;
  float* normed = nullptr;  // nullable: the normalized rows before the rotation
  // RoPE on the trailing 2 * n_freq channels of each row at position pos[row / rows_per_pos]
  // (n_freq == 0: off).
  const int64_t* pos = nullptr;
  int64_t rows_per_pos = 1;
  const float* inv_freq = nullptr;
  int64_t n_freq = 0;
  bool inverse = false;
  // Fake quantization (MODEL_SPEC 3.9): the rows packed to base + offsets[row] (offset < 0:
  // skipped), and / or out replaced by decode(encode(row)).
  bool quant = false;
  FakeQuantOp op = FakeQuantOp::kWin;
  uint8_t* base = nullptr;
  const int64_t* offsets = nullptr;  // nullable: no packing
  bool quant_inplace = false;
};
Status run_rows_norm_rope_quant(const RowsNormRopeQuantArgs& a, cudaStream_t stream);

// The window KV rows' step (MODEL_SPEC 3.4.3; DSpark's stages, 3.10.3): `rows` rows of `kv` (dim
// floats each) RMS-normed with kv_norm, rotated at pos (the whole-row rotation of n_freq pairs),
// and quantized to Q_win: packed into ring_base + ring_offsets[row] when ring_base is set, and / or
// replaced in place by their Q_win values when `inplace`. The arguments of run_rows_norm_rope_quant.
RowsNormRopeQuantArgs window_kv_rows(int64_t rows, int64_t dim, float* kv, const float* kv_norm, float eps,
                                     const int64_t* pos, const float* inv_freq, int64_t n_freq, uint8_t* ring_base,
                                     const int64_t* ring_offsets, bool inplace);

// An mHC site in one launch (MODEL_SPEC 3.3): equivalent to
//   run_hc_map(map)                                           (pre / post / comb of this site)
//   run_hc_collapse(map.streams, collapse_w, n, c, h, x)      (weights: the lagged pre)
//   run_rms_norm(x, n, h, norm_weight, eps, x)
// The map's split-K blocks and one collapse + norm block per row share the grid (the collapse reads
// the streams and the earlier site's weights only, never this map's outputs); the last split-K
// block of each group of rows (an atomic counter per group, reset by that block) sums the partials
// and runs the map's tail. counters: at least hc_site_counter_count(n) zeroed uint32 on the device
// that only this stream's site calls use (they are zero again after every call). Shapes the fused
// kernel does not take (h > 10240, collapse_w aliasing an output) run the unfused sequence.
struct HcSiteArgs {
  HcMapDeviceArgs map;
  const float* collapse_w = nullptr;   // [n, c]
  const float* norm_weight = nullptr;  // [h], nullable: 1
  float eps = 0.0f;
  float* x = nullptr;  // [n, h]
  uint32_t* counters = nullptr;
  int64_t counters_size = 0;  // entries of counters; fewer than hc_site_counter_count(n): unfused
};
int64_t hc_site_counter_count(int64_t n);
// Which blocks of the site run (the same kernel, the same code per block): both parts in one launch,
// or the map's split-K blocks alone / the collapse + norm blocks alone, so that the two can run on
// two streams (the map's outputs are read only at the expand; gpu_forward.h "Side stream"). The
// parts need the fused shape (hc_site_fused); kBoth falls back to the unfused sequence otherwise.
enum class HcSitePart { kBoth, kMap, kCollapse };
bool hc_site_fused(const HcSiteArgs& a);
Status run_hc_site(const HcSiteArgs& a, cudaStream_t stream, HcSitePart part = HcSitePart::kBoth);
// Whether the collapse part alone (HcSitePart::kCollapse) runs the float4 kernel: C = 4, h % 1024 == 0,
// 16-byte aligned streams / x / norm weight, unless DS41_HC_COLLAPSE_QUADS=0 (the scalar block; on by
// default since it was timed on an H100: 6.8 us per call against 11.6-12.0). The same bits either way.
bool hc_site_collapse_quads(const HcSiteArgs& a);
// A site's map as extra blocks of another launch of the decode step (DS41_HC_MAP_FOLD, opt-in until timed: the
// GEMVs that carry it, tc_gemv_kernels.h), instead of its own launch (run_hc_site's HcSitePart::kMap): the same
// blocks (hc_site_map_device.cuh, hc::hc_split's geometry), so the same pre / post / comb bits. hc_site_map_fold
// fills f where a carrying launch can take the site's map (hc_site_fused, C = 4, the float4 map: 16-byte
// aligned fn and streams) and the switch is on; false otherwise. `folded` is written by the carrying call: false
// where it did not take the map (the caller then runs run_hc_site's map part).
struct HcMapFold {
  HcSiteArgs site;
  int64_t splits = 0, steps = 0, blocks = 0;
  bool folded = false;
};
bool hc_site_map_fold(const HcSiteArgs& s, HcMapFold* f);
bool hc_map_fold_enabled();
void set_hc_map_fold_for_tests(int mode);  // -1 the environment, 0 off, 1 on
void set_hc_collapse_quads_for_tests(int mode);  // -1 the environment, 0 off, 1 on

}  // namespace ds41::cuda
