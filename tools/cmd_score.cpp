// ds41 score: run the exact CPU reference forward pass on token-id prompts and write the logits
// (and with --debug the selections) under the golden array names, so the output is checked by
// `make_goldens.py compare` (../shared/golden/README.md).
//
// IN.json: {"prompts": {"NAME": [ids...], ...}, "decode": {"after": "NAME", "input_ids": [...]}}
// or a golden set's manifest.json (../shared/golden): its prompts, and decode.after_prompt with
// the decode.input_ids array read from the safetensors file the manifest names.
// Writes NAME.logits [len, vocab] (one prefill of each prompt; chunked with --chunk K, which is
// exact) and decode.logits [n, vocab] (single-token steps after the named prompt).
// --replay decoder (MODEL_SPEC 4.4) or encoder:H (4.5) switch to the approximate paths; rows
// the decoder replay never computes are written as NaN.
//
// Images (MODEL_SPEC 3.11, golden README "Vision set"): a top-level "images": [paths] (relative
// to IN.json's folder; a manifest's [{"file": ...}] entries too) and prompts written as
// {"input_ids": [...], "images": [k, ...]}: the k-th listed image fills the k-th run of
// image_token_id in input_ids, in order. The tower runs once over all listed images. With --debug
// the output also holds image{k}.plan / grid_thw / resized_u8 / pixel_values / vit_out /
// aligner_out / span_embeds and per prompt input_ids / image_mask / span_starts / images /
// inputs_embeds / layer{l}.engram_delta_rms. With --device cuda the GPU engine's tower and text
// model run the same input (the debug image arrays then stop at plan / grid_thw / resized_u8 /
// span_embeds: the engine interface returns span rows only).
// IN.json {"dspark": {"input_ids": [...], "prompt_len": P, "anchors": [L, ...], "walk_steps": N}}
// runs the DSpark checks instead (engine/dspark_score.h; golden README "DSpark set"): on the CPU
// reference, or with --device cuda on the GPU engine (gpu/gpu_dspark_score.h, same array names).
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli_registry.h"
#include "core/clock.h"
#include "engine/dspark_score.h"
#include "engine_factory.h"
#include "forward_cli_util.h"
#include "image/image_decode.h"
#include "model/image_input.h"
#include "model/vision_span.h"

namespace ds41::cli {
namespace {
namespace cmd_score {  // one name per file: the unity build of tools/ (CMakeLists.txt)

struct ScoreArgs {
  std::string model_dir, tokenizer_dir, input, out, replay, dump_dir;
  int64_t chunk = 0;
  int threads = 2;
  bool debug = false;
  bool stale_keys = false;
  DeviceFlags device;        // --device, --load-format (engine_factory.h)
  std::string memory_limit;  // --memory-limit
};

struct Prompt {
  std::string name;
  std::vector<int32_t> ids;
  std::vector<int64_t> images;  // indices into ScoreInput::image_paths, in span order
};

struct ScoreInput {
  std::vector<Prompt> prompts;
  std::pair<std::string, std::vector<int32_t>> dec;
  std::vector<std::string> image_paths;
};

// One prompt: [ids] or {"input_ids": [ids], "images": [k, ...]}.
Status parse_prompt(const std::string& path, const nlohmann::ordered_json& v, Prompt* p) {
  const nlohmann::ordered_json* ids = &v;
  if (v.is_object()) {
    if (!v.contains("input_ids"))
      return invalid_argument(path + ": prompts." + p->name + " has no input_ids");
    ids = &v["input_ids"];
    if (v.contains("images")) {
      if (!v["images"].is_array())
        return invalid_argument(path + ": prompts." + p->name + ".images must be a list");
      for (auto& k : v["images"]) {
        if (!k.is_number_integer() || k.get<int64_t>() < 0)
          return invalid_argument(path + ": prompts." + p->name + ".images holds a non-index");
        p->images.push_back(k.get<int64_t>());
      }
    }
  }
  if (!ids->is_array() || ids->empty())
    return invalid_argument(path + ": prompts." + p->name + " must be a non-empty list of token ids");
  for (auto& t : *ids) {
    if (!t.is_number_integer())
      return invalid_argument(path + ": prompts." + p->name + " holds a non-integer");
    p->ids.push_back(t.get<int32_t>());
  }
  return ok_status();
}

Result<ScoreInput> read_input(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found(path + ": cannot open");
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument(path + ": not a JSON object");
  const bool listed = j.contains("prompts") && j["prompts"].is_array();  // a vision manifest's list
  if (!j.contains("prompts") || !(j["prompts"].is_object() || listed) || j["prompts"].empty())
    return invalid_argument(path + ": 'prompts' must be a non-empty object of NAME: [ids]");
  ScoreInput si;
  std::vector<Prompt>& prompts = si.prompts;
  for (auto it = j["prompts"].begin(); it != j["prompts"].end(); ++it) {
    Prompt p;
    if (listed) {
      if (!it->is_object() || !it->contains("name") || !(*it)["name"].is_string())
        return invalid_argument(path + ": a listed prompt needs a \"name\"");
      p.name = (*it)["name"].get<std::string>();
    } else {
      p.name = it.key();
    }
    DS41_RETURN_IF_ERROR(parse_prompt(path, it.value(), &p));
    prompts.push_back(std::move(p));
  }
  const std::filesystem::path base = std::filesystem::path(path).parent_path();
  if (j.contains("images")) {
    if (!j["images"].is_array()) return invalid_argument(path + ": 'images' must be a list of paths");
    for (auto& im : j["images"]) {
      std::string f;
      if (im.is_string())
        f = im.get<std::string>();
      else if (im.is_object() && im.contains("file") && im["file"].is_string())
        f = im["file"].get<std::string>();
      else
        return invalid_argument(path + ": 'images' entries must be paths");
      si.image_paths.push_back(std::filesystem::path(f).is_absolute() ? f : (base / f).string());
    }
  }
  for (const Prompt& p : prompts)
    for (int64_t k : p.images)
      if (k >= static_cast<int64_t>(si.image_paths.size()))
        return invalid_argument(path + ": prompts." + p.name + " uses image " + std::to_string(k) + " but " +
                                std::to_string(si.image_paths.size()) + " images are listed");
  std::pair<std::string, std::vector<int32_t>>& dec = si.dec;
  if (j.contains("decode") && j["decode"].is_object() && j["decode"].contains("after_prompt")) {
    // A golden manifest: decode.input_ids is an I32 array in one of the set's files.
    auto& d = j["decode"];
    if (!d["after_prompt"].is_number_integer())
      return invalid_argument(path + ": decode.after_prompt must be an integer");
    dec.first = "prompt" + std::to_string(d["after_prompt"].get<int64_t>());
    bool found = false;
    for (auto& p : prompts) found |= p.name == dec.first;
    if (!found)
      return invalid_argument(path + ": decode.after_prompt names unknown prompt '" + dec.first + "'");
    const auto& arr = j["arrays"]["decode.input_ids"];
    if (!arr.is_object()) return invalid_argument(path + ": arrays.decode.input_ids is missing");
    // The vision manifest lists its arrays without a file: they are in goldens.safetensors.
    const std::string fname = arr.contains("file") && arr["file"].is_string() ? arr["file"].get<std::string>()
                                                                              : "goldens.safetensors";
    const std::string file = (std::filesystem::path(path).parent_path() / fname).string();
    DS41_ASSIGN_OR_RETURN(auto st, model::SafetensorsFile::open(file));
    auto it = st->header().tensors.find("decode.input_ids");
    if (it == st->header().tensors.end() || it->second.dtype != DType::kI32)
      return invalid_argument(file + ": no I32 tensor decode.input_ids");
    dec.second.resize(static_cast<size_t>(it->second.numel()));
    std::memcpy(dec.second.data(), st->data(it->second), it->second.nbytes());
  } else if (j.contains("decode")) {
    auto& d = j["decode"];
    if (!d.is_object() || !d.contains("after") || !d["after"].is_string() || !d.contains("input_ids") ||
        !d["input_ids"].is_array())
      return invalid_argument(path + ": 'decode' must be {\"after\": NAME, \"input_ids\": [ids]}");
    dec.first = d["after"].get<std::string>();
    bool found = false;
    for (auto& p : prompts) found |= p.name == dec.first;
    if (!found) return invalid_argument(path + ": decode.after names unknown prompt '" + dec.first + "'");
    for (auto& v : d["input_ids"]) {
      if (!v.is_number_integer()) return invalid_argument(path + ": decode.input_ids holds a non-integer");
      dec.second.push_back(v.get<int32_t>());
    }
  }
  return si;
}

// The output's folder must exist and be writable: checked before minutes of computing.
Status check_writable_output(const std::string& out) {
  std::filesystem::path dir = std::filesystem::path(out).parent_path();
  if (dir.empty()) dir = ".";
  if (!std::filesystem::is_directory(dir))
    return not_found("--out: folder " + dir.string() + " does not exist");
  if (::access(dir.c_str(), W_OK) != 0)
    return failed_precondition("--out: folder " + dir.string() + " is not writable");
  return ok_status();
}

// --debug arrays under the golden names: hash ids, top-k, routing, candidate masks (over the
// candidate source's entries after the prompt: entries_of(layer) = T, golden layout [S, T]).
void write_records(model::SafetensorsWriter* w, const std::string& name, int64_t S,
                   const model::ModelConfig& c, const model::ForwardRecord& r,
                   const std::function<int64_t(int64_t)>& entries_of) {
  if (!r.hash_ids.empty()) {
    const int64_t nel = static_cast<int64_t>(c.engram_layer_ids.size());
    w->add_i32(name + ".engram_hash_ids", {S, nel, static_cast<int64_t>(r.hash_ids.size()) / (S * nel)},
               r.hash_ids.data());
  }
  for (auto& [l, v] : r.topk)
    w->add_i32(name + ".layer" + std::to_string(l) + ".topk_indices", {S, c.index_topk}, v.data());
  for (auto& [l, v] : r.router_experts)
    w->add_i32(name + ".layer" + std::to_string(l) + ".router_experts", {S, c.num_experts_per_tok}, v.data());
  for (auto& [l, v] : r.router_weights)
    w->add_f32(name + ".layer" + std::to_string(l) + ".router_weights", {S, c.num_experts_per_tok}, v.data());
  for (auto& [l, blocks] : r.cand_blocks) {
    const int64_t T = entries_of(l);
    const int64_t B = c.candidate_block_size, nb = c.candidate_topk_blocks;
    std::vector<uint8_t> mask(S * T, 0);
    for (int64_t row = 0; row < S; ++row)
      for (int64_t j = 0; j < nb; ++j) {
        const int32_t b = blocks[row * nb + j];
        if (b < 0) continue;
        for (int64_t t = b * B; t < std::min(T, (b + 1) * B); ++t) mask[row * T + t] = 1;
      }
    w->add_u8(name + ".layer" + std::to_string(l) + ".candidate_mask", {S, T}, mask.data());
  }
}

// --debug arrays of one prepared image under the golden names: plan, grid_thw, resized_u8.
void write_image_plan(model::SafetensorsWriter* w, size_t k, const image::PreparedImage& im, int64_t ps) {
  const image::ImagePlan& pl = im.plan;
  const std::string pre = "image" + std::to_string(k) + ".";
  const std::vector<int32_t> plan = {int32_t(pl.orig_w),   int32_t(pl.orig_h),  int32_t(pl.up_w),
                                     int32_t(pl.up_h),     int32_t(pl.box_h),   int32_t(pl.box_w),
                                     int32_t(pl.fit_h),    int32_t(pl.fit_w),   int32_t(pl.pad_top),
                                     int32_t(pl.pad_left), int32_t(pl.n_llm_h), int32_t(pl.n_llm_w),
                                     int32_t(pl.n_tokens)};
  const std::vector<int32_t> grid = {1, int32_t(pl.box_h / ps), int32_t(pl.box_w / ps)};
  w->add_i32(pre + "plan", {13}, plan.data());
  w->add_i32(pre + "grid_thw", {3}, grid.data());
  w->add_u8(pre + "resized_u8", {pl.box_h, pl.box_w, 3}, im.resized.rgb.data());
}

// --debug arrays of a prompt's span layout: input_ids, image_mask, span_starts, images.
void write_prompt_layout(model::SafetensorsWriter* w, const Prompt& p, const model::ImagePromptInput& pi) {
  const std::string pre = p.name + ".";
  const int64_t S = static_cast<int64_t>(pi.tokens.size());
  std::vector<int32_t> starts(pi.span_starts.begin(), pi.span_starts.end());
  std::vector<int32_t> imgs(p.images.begin(), p.images.end());
  w->add_i32(pre + "input_ids", {S}, pi.tokens.data());
  w->add_u8(pre + "image_mask", {S}, pi.image_span.data());
  w->add_i32(pre + "span_starts", {static_cast<int64_t>(starts.size())}, starts.data());
  w->add_i32(pre + "images", {static_cast<int64_t>(imgs.size())}, imgs.data());
}

Result<std::vector<image::PreparedImage>> prepare_listed_images(const model::ModelConfig& c,
                                                                const std::vector<std::string>& paths) {
  std::vector<image::PreparedImage> prepared;
  for (const std::string& path : paths) {
    DS41_ASSIGN_OR_RETURN(auto d, image::decode_image_file(path, image::ImageLimits{}));
    auto p = image::prepare_image(d.rgb, model::vision_plan_config(c));
    if (!p.ok()) return p.status().with_context(path);
    prepared.push_back(std::move(p).value());
  }
  return prepared;
}

// A text prompt must not hold the image token (it needs an image).
Status check_text_prompt(const Prompt& p, const model::ModelConfig& c) {
  for (int32_t t : p.ids)
    if (t == c.image_token_id)
      return invalid_argument("prompt '" + p.name + "' holds image token " + std::to_string(t) +
                              " but lists no images");
  return ok_status();
}

// `--device cuda` (or any engine): exact prefill of each prompt with every row's logits, then the
// decode steps, through the engine (engine_factory.h); --replay decoder (MODEL_SPEC 4.4, the kept
// rows' logits, the rest NaN) and encoder:H (4.5: the exact rows before H, Engine::replay_window,
// the rows from H) as the CPU path computes them. Images go through Engine::encode_images (one
// tower batch) and the prompts' spans through the engine's steps; with --debug the image arrays
// the engine interface gives (plan, grid_thw, resized_u8, span_embeds, the prompts' span layout)
// are written too, not the tower's internals (vit_out, aligner_out) nor inputs_embeds /
// engram_delta_rms. --dump and --stale-index-keys are the CPU reference's, and so is --replay with
// images.
Status run_score_engine(const ScoreArgs& a, const std::vector<Prompt>& prompts,
                        const std::pair<std::string, std::vector<int32_t>>& dec, bool replay_decoder,
                        int64_t replay_h, const std::vector<std::string>& image_paths) {
  if (!a.dump_dir.empty() || a.stale_keys)
    return invalid_argument("--dump and --stale-index-keys need --device cpu (the CPU reference)");
  if ((replay_decoder || replay_h > 0) && !image_paths.empty())
    return invalid_argument("--replay with images needs --device cpu (the CPU reference)");
  int64_t longest = 1;
  for (const Prompt& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.ids.size()));
  EngineRequest req;
  req.model_dir = a.model_dir;
  req.tokenizer_dir = a.tokenizer_dir;
  req.model_name = "score";
  req.who = "ds41 score";
  req.threads = a.threads;
  req.max_batch_tokens = 2048;
  req.max_logit_rows = std::min<int64_t>(longest, 2048);
  req.max_sequences = 2;
  req.kv_bytes = int64_t{2} << 30;
  DS41_ASSIGN_OR_RETURN(req.memory_limit, parse_memory_limit(a.memory_limit));
  DS41_ASSIGN_OR_RETURN(EngineHandle eh, make_engine(a.device, req));
  if (!eh.forward_all) return unimplemented("ds41 score: this engine returns no all-row logits");
  if (replay_decoder && !eh.decoder_replay_all)
    return unimplemented("ds41 score: this engine returns no decoder-replay logits");
  engine::Engine& eng = *eh.engine;
  const model::ModelConfig& c = eh.config;
  const int64_t V = c.vocab_size;
  model::SafetensorsWriter w;
  w.set_metadata("producer", "ds41 score (" + eng.info().device + ")");
  // Images (MODEL_SPEC 3.11): span rows of every listed image, one tower batch.
  std::vector<std::vector<float>> spans;
  if (!image_paths.empty()) {
    if (!c.has_vision || !eng.info().has_vision)
      return failed_precondition(
          "the input lists images, but the model has no vision tower (no vision_config)");
    DS41_ASSIGN_OR_RETURN(std::vector<image::PreparedImage> prepared, prepare_listed_images(c, image_paths));
    std::vector<const image::PreparedImage*> ptrs;
    for (const image::PreparedImage& p : prepared) ptrs.push_back(&p);
    DS41_ASSIGN_OR_RETURN(spans, eng.encode_images(ptrs));
    if (a.debug)
      for (size_t k = 0; k < prepared.size(); ++k) {
        write_image_plan(&w, k, prepared[k], c.vision_patch_size);
        w.add_f32("image" + std::to_string(k) + ".span_embeds", {prepared[k].plan.n_tokens, c.hidden_size},
                  spans[k].data());
      }
  }
  engine::SeqId keep = -1;
  for (const Prompt& p : prompts) {
    const int64_t S = static_cast<int64_t>(p.ids.size());
    model::ImagePromptInput pi;
    if (!p.images.empty()) {
      std::vector<std::vector<float>> sp;
      for (int64_t k : p.images) sp.push_back(spans[static_cast<size_t>(k)]);
      auto placed =
          model::place_image_spans(p.ids, static_cast<int32_t>(c.image_token_id), sp, c.hidden_size);
      if (!placed.ok()) return placed.status().with_context("prompt '" + p.name + "'");
      pi = std::move(placed).value();
      if (a.debug) write_prompt_layout(&w, p, pi);
    } else if (c.has_vision) {
      DS41_RETURN_IF_ERROR(check_text_prompt(p, c));
    }
    DS41_ASSIGN_OR_RETURN(engine::SeqId seq, eng.create_sequence());
    model::SequenceOutput out;
    if (replay_decoder) {
      DS41_ASSIGN_OR_RETURN(out, eh.decoder_replay_all(seq, p.ids));
    } else if (replay_h > 0) {
      if (replay_h >= S)
        return invalid_argument("--replay encoder:" + std::to_string(replay_h) +
                                " needs H < the length of prompt '" + p.name + "' (" + std::to_string(S) +
                                ")");
      const std::span<const int32_t> ids(p.ids);
      DS41_ASSIGN_OR_RETURN(out, eh.forward_all(seq, ids.first(replay_h), a.chunk, a.debug, {}, {}));
      DS41_RETURN_IF_ERROR(eng.replay_window(seq, ids.first(replay_h)));
      DS41_ASSIGN_OR_RETURN(model::SequenceOutput rest,
                            eh.forward_all(seq, ids.subspan(replay_h), a.chunk, a.debug, {}, {}));
      out.append(std::move(rest));
    } else {
      DS41_ASSIGN_OR_RETURN(out, eh.forward_all(seq, p.ids, a.chunk, a.debug, pi.image_span, pi.span_embeds));
    }
    std::vector<float> logits(S * V, std::numeric_limits<float>::quiet_NaN());
    for (size_t i = 0; i < out.positions.size(); ++i)
      std::copy(out.logits.begin() + i * V, out.logits.begin() + (i + 1) * V,
                logits.begin() + out.positions[i] * V);
    w.add_f32(p.name + ".logits", {S, V}, logits.data());
    if (a.debug && !replay_decoder)  // a fresh prefill of S tokens leaves S / ratio entries in a KV source
      write_records(&w, p.name, S, c, out.record,
                    [&](int64_t l) { return S / eh.schedule.layers[eh.schedule.layers[l].kv_owner].ratio; });
    if (p.name == dec.first)
      keep = seq;
    else
      DS41_RETURN_IF_ERROR(eng.free_sequence(seq));
  }
  if (!dec.second.empty()) {
    const int64_t n = static_cast<int64_t>(dec.second.size());
    std::vector<float> logits(n * V);
    for (int64_t t = 0; t < n; ++t) {
      engine::StepItem it{keep, std::span<const int32_t>(&dec.second[t], 1), true};
      engine::StepOutput so;
      DS41_RETURN_IF_ERROR(eng.step(std::span<const engine::StepItem>(&it, 1), &so));
      std::copy(so.logits.begin(), so.logits.end(), logits.begin() + t * V);
    }
    w.add_f32("decode.logits", {n, V}, logits.data());
  }
  DS41_RETURN_IF_ERROR(w.write(a.out));
  std::fprintf(stderr, "ds41 score: wrote %zu prompt(s)%s to %s\n", prompts.size(),
               dec.second.empty() ? "" : " and the decode steps",
               std::filesystem::absolute(a.out).lexically_normal().c_str());
  return ok_status();
}

// Decodes, preprocesses and encodes every listed image in one tower batch; with debug writes the
// golden image{k}.* arrays.
Result<std::vector<model::EncodedImage>> encode_listed_images(const model::Model& m,
                                                              const std::vector<std::string>& paths,
                                                              bool debug, model::SafetensorsWriter* w) {
  const model::ModelConfig& c = m.config();
  if (!m.vision_tower())
    return failed_precondition(
        "the input lists images, but the model has no vision tower (no vision_config)");
  DS41_ASSIGN_OR_RETURN(std::vector<image::PreparedImage> prepared, prepare_listed_images(c, paths));
  DS41_ASSIGN_OR_RETURN(auto enc, model::encode_images(m, prepared, debug));
  if (debug) {
    const int64_t ps = c.vision_patch_size, D = c.vision_hidden_size, H = c.hidden_size;
    for (size_t k = 0; k < enc.size(); ++k) {
      const image::ImagePlan& pl = enc[k].plan;
      const std::string pre = "image" + std::to_string(k) + ".";
      const int64_t np = (pl.box_h / ps) * (pl.box_w / ps);
      write_image_plan(w, k, prepared[k], ps);
      w->add_f32(pre + "pixel_values", {np, 3 * ps * ps}, enc[k].pixel_values.data());
      w->add_f32(pre + "vit_out", {np, D}, enc[k].vit_out.data());
      w->add_f32(pre + "aligner_out", {pl.n_llm_h * pl.n_llm_w, H}, enc[k].aligner_out.data());
      w->add_f32(pre + "span_embeds", {pl.n_tokens, H}, enc[k].span_embeds.data());
    }
  }
  return enc;
}

// Exact prefill of a prompt with image spans (chunks of `chunk` tokens, 0 = one shot; the span
// rows of each chunk go with it). With debug writes the prompt's span layout and inputs_embeds.
Result<model::SequenceOutput> prefill_with_images(model::Model& m, model::SequenceState& st, const Prompt& p,
                                                  const std::vector<model::EncodedImage>& encoded,
                                                  int64_t chunk, const model::ForwardOptions& opt,
                                                  model::SafetensorsWriter* w) {
  const model::ModelConfig& c = m.config();
  const int64_t H = c.hidden_size, S = static_cast<int64_t>(p.ids.size());
  std::vector<std::vector<float>> spans;
  for (int64_t k : p.images) spans.push_back(encoded[k].span_embeds);
  auto placed = model::place_image_spans(p.ids, static_cast<int32_t>(c.image_token_id), spans, H);
  if (!placed.ok()) return placed.status().with_context("prompt '" + p.name + "'");
  const model::ImagePromptInput& pi = placed.value();
  model::SequenceOutput out;
  const int64_t step = chunk > 0 ? chunk : S;
  int64_t row = 0;
  for (int64_t b = 0; b < S; b += step) {
    const int64_t e = std::min(S, b + step);
    int64_t flagged = 0;
    for (int64_t t = b; t < e; ++t) flagged += pi.image_span[t];
    model::SequenceInput in{&st, std::span<const int32_t>(pi.tokens).subspan(b, e - b),
                            std::span<const uint8_t>(pi.image_span).subspan(b, e - b),
                            std::span<const float>(pi.span_embeds).subspan(row * H, flagged * H)};
    std::vector<model::SequenceOutput> o;
    DS41_RETURN_IF_ERROR(m.forward(std::span<const model::SequenceInput>(&in, 1), opt, &o));
    out.append(std::move(o[0]));
    row += flagged;
  }
  if (w) {
    const std::string pre = p.name + ".";
    write_prompt_layout(w, p, pi);
    std::vector<float> emb(S * H);
    m.backend().embed_bf16(m.weights().embed, c.vocab_size, H, pi.tokens.data(), S, emb.data());
    const float* src = pi.span_embeds.data();
    for (int64_t t = 0; t < S; ++t)
      if (pi.image_span[t]) {
        std::copy(src, src + H, emb.begin() + t * H);
        src += H;
      }
    w->add_f32(pre + "inputs_embeds", {S, H}, emb.data());
  }
  return out;
}

// {"dspark": {...}} input, or nullopt-like empty input_ids when the file has no "dspark" key.
Result<std::optional<engine::DsparkScoreInput>> read_dspark_input(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found(path + ": cannot open");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("dspark"))
    return std::optional<engine::DsparkScoreInput>();
  const auto& d = j["dspark"];
  if (!d.is_object()) return invalid_argument(path + ": 'dspark' must be an object");
  engine::DsparkScoreInput r;
  auto ints = [&](const char* key, bool required, auto* dst) -> Status {
    if (!d.contains(key))
      return required ? invalid_argument(path + ": dspark." + key + " is missing") : ok_status();
    if (!d[key].is_array()) return invalid_argument(path + ": dspark." + key + " must be a list of integers");
    for (auto& v : d[key]) {
      if (!v.is_number_integer()) return invalid_argument(path + ": dspark." + key + " holds a non-integer");
      dst->push_back(v.template get<typename std::remove_pointer_t<decltype(dst)>::value_type>());
    }
    return ok_status();
  };
  DS41_RETURN_IF_ERROR(ints("input_ids", true, &r.input_ids));
  DS41_RETURN_IF_ERROR(ints("anchors", false, &r.anchors));
  if (!d.contains("prompt_len") || !d["prompt_len"].is_number_integer())
    return invalid_argument(path + ": dspark.prompt_len must be an integer");
  r.prompt_len = d["prompt_len"].get<int64_t>();
  if (d.contains("walk_steps")) {
    if (!d["walk_steps"].is_number_integer() || d["walk_steps"].get<int64_t>() < 0)
      return invalid_argument(path + ": dspark.walk_steps must be a non-negative integer");
    r.walk_steps = d["walk_steps"].get<int64_t>();
  }
  return std::optional<engine::DsparkScoreInput>(std::move(r));
}

// The DSpark arrays on the CPU reference (engine::dspark_score over the model) or, with
// --device cuda, on the GPU engine (EngineHandle::dspark_score: gpu/gpu_dspark_score.h).
Status run_score_dspark(const ScoreArgs& a, const engine::DsparkScoreInput& in) {
  if (!a.dump_dir.empty() || a.stale_keys || !a.replay.empty() || a.debug || a.chunk > 0)
    return invalid_argument(
        "a {\"dspark\": ...} input takes none of --dump, --stale-index-keys, --replay, "
        "--debug, --chunk");
  DS41_ASSIGN_OR_RETURN(const std::string device, engine_device(a.device));
  std::vector<engine::NamedArray> arrays;
  std::string producer;
  if (device == "cpu") {
    DS41_ASSIGN_OR_RETURN(const uint64_t memory_limit, parse_memory_limit(a.memory_limit));
    Result<quant::ActNumerics> act = quant::parse_act_numerics(a.device.numerics);
    if (!act.ok()) return act.status().with_context("--numerics");
    DS41_ASSIGN_OR_RETURN(LoadedModel lm,
                          load_cpu_model(a.model_dir, a.tokenizer_dir, a.threads, 4096, memory_limit, *act));
    DS41_ASSIGN_OR_RETURN(arrays, engine::dspark_score(lm.model.get(), in));
    producer = std::string("ds41 score --dspark (CPU reference, numerics ") + quant::act_numerics_name(*act) + ")";
  } else {
    EngineRequest req;
    req.model_dir = a.model_dir;
    req.tokenizer_dir = a.tokenizer_dir;
    req.model_name = "score";
    req.who = "ds41 score";
    req.max_batch_tokens = 2048;
    req.max_logit_rows = 256;  // prefill chunks of up to one window (128) with every row's logits
    req.max_sequences = 2;
    req.kv_bytes = int64_t{2} << 30;
    DS41_ASSIGN_OR_RETURN(EngineHandle eh, make_engine(a.device, req));
    if (!eh.dspark_score) return unimplemented("ds41 score: this engine has no DSpark score path");
    DS41_ASSIGN_OR_RETURN(arrays, eh.dspark_score(in));
    producer = "ds41 score --dspark (" + eh.engine->info().device + ")";
  }
  model::SafetensorsWriter w;
  w.set_metadata("producer", producer);
  for (const engine::NamedArray& arr : arrays) {
    if (!arr.i32.empty())
      w.add_i32(arr.name, arr.shape, arr.i32.data());
    else
      w.add_f32(arr.name, arr.shape, arr.f32.data());
  }
  DS41_RETURN_IF_ERROR(w.write(a.out));
  std::fprintf(stderr, "ds41 score: wrote %zu DSpark arrays to %s\n", arrays.size(),
               std::filesystem::absolute(a.out).lexically_normal().c_str());
  return ok_status();
}

Status run_score(const ScoreArgs& a) {
  DS41_RETURN_IF_ERROR(check_writable_output(a.out));
  DS41_ASSIGN_OR_RETURN(auto dspark_in, read_dspark_input(a.input));
  if (dspark_in) return run_score_dspark(a, *dspark_in);
  DS41_ASSIGN_OR_RETURN(auto input, read_input(a.input));
  std::vector<Prompt>& prompts = input.prompts;
  auto& dec = input.dec;
  int64_t replay_h = -1;
  bool replay_decoder = false;
  if (a.replay == "decoder") {
    replay_decoder = true;
  } else if (a.replay.rfind("encoder:", 0) == 0) {
    try {
      replay_h = std::stoll(a.replay.substr(8));
    } catch (...) {
      return invalid_argument("--replay encoder:H needs an integer H, got '" + a.replay + "'");
    }
    if (replay_h < 1) return invalid_argument("--replay encoder:H needs H >= 1");
  } else if (!a.replay.empty()) {
    return invalid_argument("--replay must be 'decoder' or 'encoder:H', got '" + a.replay + "'");
  }
  DS41_ASSIGN_OR_RETURN(const std::string device, engine_device(a.device));
  if (device != "cpu") return run_score_engine(a, prompts, dec, replay_decoder, replay_h, input.image_paths);
  DS41_ASSIGN_OR_RETURN(const uint64_t memory_limit, parse_memory_limit(a.memory_limit));
  Result<quant::ActNumerics> act = quant::parse_act_numerics(a.device.numerics);
  if (!act.ok()) return act.status().with_context("--numerics");
  DS41_ASSIGN_OR_RETURN(LoadedModel lm,
                        load_cpu_model(a.model_dir, a.tokenizer_dir, a.threads, 4096, memory_limit, *act));
  model::Model& m = *lm.model;
  const model::ModelConfig& c = m.config();
  const int64_t V = c.vocab_size;
  model::SafetensorsWriter w;
  w.set_metadata("producer", std::string("ds41 score (CPU reference, numerics ") + quant::act_numerics_name(*act) + ")");
  const bool vision = !input.image_paths.empty();
  std::vector<model::EncodedImage> encoded;
  if (vision) {
    DS41_ASSIGN_OR_RETURN(encoded, encode_listed_images(m, input.image_paths, a.debug, &w));
  }
  std::unique_ptr<model::SequenceState> keep_state;
  for (const Prompt& p : prompts) {
    const int64_t S = static_cast<int64_t>(p.ids.size());
    auto st = m.new_sequence();
    model::ForwardOptions opt;
    opt.logits = model::LogitsRows::kAll;
    opt.record = a.debug;
    opt.stale_index_keys = a.stale_keys;
    model::SafetensorsWriter dumpw;
    model::DumpFn dfn = dump_into(&dumpw, "debug.");  // golden debug.* names
    // With images and --debug, the Engram update's RMS per position is kept (golden
    // prompt{i}.layer{l}.engram_delta_rms), concatenated over chunks.
    std::map<std::string, std::vector<float>> delta_rms;
    model::DumpFn both = [&](const std::string& name, const std::vector<int64_t>& shape, const float* data) {
      if (!a.dump_dir.empty()) dfn(name, shape, data);
      if (vision && a.debug && name.ends_with(".engram_delta_rms"))
        delta_rms[name].insert(delta_rms[name].end(), data, data + shape[0]);
    };
    if (!a.dump_dir.empty() || (vision && a.debug)) opt.dump = &both;
    model::SequenceOutput out;
    std::vector<float> logits(S * V, std::numeric_limits<float>::quiet_NaN());
    if (!p.images.empty()) {
      if (replay_decoder || replay_h > 0)
        return invalid_argument("prompt '" + p.name + "' has images: --replay is for text prompts only");
      DS41_ASSIGN_OR_RETURN(out,
                            prefill_with_images(m, *st, p, encoded, a.chunk, opt, a.debug ? &w : nullptr));
      for (auto& [name, v] : delta_rms) w.add_f32(p.name + "." + name, {S}, v.data());
    } else if (replay_decoder) {
      DS41_ASSIGN_OR_RETURN(out, m.prefill_decoder_replay(*st, p.ids, opt));
    } else if (replay_h > 0) {
      if (replay_h >= S)
        return invalid_argument("--replay encoder:" + std::to_string(replay_h) +
                                " needs H < the length of prompt '" + p.name + "' (" + std::to_string(S) +
                                ")");
      std::span<const int32_t> ids(p.ids);
      DS41_ASSIGN_OR_RETURN(out, m.prefill(*st, ids.subspan(0, replay_h), a.chunk, opt));
      DS41_ASSIGN_OR_RETURN(auto rep, m.encoder_replay(*st, ids.subspan(0, replay_h), opt));
      (void)rep;  // replayed rows re-derive positions < H; the exact rows above are kept
      DS41_ASSIGN_OR_RETURN(auto rest, m.prefill(*st, ids.subspan(replay_h), a.chunk, opt));
      out.append(std::move(rest));
    } else {
      // A text prompt: image tokens are refused (they need an image).
      if (vision || c.has_vision) DS41_RETURN_IF_ERROR(check_text_prompt(p, c));
      DS41_ASSIGN_OR_RETURN(out, m.prefill(*st, p.ids, a.chunk, opt));
    }
    for (size_t i = 0; i < out.positions.size(); ++i)
      std::copy(out.logits.begin() + i * V, out.logits.begin() + (i + 1) * V,
                logits.begin() + out.positions[i] * V);
    w.add_f32(p.name + ".logits", {S, V}, logits.data());
    if (a.debug && !replay_decoder)
      write_records(&w, p.name, S, c, out.record,
                    [&](int64_t l) { return st->source(m.schedule().layers[l].kv_owner)->count; });
    if (!a.dump_dir.empty()) {
      std::filesystem::create_directories(a.dump_dir);
      DS41_RETURN_IF_ERROR(dumpw.write(a.dump_dir + "/" + p.name + ".safetensors"));
    }
    if (p.name == dec.first) keep_state = std::move(st);
  }
  if (!dec.second.empty()) {
    const int64_t n = static_cast<int64_t>(dec.second.size());
    std::vector<float> logits(n * V);
    model::ForwardOptions opt;
    opt.logits = model::LogitsRows::kLast;
    opt.stale_index_keys = a.stale_keys;
    for (int64_t t = 0; t < n; ++t) {
      DS41_ASSIGN_OR_RETURN(auto o, m.decode_step(*keep_state, dec.second[t], opt));
      std::copy(o.logits.begin(), o.logits.end(), logits.begin() + t * V);
    }
    w.add_f32("decode.logits", {n, V}, logits.data());
  }
  DS41_RETURN_IF_ERROR(w.write(a.out));
  std::fprintf(stderr, "ds41 score: wrote %zu prompt(s)%s to %s\n", prompts.size(),
               dec.second.empty() ? "" : " and the decode steps",
               std::filesystem::absolute(a.out).lexically_normal().c_str());
  return ok_status();
}

void setup_score(CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<ScoreArgs>();
  CLI::App* cmd = parent.add_subcommand(
      "score", "Exact CPU reference forward on token ids; writes logits (golden names)");
  cmd->add_option("--model", args->model_dir, "Model directory (config.json + safetensors)")->required();
  cmd->add_option("--tokenizer", args->tokenizer_dir,
                  "Folder with tokenizer.json (Engram compressed vocabulary)");
  cmd->add_option("--input", args->input,
                  "IN.json with prompts and decode ids, or a golden set's manifest.json")
      ->required();
  cmd->add_option("--out", args->out, "Output .safetensors")->required();
  cmd->add_option("--chunk", args->chunk, "Prefill chunk size (0 = one shot; exact for any size)");
  cmd->add_option("--replay", args->replay, "Approximate paths: decoder | encoder:H (MODEL_SPEC 4.4 / 4.5)");
  cmd->add_flag("--debug", args->debug, "Also write hash ids, top-k, candidate masks and routing");
  cmd->add_option("--dump", args->dump_dir,
                  "Write every named per-layer intermediate to DIR/NAME.safetensors");
  cmd->add_option("--threads", args->threads, "CPU threads (default 2)");
  add_engine_device_flags(cmd, &args->device);
  cmd->add_option(
      "--memory-limit", args->memory_limit,
      "Memory the model may use (e.g. 20GB, 64GiB); default MemAvailable. Checked before loading");
  cmd->add_flag("--stale-index-keys", args->stale_keys,
                "Official reference's stale index keys (MODEL_SPEC 7.21)");
  cmd->callback([args, &exit_code] {
    Status s = run_score(*args);
    if (!s.ok()) {
      std::cerr << "ds41 score: " << s.message() << "\n";
      exit_code = 1;
    }
  });
}

}  // namespace cmd_score
}  // namespace

DS41_REGISTER_COMMAND("score", ::ds41::cli::cmd_score::setup_score);

}  // namespace ds41::cli
