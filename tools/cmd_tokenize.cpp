// ds41 tokenize: text -> token ids with the model's tokenizer (MODEL_SPEC 6.1).
//   ds41 tokenize --model DIR "text"            ids and pieces (--json for one JSON object)
//   ds41 tokenize --tokenizer FILE|DIR "text"
//   ds41 tokenize --model DIR < file.txt        no text (or "-"): the text is stdin, any size
//   ds41 tokenize --model DIR --batch IN.jsonl OUT.jsonl
// Batch: each non-blank input line is {"text": "..."}; each output line is {"ids": [...]}, in
// input order (blank input lines are skipped). Lines are tokenized on --threads threads.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_registry.h"
#include "core/thread_pool.h"
#include "prompt_input.h"
#include "text/tokenizer.h"

namespace ds41::cli {
namespace {
namespace cmd_tokenize {  // one name per file: the unity build of tools/ (CMakeLists.txt)

struct TokenizeArgs {
  std::string model_dir, tokenizer_file, text;
  std::vector<std::string> batch;
  bool json = false;
  bool no_added = false;
  int threads = 2;
};

Status run_batch(const text::Tokenizer& tok, const TokenizeArgs& a) {
  std::ifstream in(a.batch[0], std::ios::binary);
  if (!in) return not_found(a.batch[0] + ": cannot open");
  std::vector<std::string> texts;
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("text") || !j["text"].is_string())
      return invalid_argument(a.batch[0] + ":" + std::to_string(lineno) +
                              ": expected a JSON object {\"text\": string}");
    texts.push_back(j["text"].get<std::string>());
  }
  std::vector<std::string> out(texts.size());
  text::EncodeOptions opts;
  opts.split_added_tokens = !a.no_added;
  ThreadPool pool(std::max(1, a.threads));
  pool.parallel_for(static_cast<int64_t>(texts.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = nlohmann::json{{"ids", tok.encode(texts[i], opts)}}.dump();
  });
  std::ofstream o(a.batch[1], std::ios::binary);
  if (!o) return io_error(a.batch[1] + ": cannot create");
  for (const auto& s : out) o << s << '\n';
  o.flush();
  if (!o) return io_error(a.batch[1] + ": write failed");
  return ok_status();
}

Status run_tokenize(const TokenizeArgs& a) {
  DS41_ASSIGN_OR_RETURN(auto tok, load_tokenizer_arg(a.model_dir, a.tokenizer_file));
  if (!a.batch.empty()) return run_batch(*tok, a);
  text::EncodeOptions opts;
  opts.split_added_tokens = !a.no_added;
  const std::vector<int32_t> ids = tok->encode(a.text, opts);
  nlohmann::json pieces = nlohmann::json::array(), texts = nlohmann::json::array();
  for (int32_t id : ids) {
    pieces.push_back(std::string(tok->piece(id)));
    texts.push_back(*tok->decode(std::vector<int32_t>{id}));  // lone partial UTF-8 shows as U+FFFD
  }
  if (a.json) {
    std::cout << nlohmann::json{{"ids", ids}, {"pieces", pieces}, {"texts", texts}}.dump() << "\n";
    return ok_status();
  }
  std::cout << "ids (" << ids.size() << "):";
  for (int32_t id : ids) std::cout << ' ' << id;
  std::cout << "\n";
  for (size_t i = 0; i < ids.size(); ++i) {
    std::cout << "  " << ids[i] << "\t" << pieces[i].dump() << "\t" << texts[i].dump()
              << (tok->is_added(ids[i]) ? "\t(added)" : "") << "\n";
  }
  return ok_status();
}

void setup_tokenize(CLI::App& parent, int& exit_code) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = parent.add_subcommand("tokenize", "Tokenize text (ids and pieces) or a JSONL batch");
  auto* model = cmd->add_option("--model", a->model_dir, "Model directory holding tokenizer.json");
  auto* file = cmd->add_option("--tokenizer", a->tokenizer_file,
                               "tokenizer.json, or a folder holding it (instead of --model)");
  model->excludes(file);
  cmd->add_option("text", a->text, "Text to tokenize (none or -: read stdin)");
  cmd->add_option("--batch", a->batch, "IN.jsonl OUT.jsonl: {\"text\"} lines -> {\"ids\"} lines")
      ->expected(2);
  cmd->add_flag("--json", a->json, "Print one JSON object {ids, pieces, texts}");
  cmd->add_flag("--no-added-tokens", a->no_added, "Treat special-token strings in the text as plain text");
  cmd->add_option("--threads", a->threads, "Threads for --batch (default 2)");
  cmd->callback([a, cmd, &exit_code] {
    if (a->model_dir.empty() && a->tokenizer_file.empty()) {
      std::cerr << "ds41 tokenize: give --model DIR or --tokenizer FILE\n";
      exit_code = 2;
      return;
    }
    const bool from_stdin = a->batch.empty() && (cmd->count("text") == 0 || a->text == "-");
    if (from_stdin && stdin_is_terminal()) {
      std::cerr << "ds41 tokenize: give the text to tokenize (or pipe it into stdin) or --batch IN.jsonl "
                   "OUT.jsonl\n";
      exit_code = 2;
      return;
    }
    if (from_stdin) {
      auto t = read_stdin_text();
      if (!t.ok()) {
        std::cerr << "ds41 tokenize: " << t.status().message() << "\n";
        exit_code = 1;
        return;
      }
      a->text = std::move(t).value();
    }
    Status s = run_tokenize(*a);
    if (!s.ok()) {
      std::cerr << "ds41 tokenize: " << s.message() << "\n";
      exit_code = 1;
    }
  });
}

}  // namespace cmd_tokenize
}  // namespace
}  // namespace ds41::cli

DS41_REGISTER_COMMAND("tokenize", ::ds41::cli::cmd_tokenize::setup_tokenize);
