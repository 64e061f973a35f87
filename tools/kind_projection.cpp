// ds41 tools: kind_projection.h.
#include "kind_projection.h"

#include <cmath>
#include <optional>

#include "model/decoder_replay_plan.h"

namespace ds41::cli {

std::string layer_kind(const model::LayerPlan& p) {
  std::string k = std::string(model::attn_mode_name(p.mode));
  if (p.ratio > 0) k += "/r" + std::to_string(p.ratio);
  if (p.candidate_source) k += "+cand";
  if (p.engram) k += "+engram";
  return k;
}

namespace {
namespace kind_projection {  // one name per file: the unity build of tools/ (CMakeLists.txt)

constexpr const char* kEngram = "+engram";

bool ends_with_engram(const std::string& k) {
  const std::string e = kEngram;
  return k.size() > e.size() && k.compare(k.size() - e.size(), e.size(), e) == 0;
}

// Engram's own seconds per layer: the window-only layer with Engram less the one without (the
// only difference between the two), when both were measured; never negative.
std::optional<double> engram_delta(const std::map<std::string, double>& t) {
  const auto with = t.find(std::string("window-only") + kEngram), without = t.find("window-only");
  if (with == t.end() || without == t.end()) return std::nullopt;
  return std::max(0.0, with->second - without->second);
}

// The value (seconds, bytes) of one layer of `kind`: measured, or estimated from the kind with /
// without Engram (`how` says which); nullopt when neither was measured.
std::optional<double> kind_value(const std::map<std::string, double>& t, const std::string& kind, std::string* how) {
  if (auto it = t.find(kind); it != t.end()) return it->second;
  const std::optional<double> d = engram_delta(t);
  if (ends_with_engram(kind)) {
    const std::string base = kind.substr(0, kind.size() - std::string(kEngram).size());
    if (auto it = t.find(base); it != t.end()) {
      *how = d ? base + " + the Engram delta (window-only+engram - window-only)" : base + " (no Engram delta measured)";
      return it->second + d.value_or(0.0);
    }
    return std::nullopt;
  }
  const std::string with = kind + kEngram;
  if (auto it = t.find(with); it != t.end()) {
    if (d && it->second - *d > 0) {
      *how = with + " - the Engram delta (window-only+engram - window-only)";
      return it->second - *d;
    }
    *how = with + " (its Engram included: no Engram delta measured)";
    return it->second;
  }
  return std::nullopt;
}

Status check_times(const std::map<std::string, double>& t, const char* who, const char* what) {
  for (const auto& [k, v] : t)
    if (!std::isfinite(v) || v < 0)
      return invalid_argument(std::string(who) + ": " + what + " of '" + k + "' must be finite and >= 0, got " +
                              std::to_string(v));
  return ok_status();
}

// t[layer l's kind], measured or estimated (the estimate named in *approximated under kind + suffix).
Result<double> layer_value(const std::map<std::string, double>& t, const model::LayerPlan& l, const char* who,
                           const char* what, const std::string& suffix,
                           std::map<std::string, std::string>* approximated) {
  const std::string kind = layer_kind(l);
  std::string how;
  const std::optional<double> v = kind_value(t, kind, &how);
  if (!v) return not_found(std::string(who) + ": layer kind '" + kind + "' (layer " + std::to_string(l.layer) +
                           ") has no " + what + " measurement and no estimate");
  if (!how.empty()) (*approximated)[kind + suffix] = how;
  return *v;
}

}  // namespace kind_projection
}  // namespace

Result<DecodeProjection> project_decode(const model::LayerSchedule& schedule,
                                        const std::map<std::string, double>& ms_per_layer,
                                        const std::map<std::string, double>& bytes_per_layer, double head_ms,
                                        double outside_ms, double bandwidth_bytes_per_s) {
  using namespace kind_projection;
  constexpr const char* who = "decode projection";
  DS41_RETURN_IF_ERROR(check_times(ms_per_layer, who, "milliseconds"));
  DS41_RETURN_IF_ERROR(check_times(bytes_per_layer, who, "bytes"));
  if (!std::isfinite(head_ms) || head_ms < 0 || !std::isfinite(outside_ms) || !(bandwidth_bytes_per_s > 0))
    return invalid_argument("decode projection: head / outside milliseconds must be >= 0 and the bandwidth > 0");
  DecodeProjection p;
  p.layers = static_cast<int64_t>(schedule.layers.size());
  for (const model::LayerPlan& l : schedule.layers) {
    ++p.layers_per_kind[layer_kind(l)];
    DS41_ASSIGN_OR_RETURN(const double ms, layer_value(ms_per_layer, l, who, "time", "", &p.approximated));
    DS41_ASSIGN_OR_RETURN(const double bytes, layer_value(bytes_per_layer, l, who, "bytes", " (bytes)", &p.approximated));
    p.layers_ms += ms;
    p.layers_bytes += bytes;
  }
  p.step_ms = p.layers_ms + head_ms + std::max(0.0, outside_ms);
  p.layers_roofline_ms = p.layers_bytes / bandwidth_bytes_per_s * 1e3;
  p.layers_roofline_ratio = p.layers_roofline_ms > 0 ? p.layers_ms / p.layers_roofline_ms : 0.0;
  return p;
}

Result<PrefillProjection> project_prefill(const model::ModelConfig& target, const model::LayerSchedule& schedule,
                                          int64_t tokens, const KindSeconds& measured, double head_s) {
  using namespace kind_projection;
  if (tokens < 1) return invalid_argument("prefill projection: tokens must be >= 1");
  if (!std::isfinite(head_s) || head_s < 0) return invalid_argument("prefill projection: head seconds must be >= 0");
  constexpr const char* who = "prefill projection";
  DS41_RETURN_IF_ERROR(check_times(measured.prompt, who, "prompt seconds"));
  DS41_RETURN_IF_ERROR(check_times(measured.window, who, "window seconds"));
  PrefillProjection p;
  p.tokens = tokens;
  p.layers = static_cast<int64_t>(schedule.layers.size());
  Result<model::DecoderReplayPlan> plan = model::plan_decoder_replay(target, schedule, tokens);
  if (plan.ok()) {
    p.cut = plan->cut;
  } else {
    p.replay_refused = plan.status().message();
  }
  double exact = head_s, replay = head_s;
  for (const model::LayerPlan& l : schedule.layers) {
    ++p.layers_per_kind[layer_kind(l)];
    DS41_ASSIGN_OR_RETURN(const double full, layer_value(measured.prompt, l, who, "prompt", "", &p.approximated));
    exact += full;
    if (p.cut < 0) continue;
    if (l.layer <= p.cut) {
      replay += full;
    } else {
      DS41_ASSIGN_OR_RETURN(const double win,
                            layer_value(measured.window, l, who, "window-chunk", " (window)", &p.approximated));
      replay += win;
    }
  }
  p.exact_s = exact;
  p.exact_tokens_per_s = exact > 0 ? static_cast<double>(tokens) / exact : 0.0;
  if (p.cut >= 0) {
    p.replay_s = replay;
    p.replay_tokens_per_s = replay > 0 ? static_cast<double>(tokens) / replay : 0.0;
  }
  return p;
}

}  // namespace ds41::cli
