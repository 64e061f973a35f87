// ds41 model: named model presets for `ds41 make-checkpoint` (as ModelConfig) and the emitter
// of config.json in the released nested layout (MODEL_SPEC 1.1-1.4), so a generated checkpoint
// is read by exactly the same parser as the real one.
//
//   tiny       the golden model's structure (../shared/golden/README.md): 8 layers with every
//              layer kind (window-only, Full ratio 2, Reuse, Full ratio 1 + candidate source,
//              Reuse, Reindex, Reuse), Engram on layers 1 and 3, hidden 192, vocab 2048,
//              window 8, index top-k 8, candidate pool 6 blocks of 2. No DSpark, no vision.
//              ~7.4 MB; every limit is exceeded by a ~100-token sequence.
//   tiny-vision  tiny + a 1-block vision tower (hidden 64, 2 heads, intermediate 128), at most 64
//              image span positions per image, min_pixels 84^2: the image e2e tests' model.
//   small      16 layers in the released proportions (2 window-only, 6 ratio-2 with KV sources 2
//              and 5, 8 ratio-1 with the KV + candidate source 8 and Reindex 10/12/14), released
//              row widths (head_dim 512, index_head_dim 128), the real vocabulary (129,280, so the
//              V4.1 tokenizer works), hidden 1024, 16 experts (inter 256), 2 DSpark stages and a 2-block
//              vision tower. 836 MB (2,252 tensors; ~14 s CPU to generate); exercises every tensor kind
//              of the release.
//   v41-flash  the released config exactly (MODEL_SPEC 1.3, 1.4): 40 layers, 3 DSpark stages,
//              vision; 48 shards, 510,286,023,000 bytes. Only sensible with --layout-only.
//   v41-flash-slice  the released widths (hidden 5120, 64 heads x 512, q rank 1280, o 8 x 1024,
//              index 32 x 128 top-512, candidate pool 2048 blocks of 8, 384 experts top-6 of 2304 +
//              shared, vocab 129,280, window 128, mHC 4) on 8 layers, one of every CSA2 kind in
//              schedule order; Engram on layers 1 and 2 with tables of ~4.8M rows; no DSpark, no
//              vision. Sized for one H200 with >= 1M tokens of global KV (`--load-format dummy`
//              generates it on the device; tests/unit/model/slice_preset_test.cpp pins its numbers).
//   v41-flash-slice-vision  the slice plus the released vision tower (MODEL_SPEC 1.4: 32 blocks of
//              1024, ~1 GB BF16): `ds41 bench vision --device cuda --load-format dummy`.
// Engram table rows (engram_num_embeddings) are always computed from the prime search of
// MODEL_SPEC 3.2.2, never typed in.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/config.h"

namespace ds41::model {

std::vector<std::string> preset_names();
// InvalidArgument naming the known presets for an unknown name.
Result<ModelConfig> preset_config(std::string_view name);
// Shards the release uses for this preset (48 for v41-flash, 8 for v41-flash-slice, else 1).
int preset_default_shards(std::string_view name);

// MODEL_SPEC 3.2.2 prime moduli: for each of n_layers layers and each of n_orders orders, the next
// n_heads primes >= vocab_start not used before (one used set for all). Returns the per-layer
// sums (the table rows, engram_num_embeddings).
std::vector<int64_t> engram_table_rows(int64_t n_layers, int64_t n_orders, int64_t n_heads,
                                       int64_t vocab_start);
bool is_prime_i64(int64_t n);

// config.json text in the released nested layout: root identity + quantization_config +
// text_config (+ vision_config when c.has_vision). parse_model_config(emit(c)) reproduces c.
std::string model_config_to_json(const ModelConfig& c);

}  // namespace ds41::model
