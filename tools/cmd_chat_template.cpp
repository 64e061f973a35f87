// ds41 chat-template: render a conversation with the V4.1 prompt encoding (MODEL_SPEC 6.2) and
// tokenize it.
//   ds41 chat-template --model DIR [--effort E] [--chat] < conversation.json
// conversation.json: {"messages": [...], "tools": [...], "response_format": {...},
// "thinking_mode": "thinking"|"chat", "reasoning_effort": ...} or a bare message array
// (text/chat_json.h). Prints the prompt string, then a line "ids (N): ..." (--json: one object
// {prompt, ids, images}). --effort (1..100, low, high, max) and --chat override the file.
// Special-token strings inside message content are plain text unless
// --parse-special-in-content (the reference encoding's behaviour) is given.
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli_registry.h"
#include "text/chat_encoding.h"
#include "text/chat_json.h"
#include "text/tokenizer.h"

namespace ds41::cli {
namespace {

struct ChatTemplateArgs {
  std::string model_dir, tokenizer_file, effort;
  bool chat = false, thinking = false, no_bos = false, json = false, parse_special_in_content = false;
};

Status run_chat_template(const ChatTemplateArgs& a) {
  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  auto j = nlohmann::ordered_json::parse(input, nullptr, false);
  if (j.is_discarded()) return invalid_argument("stdin is not valid JSON");
  DS41_ASSIGN_OR_RETURN(text::Conversation conv, text::conversation_from_json(j));
  if (!a.effort.empty()) {
    DS41_ASSIGN_OR_RETURN(conv.options.reasoning_effort, text::parse_reasoning_effort(a.effort));
  }
  if (a.chat) conv.options.thinking = false;
  if (a.thinking) conv.options.thinking = true;
  if (a.no_bos) conv.options.add_bos = false;
  conv.options.parse_special_in_content = a.parse_special_in_content;
  DS41_ASSIGN_OR_RETURN(text::ChatPrompt prompt, text::encode_chat(conv.messages, conv.options));
  auto tok = a.tokenizer_file.empty() ? text::Tokenizer::from_model_dir(a.model_dir)
                                      : text::Tokenizer::from_file(a.tokenizer_file);
  if (!tok.ok()) return tok.status();
  const std::vector<int32_t> ids = text::chat_prompt_ids(**tok, prompt);
  if (a.json) {
    std::cout << nlohmann::json{{"prompt", prompt.text}, {"ids", ids}, {"images", prompt.images}}.dump()
              << "\n";
    return ok_status();
  }
  std::cout << prompt.text << "\n";
  std::cout << "ids (" << ids.size() << "):";
  for (int32_t id : ids) std::cout << ' ' << id;
  std::cout << "\n";
  if (!prompt.images.empty()) std::cout << "images: " << nlohmann::json(prompt.images).dump() << "\n";
  return ok_status();
}

void setup_chat_template(CLI::App& parent, int& exit_code) {
  auto a = std::make_shared<ChatTemplateArgs>();
  CLI::App* cmd =
      parent.add_subcommand("chat-template", "Render a conversation (stdin JSON) as the V4.1 prompt and ids");
  auto* model = cmd->add_option("--model", a->model_dir, "Model directory holding tokenizer.json");
  auto* file =
      cmd->add_option("--tokenizer", a->tokenizer_file, "A tokenizer.json file (instead of --model)");
  model->excludes(file);
  cmd->add_option("--effort", a->effort, "Reasoning effort: 1..100, low (50), high (75, default), max (100)");
  auto* chat = cmd->add_flag("--chat", a->chat, "Chat (non-thinking) mode");
  auto* thinking = cmd->add_flag("--thinking", a->thinking, "Thinking mode (the default)");
  chat->excludes(thinking);
  cmd->add_flag("--no-bos", a->no_bos, "Do not start with BOS (continuing a context)");
  cmd->add_flag("--json", a->json, "Print one JSON object {prompt, ids, images}");
  cmd->add_flag("--parse-special-in-content", a->parse_special_in_content,
                "Special-token strings typed inside message content become control tokens (as the "
                "reference encoding and HF tokenizers do); default: plain text");
  cmd->callback([a, &exit_code] {
    if (a->model_dir.empty() && a->tokenizer_file.empty()) {
      std::cerr << "ds41 chat-template: give --model DIR or --tokenizer FILE\n";
      exit_code = 2;
      return;
    }
    Status s = run_chat_template(*a);
    if (!s.ok()) {
      std::cerr << "ds41 chat-template: " << s.message() << "\n";
      exit_code = 1;
    }
  });
}

}  // namespace
}  // namespace ds41::cli

DS41_REGISTER_COMMAND("chat-template", ds41::cli::setup_chat_template);
