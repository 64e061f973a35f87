// ds41 generate: text generation with the exact CPU reference forward pass. Streams the decoded
// text to stdout and prints prefill / decode tokens per second to stderr at the end.
//   --chat wraps the prompt as one user turn with the V4.1 template (MODEL_SPEC 6.2); with
//   --effort the turn is in thinking mode (low|high|max|1..100), otherwise in chat mode.
//   Without --chat the prompt text is tokenized as is after a BOS (special-token strings in it
//   are tokens: the raw prompt is the caller's whole prompt). With --chat they are plain text
//   unless --parse-special-in-content.
//   --prompt-ids "0,5,17" feeds token ids directly (no tokenizer needed for the prompt).
// Sampling: greedy when --temperature is 0 (default), else softmax(logits / T) restricted to
// the smallest top-p nucleus, drawn with a seeded mt19937_64.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>

#include "cli_registry.h"
#include "core/clock.h"
#include "forward_cli_util.h"
#include "text/chat_encoding.h"
#include "text/incremental_decoder.h"
#include "text/tokenizer.h"

namespace ds41::cli {
namespace {

struct GenerateArgs {
  std::string model_dir, tokenizer_dir, prompt, prompt_ids, effort;
  bool chat = false, parse_special_in_content = false;
  int64_t max_tokens = 64;
  double temperature = 0.0, top_p = 1.0;
  uint64_t seed = 0;
  int threads = 2;
};

int32_t sample(const std::vector<float>& logits, double temperature, double top_p, std::mt19937_64& rng) {
  if (temperature <= 0)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp((logits[i] - mx) / temperature);
  std::vector<int32_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  double acc = 0;
  size_t keep = 0;
  while (keep < order.size() && (keep == 0 || acc < top_p * sum)) acc += p[order[keep++]];
  std::uniform_real_distribution<double> u(0.0, acc);
  double r = u(rng);
  for (size_t i = 0; i < keep; ++i) {
    r -= p[order[i]];
    if (r <= 0) return order[i];
  }
  return order[keep - 1];
}

Status run_generate(const GenerateArgs& a) {
  if (a.prompt.empty() == a.prompt_ids.empty())
    return invalid_argument("give exactly one of --prompt and --prompt-ids");
  if (a.top_p <= 0 || a.top_p > 1) return invalid_argument("--top-p must be in (0, 1]");
  if (a.temperature < 0) return invalid_argument("--temperature must be >= 0");
  if (a.parse_special_in_content && !a.chat)
    return invalid_argument(
        "--parse-special-in-content needs --chat (a raw --prompt always parses special tokens)");
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
  if (!a.prompt_ids.empty()) {
    std::stringstream ss(a.prompt_ids);
    std::string item;
    while (std::getline(ss, item, ',')) {
      try {
        ids.push_back(static_cast<int32_t>(std::stol(item)));
      } catch (...) {
        return invalid_argument("--prompt-ids: '" + item + "' is not an integer");
      }
    }
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
  std::mt19937_64 rng(a.seed);
  std::unique_ptr<text::IncrementalDecoder> dec;
  if (tok) dec = std::make_unique<text::IncrementalDecoder>(*tok, true);
  int64_t generated = 0;
  std::vector<float> logits = out.logits;
  for (; generated < a.max_tokens; ++generated) {
    const int32_t next = sample(logits, a.temperature, a.top_p, rng);
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
  cmd->add_option(
      "--prompt", a->prompt,
      "Prompt text (without --chat: the whole raw prompt, special-token strings in it are tokens)");
  cmd->add_option("--prompt-ids", a->prompt_ids, "Prompt as comma-separated token ids");
  cmd->add_flag("--chat", a->chat,
                "Wrap the prompt as a user turn with the V4.1 chat template (special-token strings in it are "
                "plain text)");
  cmd->add_flag(
      "--parse-special-in-content", a->parse_special_in_content,
      "With --chat: special-token strings in the prompt become control tokens (reference behaviour)");
  cmd->add_option("--effort", a->effort,
                  "Thinking mode with reasoning effort low|high|max|1..100 (with --chat)");
  cmd->add_option("--max-tokens", a->max_tokens, "Tokens to generate (default 64)");
  cmd->add_option("--temperature", a->temperature, "0 = greedy (default)");
  cmd->add_option("--top-p", a->top_p, "Nucleus mass (default 1)");
  cmd->add_option("--seed", a->seed, "Sampling seed (default 0)");
  cmd->add_option("--threads", a->threads, "CPU threads (default 2)");
  cmd->callback([a, &exit_code] {
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
