// ds41 generate: text generation with the exact CPU reference forward pass. Streams the decoded
// text to stdout and prints prefill / decode tokens per second to stderr at the end.
// The prompt is exactly one of:
//   --prompt TEXT       (--prompt - reads stdin)   --prompt-file FILE   (any size)
//   --prompt-ids "0,5,17"  token ids directly (no tokenizer needed for the prompt)
//   --messages FILE     an OpenAI messages JSON conversation (system prompt, tools, earlier
//                       turns; the format of `ds41 chat-template`, text/chat_json.h; - = stdin)
// Prompt text is tokenized as is after a BOS (special-token strings in it are tokens: the raw
// prompt is the caller's whole prompt) unless --chat / --thinking / --effort wraps it as one user
// turn with the V4.1 template (MODEL_SPEC 6.2), where special-token strings are plain text
// unless --parse-special-in-content. The mode flags mean the same as in chat-template
// (prompt_input.h: --effort and --thinking are thinking mode, --chat alone is chat mode).
// Sampling: engine/sampler.h (greedy when --temperature is 0, the default).
// Flags are validated before the model loads; a bad or contradictory flag, or a prompt input
// that cannot be read, is a usage error (exit 2) naming the flag; failures while running exit 1.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <deque>
#include <iostream>
#include <limits>
#include <optional>
#include <random>
#include <string_view>

#include "cli_registry.h"
#include "core/clock.h"
#include "core/log.h"
#include "engine/logits_processing.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "engine_factory.h"
#include "forward_cli_util.h"
#include "human_units.h"
#include "image/image_decode.h"
#include "load_progress.h"
#include "model/image_input.h"
#include "model/vision_span.h"
#include "prompt_input.h"
#include "server/stop_matcher.h"
#include "serving_engine.h"
#include "text/chat_encoding.h"
#include "text/chat_json.h"
#include "text/incremental_decoder.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace ds41::cli {
namespace {
namespace cmd_generate {  // one name per file: the unity build of tools/ (CMakeLists.txt)

// Ctrl-C during generation: the first SIGINT ends the decode loop after the current step (the
// output and the timing line are still printed, exit 130); the handler resets, so a second one
// kills the process at once.
std::atomic<bool> g_interrupted{false};

// Prompts of at least this many tokens show prefill progress (tokens, rate, ETA) on stderr;
// the prefill runs in chunks of kPrefillChunk tokens either way.
constexpr int64_t kPrefillProgressTokens = 2048;
constexpr int64_t kPrefillChunk = 1024;
extern "C" void on_sigint(int) { g_interrupted.store(true); }

void install_sigint_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  sigaction(SIGINT, &sa, nullptr);
}

struct GenerateArgs {
  std::string model_dir, tokenizer_dir, prompt, prompt_ids, prompt_file, messages_file;
  TemplateModeFlags mode;
  std::string max_tokens_text = "64";  // parsed by validate_generate_args (into max_tokens)
  bool parse_special_in_content = false, json = false, raw = false;
  std::vector<std::string> stops;    // --stop, repeatable
  bool has_seed = false;             // --seed given; else a random seed, printed
  engine::SamplingParams penalties;  // presence / frequency / repetition penalties, top_logprobs
  bool has_prompt = false, has_prompt_ids = false, has_prompt_file = false,
       has_messages = false;                       // given, even if empty
  std::optional<text::Conversation> conversation;  // --messages, read by read_generate_inputs
  int64_t max_tokens = 64;
  std::vector<int32_t> ids;  // --prompt-ids, parsed
  engine::SamplerParams sampling;
  int threads = 2;
  DeviceFlags device;             // --device, --load-format (engine_factory.h)
  std::string memory_limit_text;  // --memory-limit, parsed by validate_generate_args
  uint64_t memory_limit = 0;
  std::vector<std::string> images;  // --image FILE, repeatable (MODEL_SPEC 3.11)
  std::string speculative = "off";  // --speculative dspark|off
};

// Whole-string integer in [lo, hi] (surrounding spaces allowed); nullopt otherwise.
std::optional<int64_t> parse_int(std::string_view s, int64_t lo, int64_t hi) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi) return std::nullopt;
  return v;
}

// Usage errors (exit 2), found before the model loads. Fills a.max_tokens and a.ids.
Status validate_generate_args(GenerateArgs& a) {
  DS41_ASSIGN_OR_RETURN(a.memory_limit, parse_memory_limit(a.memory_limit_text));
  const int sources =
      int(a.has_prompt) + int(a.has_prompt_ids) + int(a.has_prompt_file) + int(a.has_messages);
  if (sources != 1)
    return invalid_argument("give exactly one of --prompt, --prompt-file, --messages and --prompt-ids");
  if (a.has_prompt && a.prompt.empty())
    return invalid_argument(
        "--prompt is empty (give some text, - for stdin, or token ids with --prompt-ids)");
  if (a.has_prompt_file && a.prompt_file.empty()) return invalid_argument("--prompt-file is empty");
  if (a.has_messages && a.messages_file.empty()) return invalid_argument("--messages is empty");
  const bool templated = a.mode.chat || a.mode.thinking || a.has_messages;
  if (a.mode.thinking && a.mode.chat)
    return invalid_argument("--chat (chat mode) and --thinking contradict each other");
  if (!a.mode.effort.empty() && !templated)
    return invalid_argument(
        "--effort selects the thinking mode of the chat template: it needs --chat, --thinking or --messages");
  if (a.parse_special_in_content && !templated)
    return invalid_argument(
        "--parse-special-in-content needs --chat (a raw --prompt always parses special tokens)");
  if (!a.images.empty() && (a.has_prompt_ids || a.has_messages))
    return invalid_argument(
        "--image goes with --prompt/--prompt-file (raw, or --chat/--thinking); --messages carries its own "
        "image "
        "parts and --prompt-ids its own spans (see `ds41 score` for token-id prompts with images)");
  if (a.mode.any() && a.has_prompt_ids)
    return invalid_argument(
        "--chat/--thinking wrap prompt text in the chat template; they cannot apply to --prompt-ids (give "
        "the "
        "template's token ids yourself, see `ds41 chat-template`)");
  if (Status m = check_template_mode(a.mode); !m.ok()) return m;
  const auto mt = parse_int(a.max_tokens_text, 1, std::numeric_limits<int32_t>::max());
  if (!mt)
    return invalid_argument("--max-tokens must be an integer in [1, 2147483647], got '" + a.max_tokens_text +
                            "'");
  a.max_tokens = *mt;
  if (a.speculative != "dspark" && a.speculative != "off")
    return invalid_argument("--speculative must be dspark or off, got '" + a.speculative + "'");
  if (a.speculative == "dspark" && (a.sampling.top_k > 0 || a.sampling.top_p < 1 || a.sampling.min_p > 0 ||
                                    a.penalties.top_logprobs >= 0 || a.penalties.repetition_penalty != 1 ||
                                    a.penalties.presence_penalty != 0 || a.penalties.frequency_penalty != 0))
    return invalid_argument(
        "--speculative dspark supports greedy decoding and --temperature only (no top-k/top-p/min-p, "
        "penalties or --logprobs); use --speculative off");
  if (a.has_prompt_ids) {
    std::string_view rest = a.prompt_ids;
    for (;;) {
      const size_t comma = rest.find(',');
      const std::string_view item = rest.substr(0, comma);
      const auto id = parse_int(item, 0, std::numeric_limits<int32_t>::max());
      if (!id)
        return invalid_argument("--prompt-ids: '" + std::string(item) +
                                "' is not a token id (comma-separated integers >= 0)");
      a.ids.push_back(static_cast<int32_t>(*id));
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  if (Status s = engine::validate_sampling_params(a.sampling); !s.ok()) {
    // The sampler names its fields (temperature, top_p, ...); the user typed flags.
    std::string m = s.message();
    for (auto [field, flag] : {std::pair{"temperature", "--temperature"},
                               {"top_p", "--top-p"},
                               {"top_k", "--top-k"},
                               {"min_p", "--min-p"}})
      if (m.rfind(field, 0) == 0) m = flag + m.substr(std::string(field).size());
    return invalid_argument(m);
  }
  if (a.threads < 1) return invalid_argument("--threads must be >= 1");
  DS41_RETURN_IF_ERROR(engine_device(a.device).status());
  for (const auto& st : a.stops)
    if (st.empty()) return invalid_argument("--stop: an empty stop string would match at once");
  if (a.penalties.presence_penalty < -2 || a.penalties.presence_penalty > 2 ||
      !(a.penalties.presence_penalty == a.penalties.presence_penalty))
    return invalid_argument("--presence-penalty must be in [-2, 2]");
  if (a.penalties.frequency_penalty < -2 || a.penalties.frequency_penalty > 2 ||
      !(a.penalties.frequency_penalty == a.penalties.frequency_penalty))
    return invalid_argument("--frequency-penalty must be in [-2, 2]");
  if (!(a.penalties.repetition_penalty > 0) || a.penalties.repetition_penalty > 1e6)
    return invalid_argument("--repetition-penalty must be > 0 (1 = off)");
  if (a.penalties.top_logprobs < -1 || a.penalties.top_logprobs > engine::kMaxTopLogprobs)
    return invalid_argument("--logprobs must be in [0, " + std::to_string(engine::kMaxTopLogprobs) + "]");
  if (a.penalties.top_logprobs >= 0 && !a.json)
    return invalid_argument("--logprobs is reported in the --json output: add --json");
  if (a.json && a.raw)
    return invalid_argument("--json and --raw contradict each other (--json has separate fields)");
  return ok_status();
}

// Reads --prompt -, --prompt-file and --messages before the model loads (usage errors: exit 2).
Status read_generate_inputs(GenerateArgs& a) {
  if (a.has_prompt && a.prompt == "-") {
    if (stdin_is_terminal())
      return invalid_argument("--prompt - reads the prompt from stdin, but stdin is a terminal (pipe it in)");
    DS41_ASSIGN_OR_RETURN(a.prompt, read_stdin_text());
    if (a.prompt.empty()) return invalid_argument("--prompt -: stdin is empty");
  }
  if (a.has_prompt_file) {
    auto t = read_text_input(a.prompt_file);
    if (!t.ok()) return t.status().with_context("--prompt-file");
    a.prompt = std::move(t).value();
    if (a.prompt.empty()) return invalid_argument("--prompt-file " + a.prompt_file + ": the file is empty");
  }
  if (a.has_messages) {
    auto t = read_text_input(a.messages_file);
    if (!t.ok()) return t.status().with_context("--messages");
    auto j = nlohmann::ordered_json::parse(*t, nullptr, false);
    if (j.is_discarded()) return invalid_argument("--messages " + a.messages_file + ": not valid JSON");
    auto conv = text::conversation_from_json(j);
    if (!conv.ok()) return conv.status().with_context("--messages " + a.messages_file);
    a.conversation = std::move(conv).value();
  }
  return ok_status();
}

// --image: decodes the files, runs the engine's tower once over all of them (the CPU reference's
// or the GPU engine's, Engine::encode_images), and replaces the k-th placeholder of `ids` (the
// tokenizer's <｜deepseek_image｜>) by the k-th image's span.
Result<model::ImagePromptInput> expand_image_placeholders(engine::Engine& eng, const model::ModelConfig& c,
                                                          const std::vector<std::string>& files,
                                                          int32_t placeholder,
                                                          const std::vector<int32_t>& ids) {
  if (!c.has_vision || !eng.info().has_vision)
    return failed_precondition("--image: this model has no vision tower (no vision_config)");
  std::vector<image::PreparedImage> prepared;
  for (const std::string& f : files) {
    DS41_ASSIGN_OR_RETURN(auto d, image::decode_image_file(f));
    auto p = image::prepare_image(d.rgb, model::vision_plan_config(c));
    if (!p.ok()) return p.status().with_context(f);
    prepared.push_back(std::move(p).value());
  }
  std::vector<const image::PreparedImage*> ptrs;
  for (const image::PreparedImage& p : prepared) ptrs.push_back(&p);
  DS41_ASSIGN_OR_RETURN(std::vector<std::vector<float>> spans, eng.encode_images(ptrs));
  std::vector<int32_t> with_runs;
  size_t k = 0;
  for (int32_t t : ids) {
    if (t != placeholder) {
      if (t == static_cast<int32_t>(c.image_token_id))
        return invalid_argument("the prompt text holds the image token; pass images with --image");
      with_runs.push_back(t);
      continue;
    }
    if (k >= prepared.size()) return invalid_argument("more image placeholders than --image files");
    with_runs.insert(with_runs.end(), static_cast<size_t>(prepared[k].plan.n_tokens),
                     static_cast<int32_t>(c.image_token_id));
    ++k;
  }
  if (k != prepared.size()) return invalid_argument("fewer image placeholders than --image files");
  return model::place_image_spans(with_runs, static_cast<int32_t>(c.image_token_id), spans, c.hidden_size);
}

// Precondition: validate_generate_args(a) and read_generate_inputs(a) returned ok.
Status run_generate(const GenerateArgs& a) {
  // The memory check before loading counts KV for the requested context: an upper bound of the
  // prompt (one token per byte of text at most, or the given ids; a conversation file's messages
  // are bounded by their text the same way) plus --max-tokens.
  int64_t context = a.max_tokens + static_cast<int64_t>(a.prompt.size() + a.ids.size()) + 64;
  if (a.conversation)
    for (const auto& msg : a.conversation->messages) context += static_cast<int64_t>(msg.content.size()) + 16;
  EngineRequest req;
  req.model_dir = a.model_dir;
  req.tokenizer_dir = a.tokenizer_dir;
  req.model_name = model_name_from_dir(a.model_dir);
  req.who = "ds41 generate";
  req.threads = a.threads;
  req.context_tokens = context;
  // The GPU engine sizes its workspace from the context: this run's bound (capped by the config).
  if (device_name(a.device) == "cuda") req.max_context = context;
  req.memory_limit = a.memory_limit;
  req.max_batch_tokens = kPrefillChunk;
  req.max_sequences = 1;
  req.kv_bytes = int64_t{1} << 30;
  req.quiet = device_name(a.device) == "cpu";  // the CPU path loads silently, as before
  // The CPU reference or the GPU engine, through the one engine interface (engine/engine.h).
  DS41_ASSIGN_OR_RETURN(EngineHandle eh, make_engine(a.device, req));
  engine::Engine& eng = *eh.engine;
  const model::ModelConfig& cfg = eh.config;
  std::unique_ptr<text::Tokenizer> tok;
  {
    auto t = load_tokenizer_arg(a.model_dir, a.tokenizer_dir);
    if (t.ok())
      tok = std::move(t).value();
    else if (!a.has_prompt_ids)
      return t.status().with_context("tokenizer (needed for prompt text)");
  }
  std::vector<int32_t> ids;
  bool thinking = false;  // the completion starts with reasoning (thinking mode of the template)
  if (a.has_prompt_ids) {
    ids = a.ids;
  } else if (a.conversation) {
    text::ChatOptions co = a.conversation->options;
    co.parse_special_in_content = a.parse_special_in_content;
    DS41_RETURN_IF_ERROR(apply_template_mode(a.mode, &co));
    thinking = co.thinking;
    DS41_ASSIGN_OR_RETURN(text::ChatPrompt cp, text::encode_chat(a.conversation->messages, co));
    ids = text::chat_prompt_ids(*tok, cp);
  } else if (a.mode.chat || a.mode.thinking) {
    text::ChatOptions co;
    co.thinking = false;  // --chat alone: chat mode
    co.parse_special_in_content = a.parse_special_in_content;
    DS41_RETURN_IF_ERROR(apply_template_mode(a.mode, &co));
    thinking = co.thinking;
    text::ChatMessage msg;
    msg.role = text::ChatRole::kUser;
    msg.content = a.prompt;
    if (!a.images.empty()) {  // the images first, then the text, in one user message
      msg.parts.emplace();
      for (const std::string& f : a.images) {
        text::ContentPart ip;
        ip.type = text::ContentPart::Type::kImage;
        ip.image_source = f;
        msg.parts->push_back(ip);
      }
      text::ContentPart tp;
      tp.text = a.prompt;
      msg.parts->push_back(tp);
    }
    DS41_ASSIGN_OR_RETURN(text::ChatPrompt cp, text::encode_chat({msg}, co));
    ids = text::chat_prompt_ids(*tok, cp);
  } else {
    ids.push_back(static_cast<int32_t>(cfg.bos_token_id));
    // Raw prompt with images: BOS, one placeholder per image, then the text.
    const int32_t ph = tok->token_to_id(text::kImageToken).value_or(static_cast<int32_t>(cfg.image_token_id));
    for (size_t k = 0; k < a.images.size(); ++k) ids.push_back(ph);
    tok->encode_append(a.prompt, &ids);
  }
  // Images (MODEL_SPEC 3.11): each placeholder becomes the image's span of image_token_id.
  std::vector<uint8_t> span_flags;
  std::vector<float> span_embeds;
  if (!a.images.empty()) {
    const int32_t ph = tok->token_to_id(text::kImageToken).value_or(static_cast<int32_t>(cfg.image_token_id));
    DS41_ASSIGN_OR_RETURN(auto expanded, expand_image_placeholders(eng, cfg, a.images, ph, ids));
    ids = std::move(expanded.tokens);
    span_flags = std::move(expanded.image_span);
    span_embeds = std::move(expanded.span_embeds);
  }
  if (ids.empty()) return invalid_argument("empty prompt");
  // The whole sequence must fit the model's context: say so before computing anything.
  const int64_t ctx = eng.info().max_context;
  if (static_cast<int64_t>(ids.size()) + a.max_tokens > ctx)
    return invalid_argument("the prompt has " + std::to_string(ids.size()) + " tokens and --max-tokens is " +
                            std::to_string(a.max_tokens) + ": together more than the model's context of " +
                            std::to_string(ctx) + " positions");
  // DSpark speculative decoding (MODEL_SPEC 3.10), when asked for: greedy output is the same token
  // for token. Off by default: the CPU reference computes every verified row, so a step costs about
  // B + 1 decode rows plus the draft and only pays off on a memory-bound (GPU) engine. Enabled
  // before the sequence exists, so that its prefill captures the draft context.
  const bool spec = a.speculative == "dspark";
  if (spec) DS41_RETURN_IF_ERROR(eng.enable_speculative().with_context("--speculative dspark"));
  engine::AcceptanceStats spec_stats;
  std::deque<int32_t> spec_pending;  // committed tokens of the last speculative step, not yet emitted
  SystemClock clock;
  DS41_ASSIGN_OR_RETURN(const engine::SeqId seq, eng.create_sequence());
  const int64_t t0 = clock.now_mono_ns();
  // Long prompts are prefilled in chunks (exact: chunked prefill gives the same bits as one shot,
  // MODEL_SPEC 4.2) so that progress can be shown and Ctrl-C stops between chunks.
  engine::StepOutput out;
  {
    const int64_t n = static_cast<int64_t>(ids.size());
    const bool show = n >= kPrefillProgressTokens;
    LoadProgress progress(stderr, LoadProgress::mode_for(stderr, !show || log_level() >= LogLevel::kError),
                          "ds41 generate: prefill", std::string("tokens"));
    for (int64_t b = 0; b < n; b += kPrefillChunk) {
      if (g_interrupted.load()) return failed_precondition("interrupted (Ctrl-C) during the prefill");
      const int64_t e = std::min(n, b + kPrefillChunk);
      engine::StepItem it{seq, std::span<const int32_t>(ids).subspan(b, e - b), e == n};
      if (!span_flags.empty()) {  // this chunk's flags and span rows
        const int64_t H = cfg.hidden_size;
        int64_t before = 0, inside = 0;
        for (int64_t t = 0; t < e; ++t) (t < b ? before : inside) += span_flags[t];
        it.image_span = std::span<const uint8_t>(span_flags).subspan(b, e - b);
        it.span_embeds = std::span<const float>(span_embeds).subspan(before * H, inside * H);
      }
      DS41_RETURN_IF_ERROR(eng.step(std::span<const engine::StepItem>(&it, 1), &out));
      progress.update(static_cast<uint64_t>(e), static_cast<uint64_t>(n));
    }
  }
  const int64_t t1 = clock.now_mono_ns();
  engine::SamplerParams sp = a.sampling;
  if (!a.has_seed) sp.seed = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  std::cerr << "seed: " << sp.seed << (a.has_seed ? "" : " (random; --seed reproduces it)") << "\n";
  DS41_ASSIGN_OR_RETURN(engine::Sampler sampler, engine::Sampler::create(sp));
  const int64_t vocab = static_cast<int64_t>(out.logits.size());
  engine::PenaltyState penalties(a.penalties, ids, vocab);
  nlohmann::json logprobs = nlohmann::json::array();
  // Output: the decoded completion (special tokens kept) feeds the output parser; the terminal
  // shows it without special tokens (unless --raw), thinking under its own header (dimmed on a
  // terminal), the answer under another; --stop strings end it.
  std::unique_ptr<text::IncrementalDecoder> dec;
  if (tok) dec = std::make_unique<text::IncrementalDecoder>(*tok);
  const std::optional<int32_t> think_end = tok ? tok->token_to_id("</think>") : std::nullopt;
  const bool tty = isatty(STDOUT_FILENO) != 0;
  const bool show = !a.json;
  const bool headers = show && !a.raw && thinking;
  server::StopMatcher stop(a.stops);
  std::string full;  // the completion as the parser reads it (special tokens kept), up to a stop
  std::vector<int32_t> out_ids;
  auto emit = [&](const std::string& t) {
    full += t;
    if (show) std::cout << t << std::flush;
  };
  if (headers) std::cout << "--- thinking ---\n" << (tty ? "\033[2m" : "") << std::flush;
  bool in_thinking = thinking;
  auto end_thinking = [&] {
    if (!in_thinking) return;
    in_thinking = false;
    if (headers) std::cout << (tty ? "\033[0m" : "") << "\n--- answer ---\n" << std::flush;
  };
  std::string finish = "length";
  int64_t generated = 0;
  std::vector<float> logits = out.logits;
  for (; generated < a.max_tokens; ++generated) {
    if (g_interrupted.load()) {
      finish = "interrupted";
      break;
    }
    int32_t next = -1;
    if (!spec_pending.empty()) {  // committed by the last speculative step
      next = spec_pending.front();
      spec_pending.pop_front();
    } else {
      if (penalties.active()) penalties.apply(logits.data(), vocab);
      DS41_ASSIGN_OR_RETURN(next, sampler.sample(logits));
    }
    if (a.penalties.top_logprobs >= 0) {
      std::vector<engine::TopLogprob> top;
      const float lp = engine::token_logprob(logits.data(), vocab, next, a.penalties.top_logprobs, &top);
      nlohmann::json tj = nlohmann::json::array();
      for (const auto& t : top) tj.push_back({{"id", t.token}, {"logprob", t.logprob}});
      logprobs.push_back({{"id", next}, {"logprob", lp}, {"top_logprobs", tj}});
    }
    penalties.add(next);
    if (next == cfg.eos_token_id) {
      finish = "stop";
      break;
    }
    out_ids.push_back(next);
    if (dec && tok->valid_id(next)) {
      DS41_ASSIGN_OR_RETURN(std::string piece, dec->push(next));
      if (tok->is_added(next)) {
        emit(stop.flush());  // a stop string does not span a special token
        full += piece;
        if (a.raw) std::cout << piece << std::flush;
        if (think_end && next == *think_end) end_thinking();
      } else if (think_end && next == *think_end && in_thinking) {
        // `</think>` is an ordinary vocabulary token: it ends the thinking section.
        emit(stop.flush());
        full += piece;
        if (a.raw) std::cout << piece << std::flush;
        end_thinking();
      } else {
        emit(stop.push(piece));
        if (stop.matched()) {
          finish = "stop";
          ++generated;
          break;
        }
      }
    } else if (show) {
      std::cout << "[" << next << "]" << std::flush;
    }
    if (generated + 1 == a.max_tokens || *eng.sequence_position(seq) >= ctx) {
      ++generated;
      break;
    }
    if (spec) {
      // `next` was already run through the target unless it is the last step's bonus token (or
      // the first token): then one speculative step runs it and commits what follows.
      if (spec_pending.empty()) {
        if (*eng.sequence_position(seq) + eng.speculative_block() + 1 > ctx) {
          ++generated;
          break;
        }
        engine::SpecStepItem si;
        si.seq = seq;
        si.anchor = next;
        si.temperature = sp.temperature;
        si.seed = sp.seed;
        std::vector<engine::SpecStepResult> res;
        DS41_RETURN_IF_ERROR(eng.speculative_step(std::span<const engine::SpecStepItem>(&si, 1),
                                                  engine::SpecBatchOptions{}, &res));
        spec_stats.add(res[0].accepted, eng.speculative_block());
        spec_pending.assign(res[0].tokens.begin(), res[0].tokens.end());
      }
      continue;
    }
    engine::StepItem it{seq, std::span<const int32_t>(&next, 1), true};
    DS41_RETURN_IF_ERROR(eng.step(std::span<const engine::StepItem>(&it, 1), &out));
    logits = std::move(out.logits);
  }
  if (dec && !stop.matched()) emit(stop.push(dec->flush()) + stop.flush());
  if (headers && in_thinking && tty) std::cout << "\033[0m";
  if (show) std::cout << "\n";
  const int64_t t2 = clock.now_mono_ns();
  const double pre_s = (t1 - t0) * 1e-9, dec_s = (t2 - t1) * 1e-9;
  if (a.json) {
    const text::ParsedOutput po = text::parse_assistant_output(full, thinking);
    nlohmann::json calls = nlohmann::json::array();
    for (const auto& c : po.tool_calls)
      calls.push_back({{"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    nlohmann::json j = {{"reasoning_content", po.reasoning_content},
                        {"content", po.content},
                        {"tool_calls", calls},
                        {"finish_reason", po.tool_calls.empty() ? finish : std::string("tool_calls")},
                        {"prompt_tokens", ids.size()},
                        {"completion_tokens", generated},
                        {"token_ids", out_ids},
                        {"timing",
                         {{"prefill_s", pre_s},
                          {"decode_s", dec_s},
                          {"prefill_tokens_per_s", ids.size() / std::max(pre_s, 1e-9)},
                          {"decode_tokens_per_s", generated / std::max(dec_s, 1e-9)}}}};
    j["seed"] = sp.seed;
    if (spec)
      j["speculative"] = {{"method", "dspark"},
                          {"steps", spec_stats.steps},
                          {"accepted_histogram", spec_stats.counts},
                          {"mean_accepted", spec_stats.mean_accepted()},
                          {"tokens_per_step", spec_stats.tokens_per_step()}};
    if (a.penalties.top_logprobs >= 0) j["logprobs"] = logprobs;
    if (thinking) j["reasoning_complete"] = po.reasoning_complete;
    if (stop.matched()) j["stop"] = stop.matched_stop();
    // A stop string may end inside a UTF-8 sequence: replace, never throw.
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  if (finish == "interrupted") std::cerr << "interrupted (Ctrl-C)\n";
  std::cerr << "prefill: " << ids.size() << " tokens in " << human_duration(pre_s) << " ("
            << human_rate(ids.size() / std::max(pre_s, 1e-9)) << " tok/s); decode: " << generated
            << " tokens in " << human_duration(dec_s) << " (" << human_rate(generated / std::max(dec_s, 1e-9))
            << " tok/s)\n";
  if (spec && spec_stats.steps > 0) {
    std::string hist;
    for (size_t i = 0; i < spec_stats.counts.size(); ++i)
      hist += (i ? " " : "") + std::to_string(spec_stats.counts[i]);
    std::cerr << "speculative (dspark): " << spec_stats.steps << " steps, accepted histogram [" << hist
              << "], mean accepted " << spec_stats.mean_accepted() << ", " << spec_stats.tokens_per_step()
              << " tokens/step\n";
  }
  return ok_status();
}

void setup_generate(CLI::App& parent, int& exit_code) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = parent.add_subcommand("generate", "Generate text with the CPU reference forward pass");
  cmd->add_option("--model", a->model_dir, "Model directory")->required();
  cmd->add_option("--tokenizer", a->tokenizer_dir,
                  "tokenizer.json, or a folder holding it (default: the model directory)");
  cmd->add_option(
      "--image", a->images,
      "Image file (PNG, JPEG, WebP, GIF first frame), repeatable: before the prompt text (in the user "
      "message with --chat/--thinking); needs a model with vision_config");
  CLI::Option* prompt = cmd->add_option("--prompt", a->prompt,
                                        "Prompt text, - = stdin (without --chat: the whole raw prompt, "
                                        "special-token strings in it are tokens)");
  CLI::Option* prompt_file = cmd->add_option("--prompt-file", a->prompt_file,
                                             "Read the prompt text from FILE (any size; - = stdin)");
  CLI::Option* messages = cmd->add_option(
      "--messages", a->messages_file,
      "Conversation JSON file (- = stdin): {\"messages\": [{\"role\": system|user|assistant|tool, "
      "\"content\", \"reasoning_content\", \"tool_calls\", \"tool_call_id\"}...], \"tools\": [...], "
      "\"thinking_mode\": \"thinking\"|\"chat\", \"reasoning_effort\"} or a bare messages array (OpenAI "
      "format, as chat-template)");
  CLI::Option* prompt_ids =
      cmd->add_option("--prompt-ids", a->prompt_ids, "Prompt as comma-separated token ids");
  cmd->add_flag("--chat", a->mode.chat,
                "Chat template in chat (non-thinking) mode: wraps the prompt as a user turn (special-token "
                "strings in it are plain text)");
  cmd->add_flag("--thinking", a->mode.thinking,
                "Chat template in thinking mode (effort high unless --effort)");
  cmd->add_flag(
      "--parse-special-in-content", a->parse_special_in_content,
      "With --chat: special-token strings in the prompt become control tokens (reference behaviour)");
  cmd->add_option("--effort", a->mode.effort,
                  "Thinking mode with reasoning effort low|high|max|1..100 (wins over --chat)");
  cmd->add_option("--max-tokens", a->max_tokens_text, "Tokens to generate, >= 1 (default 64)");
  cmd->add_option("--temperature", a->sampling.temperature, "0 = greedy (default)");
  cmd->add_option("--top-p", a->sampling.top_p, "Nucleus mass in (0, 1] (default 1)");
  cmd->add_option("--top-k", a->sampling.top_k, "Keep the k most likely tokens (default 0 = off)");
  cmd->add_option("--min-p", a->sampling.min_p,
                  "Drop tokens below this fraction of the most likely one's probability (default 0 = off)");
  CLI::Option* seed =
      cmd->add_option("--seed", a->sampling.seed, "Sampling seed (default: random, printed to stderr)");
  cmd->add_option("--repetition-penalty", a->penalties.repetition_penalty,
                  "> 0, divides the logits of prompt and generated tokens (default 1 = off)");
  cmd->add_option("--presence-penalty", a->penalties.presence_penalty,
                  "[-2, 2], subtracted once from each generated token's logit (default 0)");
  cmd->add_option("--frequency-penalty", a->penalties.frequency_penalty,
                  "[-2, 2], subtracted per occurrence of each generated token (default 0)");
  cmd->add_option("--logprobs", a->penalties.top_logprobs,
                  "With --json: each token's log-probability and the top N (0..20)");
  cmd->add_option("--threads", a->threads, "CPU threads (default 2)");
  add_engine_device_flags(cmd, &a->device, /*seed_flag=*/false);  // --seed is the sampling seed
  cmd->add_option("--speculative", a->speculative,
                  "DSpark speculative decoding: dspark | off (default off: on the CPU reference a step "
                  "costs ~6 decode rows plus the draft; greedy output is the same either way)");
  cmd->add_option(
      "--memory-limit", a->memory_limit_text,
      "Memory the model may use (e.g. 20GB, 64GiB); default MemAvailable. Checked before loading");
  cmd->add_option("--stop", a->stops, "Stop when the output contains this string (repeatable; not printed)");
  cmd->add_flag("--json", a->json,
                "Print one JSON object: reasoning_content, content, tool_calls (DSML parsed), finish_reason, "
                "token_ids, prompt_tokens, completion_tokens, timing");
  cmd->add_flag("--raw", a->raw,
                "Print the model text verbatim: special tokens shown, no thinking/answer headers");
  cmd->callback([a, prompt, prompt_ids, prompt_file, messages, seed, &exit_code] {
    a->has_seed = seed->count() > 0;
    a->has_prompt = prompt->count() > 0;
    a->has_prompt_ids = prompt_ids->count() > 0;
    a->has_prompt_file = prompt_file->count() > 0;
    a->has_messages = messages->count() > 0;
    Status u = validate_generate_args(*a);
    if (u.ok()) u = read_generate_inputs(*a);
    if (!u.ok()) {
      std::cerr << "ds41 generate: " << u.message() << "\n";
      exit_code = 2;
      return;
    }
    install_sigint_handler();
    Status s = run_generate(*a);
    if (!s.ok()) std::cerr << "ds41 generate: " << s.message() << "\n";
    // Ctrl-C (during the prefill or the decode) exits 130 like a shell-interrupted command.
    exit_code = g_interrupted.load() ? 130 : s.ok() ? exit_code : 1;
  });
}

}  // namespace cmd_generate
}  // namespace

DS41_REGISTER_COMMAND("generate", ::ds41::cli::cmd_generate::setup_generate);

}  // namespace ds41::cli
