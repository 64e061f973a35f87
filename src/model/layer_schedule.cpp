// ds41 model: derivation of the CSA2 layer schedule from config.json (MODEL_SPEC 1.5).
#include "model/layer_schedule.h"

#include <algorithm>
#include <sstream>

namespace ds41::model {

const char* attn_mode_name(AttnMode m) {
  switch (m) {
    case AttnMode::kWindowOnly: return "window-only";
    case AttnMode::kFull: return "full";
    case AttnMode::kReindex: return "reindex";
    case AttnMode::kReuse: return "reuse";
  }
  return "?";
}

static bool contains(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

Result<LayerSchedule> derive_layer_schedule(const ModelConfig& c) {
  LayerSchedule s;
  std::vector<std::string> errors;
  auto err = [&](int64_t l, const std::string& m) { errors.push_back("layer " + std::to_string(l) + ": " + m); };
  int64_t last_kv = -1, last_idx = -1;
  const int64_t cs = c.candidate_source_layer_id;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerPlan p;
    p.layer = l;
    p.ratio = l < static_cast<int64_t>(c.compress_ratios.size()) ? c.compress_ratios[l] : 0;
    p.kv_source = contains(c.kv_source_layer_ids, l);
    p.index_source = contains(c.index_source_layer_ids, l);
    p.candidate_source = (l == cs);
    p.engram = contains(c.engram_layer_ids, l);
    p.yarn_rope = p.ratio > 0;
    p.has_gate = p.kv_source && p.ratio > 1;
    if (p.kv_source) last_kv = l;
    if (p.index_source) last_idx = l;
    if (p.ratio == 0) {
      if (p.kv_source) err(l, "is a KV source but has compress ratio 0");
      if (p.index_source) err(l, "is an index source but has compress ratio 0");
      if (p.candidate_source) err(l, "is the candidate source but has compress ratio 0");
      p.mode = AttnMode::kWindowOnly;
    } else {
      if (last_kv < 0) err(l, "has compress ratio " + std::to_string(p.ratio) + " but no KV source at or before it");
      if (last_idx < 0) err(l, "has compress ratio " + std::to_string(p.ratio) + " but no index source at or before it");
      p.kv_owner = last_kv;
      p.idx_owner = last_idx;
      if (p.kv_source && !p.index_source) err(l, "is a KV source but not an index source");
      if (last_idx >= 0 && last_kv >= 0 && last_idx < last_kv)
        err(l, "would reuse the top-k of layer " + std::to_string(last_idx) + " over the cache of the newer KV source " +
                   std::to_string(last_kv));
      if (last_kv >= 0 && c.compress_ratios[last_kv] != p.ratio)
        err(l, "has ratio " + std::to_string(p.ratio) + " but its KV owner " + std::to_string(last_kv) + " has ratio " +
                   std::to_string(c.compress_ratios[last_kv]));
      p.mode = p.kv_source ? AttnMode::kFull : p.index_source ? AttnMode::kReindex : AttnMode::kReuse;
      if (p.candidate_source && !p.index_source) err(l, "is the candidate source but not an index source");
      if (p.index_source && cs >= 0 && l > cs) {
        p.candidate_restricted = true;
        if (cs < static_cast<int64_t>(s.layers.size()) && s.layers[cs].kv_owner != p.kv_owner)
          err(l, "is restricted to the candidate pool of layer " + std::to_string(cs) +
                     " but reads the keys of another KV source");
      }
    }
    s.layers.push_back(p);
  }
  s.kv_sources = c.kv_source_layer_ids;
  if (!errors.empty()) {
    std::string m = "layer schedule contradicts config.json:";
    for (auto& e : errors) m += "\n" + e;
    return invalid_argument(m);
  }
  return s;
}

std::string LayerSchedule::describe() const {
  std::ostringstream o;
  o << "layer ratio mode         kv_owner idx_owner extras\n";
  for (const LayerPlan& p : layers) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%5lld %5lld %-12s %8lld %9lld ", static_cast<long long>(p.layer),
                  static_cast<long long>(p.ratio), attn_mode_name(p.mode), static_cast<long long>(p.kv_owner),
                  static_cast<long long>(p.idx_owner));
    o << buf;
    std::string ex;
    if (p.kv_source) ex += "compressor" + std::string(p.has_gate ? "(gate) " : "(no gate) ");
    if (p.candidate_source) ex += "candidate-source ";
    if (p.candidate_restricted) ex += "candidate-restricted ";
    if (p.engram) ex += "engram ";
    if (p.yarn_rope) ex += "yarn";
    o << ex << "\n";
  }
  return o.str();
}

}  // namespace ds41::model
