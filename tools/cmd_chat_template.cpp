// ds41 chat-template: render a conversation with the V4.1 prompt encoding (MODEL_SPEC 6.2) and
// tokenize it.
//   ds41 chat-template --model DIR [--effort E] [--chat|--thinking] [--messages FILE] < conversation.json
// conversation.json (from --messages FILE, else stdin): {"messages": [...], "tools": [...],
// "response_format": {...}, "thinking_mode": "thinking"|"chat", "reasoning_effort": ...} or a
// bare message array (text/chat_json.h); `generate --messages` reads the same format. Prints the
// prompt string, then a line "ids (N): ..." (--json: one object {prompt, ids, images}).
// --effort (1..100, low, high, max; thinking mode), --thinking and --chat override the file, with
// the same meaning as in generate (prompt_input.h).
// Special-token strings inside message content are plain text unless
// --parse-special-in-content (the reference encoding's behaviour) is given.
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli_registry.h"
#include "prompt_input.h"
#include "text/chat_encoding.h"
#include "text/chat_json.h"
#include "text/tokenizer.h"

namespace ds41::cli {
namespace {
namespace cmd_chat_template {  // one name per file: the unity build of tools/ (CMakeLists.txt)

struct ChatTemplateArgs {
  std::string model_dir, tokenizer_file, messages_file = "-";
  TemplateModeFlags mode;
  bool no_bos = false, json = false, parse_special_in_content = false;
};

Status run_chat_template(const ChatTemplateArgs& a) {
  const std::string where = a.messages_file == "-" ? std::string("stdin") : a.messages_file;
  DS41_ASSIGN_OR_RETURN(std::string input, read_text_input(a.messages_file));
  auto j = nlohmann::ordered_json::parse(input, nullptr, false);
  if (j.is_discarded()) return invalid_argument(where + " is not valid JSON");
  DS41_ASSIGN_OR_RETURN(text::Conversation conv, text::conversation_from_json(j));
  DS41_RETURN_IF_ERROR(apply_template_mode(a.mode, &conv.options));
  if (a.no_bos) conv.options.add_bos = false;
  conv.options.parse_special_in_content = a.parse_special_in_content;
  DS41_ASSIGN_OR_RETURN(text::ChatPrompt prompt, text::encode_chat(conv.messages, conv.options));
  auto tok = load_tokenizer_arg(a.model_dir, a.tokenizer_file);
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
  CLI::App* cmd = parent.add_subcommand(
      "chat-template", "Render a conversation (JSON file or stdin) as the V4.1 prompt and ids");
  auto* model = cmd->add_option("--model", a->model_dir, "Model directory holding tokenizer.json");
  auto* file = cmd->add_option("--tokenizer", a->tokenizer_file,
                               "tokenizer.json, or a folder holding it (instead of --model)");
  model->excludes(file);
  cmd->add_option("--messages", a->messages_file,
                  "Conversation JSON file (default - = stdin): {\"messages\": [{\"role\": "
                  "system|user|assistant|tool, \"content\", \"reasoning_content\", \"tool_calls\", "
                  "\"tool_call_id\"}...], \"tools\": [...], \"thinking_mode\": \"thinking\"|\"chat\", "
                  "\"reasoning_effort\"} or a bare messages array (OpenAI format)");
  cmd->add_option("--effort", a->mode.effort,
                  "Thinking mode with reasoning effort 1..100, low (50), high (75, default), max (100); wins "
                  "over --chat");
  auto* chat = cmd->add_flag("--chat", a->mode.chat, "Chat (non-thinking) mode");
  auto* thinking =
      cmd->add_flag("--thinking", a->mode.thinking, "Thinking mode (default unless the file says chat)");
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

}  // namespace cmd_chat_template
}  // namespace
}  // namespace ds41::cli

DS41_REGISTER_COMMAND("chat-template", ::ds41::cli::cmd_chat_template::setup_chat_template);
