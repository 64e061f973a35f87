// ds41 server: chat prompt building (see chat_prompt.h).
#include "server/chat_prompt.h"

namespace ds41::server {

ApiResult<std::vector<int32_t>> build_chat_prompt(const ChatCompletionRequest& req,
                                                  const text::Tokenizer& tok, bool default_thinking,
                                                  bool* thinking, std::vector<std::string>* images) {
  std::vector<text::ChatMessage> messages = req.messages;
  const bool has_tools = !req.tools.is_null() && !req.tools.empty();
  const bool has_rf = !req.response_format.is_null() && !req.response_format.empty();
  if (has_tools || has_rf) {
    if (messages.empty() || messages[0].role != text::ChatRole::kSystem) {
      text::ChatMessage sys;
      sys.role = text::ChatRole::kSystem;
      messages.insert(messages.begin(), std::move(sys));
    }
    if (has_tools) messages[0].tools = req.tools;
    if (has_rf) messages[0].response_format = req.response_format;
  }
  text::ChatOptions opts;
  opts.thinking = req.thinking.value_or(default_thinking);
  if (req.reasoning_effort) opts.reasoning_effort = *req.reasoning_effort;
  if (thinking) *thinking = opts.thinking;
  Result<text::ChatPrompt> prompt = text::encode_chat(messages, opts);
  if (!prompt.ok()) return bad_request(prompt.status().message(), "messages");
  // Only the template's own markers become control tokens: special-token strings inside message
  // content (untrusted client text) are tokenized as plain text (text/chat_encoding.h).
  if (images) *images = prompt.value().images;
  return text::chat_prompt_ids(tok, prompt.value());
}

}  // namespace ds41::server
