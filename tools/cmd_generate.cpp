// ds41 generate: text generation with the exact CPU reference forward pass. Streams the decoded
// text to stdout and prints prefill / decode tokens per second to stderr at the end.
//   --chat wraps the prompt as one user turn with the V4.1 template (MODEL_SPEC 6.2); with
//   --effort the turn is in thinking mode (low|high|max|1..100), otherwise in chat mode.
//   Without --chat the prompt text is tokenized as is after a BOS (special-token strings in it
//   are tokens: the raw prompt is the caller's whole prompt). With --chat they are plain text
//   unless --parse-special-in-content.
//   --prompt-ids "0,5,17" feeds token ids directly (no tokenizer needed for the prompt).
// Sampling: engine/sampler.h (greedy when --temperature is 0, the default).
// Flags are validated before the model loads; a bad or contradictory flag is a usage error
// (exit 2) naming the flag; failures while running exit 1.
#include <algorithm>
#include <charconv>
#include <iostream>
#include <limits>
#include <optional>
#include <string_view>

#include "cli_registry.h"
#include "core/clock.h"
#include "engine/sampler.h"
#include "forward_cli_util.h"
#include "text/chat_encoding.h"
#include "text/incremental_decoder.h"
#include "text/tokenizer.h"

namespace ds41::cli {
namespace {

struct GenerateArgs {
  std::string model_dir, tokenizer_dir, prompt, prompt_ids, effort;
  std::string max_tokens_text = "64";  // parsed by validate_generate_args (into max_tokens)
  bool chat = false, parse_special_in_content = false, has_prompt = false, has_prompt_ids = false;  // given, even if empty
  int64_t max_tokens = 64;
  std::vector<int32_t> ids;  // --prompt-ids, parsed
  engine::SamplerParams sampling;
  int threads = 2;
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
  if (a.has_prompt == a.has_prompt_ids)
    return invalid_argument("give exactly one of --prompt and --prompt-ids");
  if (a.has_prompt && a.prompt.empty())
    return invalid_argument("--prompt is empty (give some text, or token ids with --prompt-ids)");
  if (!a.effort.empty() && !a.chat)
    return invalid_argument("--effort selects the thinking mode of the chat template: it needs --chat");
  if (a.parse_special_in_content && !a.chat)
    return invalid_argument(
        "--parse-special-in-content needs --chat (a raw --prompt always parses special tokens)");
  if (a.chat && a.has_prompt_ids)
    return invalid_argument(
        "--chat wraps --prompt text in the chat template; it cannot apply to --prompt-ids (give the "
        "template's token ids yourself, see `ds41 chat-template`)");
  if (!a.effort.empty()) {
    auto e = text::parse_reasoning_effort(a.effort);
    if (!e.ok()) return e.status().with_context("--effort");
  }
  const auto mt = parse_int(a.max_tokens_text, 1, std::numeric_limits<int32_t>::max());
  if (!mt)
    return invalid_argument("--max-tokens must be an integer in [1, 2147483647], got '" + a.max_tokens_text +
                            "'");
  a.max_tokens = *mt;
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
  return ok_status();
}

// Precondition: validate_generate_args(a) returned ok.
Status run_generate(const GenerateArgs& a) {
  const std::string tok_dir = a.tokenizer_dir.empty() ? a.model_dir : a.tokenizer_dir;
  DS41_ASSIGN_OR_RETURN(LoadedModel lm, load_cpu_model(a.model_dir, a.tokenizer_dir, a.threads));
  model::Model& m = *lm.model;
  std::unique_ptr<text::Tokenizer> tok;
  {
    auto t = text::Tokenizer::from_model_dir(tok_dir);
    if (t.ok())
      tok = std::move(t).value();
    else if (!a.prompt.empty())
      return t.status().with_context("tokenizer (needed for --prompt)");
  }
  std::vector<int32_t> ids;
  if (a.has_prompt_ids) {
    ids = a.ids;
  } else if (a.chat) {
    text::ChatOptions co;
    co.thinking = !a.effort.empty();
    co.parse_special_in_content = a.parse_special_in_content;
    if (co.thinking) {
      DS41_ASSIGN_OR_RETURN(co.reasoning_effort, text::parse_reasoning_effort(a.effort));
    }
    text::ChatMessage msg;
    msg.role = text::ChatRole::kUser;
    msg.content = a.prompt;
    DS41_ASSIGN_OR_RETURN(text::ChatPrompt cp, text::encode_chat({msg}, co));
    ids = text::chat_prompt_ids(*tok, cp);
  } else {
    ids.push_back(static_cast<int32_t>(m.config().bos_token_id));
    tok->encode_append(a.prompt, &ids);
  }
  if (ids.empty()) return invalid_argument("empty prompt");
  SystemClock clock;
  auto st = m.new_sequence();
  model::ForwardOptions opt;
  const int64_t t0 = clock.now_mono_ns();
  DS41_ASSIGN_OR_RETURN(auto out, m.prefill(*st, ids, 0, opt));
  const int64_t t1 = clock.now_mono_ns();
  DS41_ASSIGN_OR_RETURN(engine::Sampler sampler, engine::Sampler::create(a.sampling));
  std::unique_ptr<text::IncrementalDecoder> dec;
  if (tok) dec = std::make_unique<text::IncrementalDecoder>(*tok, true);
  int64_t generated = 0;
  std::vector<float> logits = out.logits;
  for (; generated < a.max_tokens; ++generated) {
    DS41_ASSIGN_OR_RETURN(const int32_t next, sampler.sample(logits));
    if (next == m.config().eos_token_id) break;
    if (dec && tok->valid_id(next)) {
      DS41_ASSIGN_OR_RETURN(std::string piece, dec->push(next));
      std::cout << piece << std::flush;
    } else {
      std::cout << "[" << next << "]" << std::flush;
    }
    if (generated + 1 == a.max_tokens || st->position() >= m.config().max_position_embeddings) {
      ++generated;
      break;
    }
    DS41_ASSIGN_OR_RETURN(auto o, m.decode_step(*st, next, opt));
    logits = std::move(o.logits);
  }
  if (dec) std::cout << dec->flush();
  std::cout << "\n";
  const int64_t t2 = clock.now_mono_ns();
  const double pre_s = (t1 - t0) * 1e-9, dec_s = (t2 - t1) * 1e-9;
  std::cerr << "prefill: " << ids.size() << " tokens in " << pre_s << " s ("
            << ids.size() / std::max(pre_s, 1e-9) << " tok/s); decode: " << generated << " tokens in "
            << dec_s << " s (" << generated / std::max(dec_s, 1e-9) << " tok/s)\n";
  return ok_status();
}

void setup_generate(CLI::App& parent, int& exit_code) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = parent.add_subcommand("generate", "Generate text with the CPU reference forward pass");
  cmd->add_option("--model", a->model_dir, "Model directory")->required();
  cmd->add_option("--tokenizer", a->tokenizer_dir,
                  "Folder with tokenizer.json (default: the model directory)");
  CLI::Option* prompt = cmd->add_option(
      "--prompt", a->prompt,
      "Prompt text (without --chat: the whole raw prompt, special-token strings in it are tokens)");
  CLI::Option* prompt_ids =
      cmd->add_option("--prompt-ids", a->prompt_ids, "Prompt as comma-separated token ids");
  cmd->add_flag("--chat", a->chat,
                "Wrap the prompt as a user turn with the V4.1 chat template (special-token strings in it are "
                "plain text)");
  cmd->add_flag(
      "--parse-special-in-content", a->parse_special_in_content,
      "With --chat: special-token strings in the prompt become control tokens (reference behaviour)");
  cmd->add_option("--effort", a->effort,
                  "Thinking mode with reasoning effort low|high|max|1..100 (with --chat)");
  cmd->add_option("--max-tokens", a->max_tokens_text, "Tokens to generate, >= 1 (default 64)");
  cmd->add_option("--temperature", a->sampling.temperature, "0 = greedy (default)");
  cmd->add_option("--top-p", a->sampling.top_p, "Nucleus mass in (0, 1] (default 1)");
  cmd->add_option("--top-k", a->sampling.top_k, "Keep the k most likely tokens (default 0 = off)");
  cmd->add_option("--min-p", a->sampling.min_p,
                  "Drop tokens below this fraction of the most likely one's probability (default 0 = off)");
  cmd->add_option("--seed", a->sampling.seed, "Sampling seed (default 0)");
  cmd->add_option("--threads", a->threads, "CPU threads (default 2)");
  cmd->callback([a, prompt, prompt_ids, &exit_code] {
    a->has_prompt = prompt->count() > 0;
    a->has_prompt_ids = prompt_ids->count() > 0;
    if (Status u = validate_generate_args(*a); !u.ok()) {
      std::cerr << "ds41 generate: " << u.message() << "\n";
      exit_code = 2;
      return;
    }
    Status s = run_generate(*a);
    if (!s.ok()) {
      std::cerr << "ds41 generate: " << s.message() << "\n";
      exit_code = 1;
    }
  });
}

}  // namespace

DS41_REGISTER_COMMAND("generate", setup_generate);

}  // namespace ds41::cli
