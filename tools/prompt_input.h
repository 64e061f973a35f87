// ds41 CLI: reading prompt text and conversation files given as a path or "-" (stdin), shared by
// generate, tokenize and chat-template. A shell argument is capped near 128 KiB; files and stdin
// are not.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>

#include "core/status.h"
#include "text/chat_encoding.h"
#include "text/tokenizer.h"

namespace ds41::cli {

// The whole of stdin (binary: CR and NUL bytes are kept).
inline Result<std::string> read_stdin_text() {
  std::ostringstream ss;
  ss << std::cin.rdbuf();
  if (std::cin.bad()) return io_error("stdin: read failed");
  return ss.str();
}

// The whole of PATH, or of stdin when PATH is "-". The error names the path.
inline Result<std::string> read_text_input(const std::string& path) {
  if (path == "-") return read_stdin_text();
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error(path + ": read failed");
  return ss.str();
}

// True when stdin is a terminal (nothing piped: reading it would wait for the user to type).
inline bool stdin_is_terminal() { return isatty(STDIN_FILENO) != 0; }

// --tokenizer means the same in every command: a folder holding tokenizer.json, or the file
// itself. Without it, the model folder's tokenizer.json.
inline Result<std::unique_ptr<text::Tokenizer>> load_tokenizer_arg(const std::string& model_dir,
                                                                   const std::string& tokenizer) {
  if (tokenizer.empty()) return text::Tokenizer::from_model_dir(model_dir);
  std::error_code ec;
  if (std::filesystem::is_directory(tokenizer, ec)) return text::Tokenizer::from_model_dir(tokenizer);
  return text::Tokenizer::from_file(tokenizer);
}

// The chat template's mode flags, with one meaning in `generate` and `chat-template`:
//   --thinking      thinking mode (default effort: high)
//   --effort E      thinking mode with effort E (low|high|max|1..100); wins over --chat
//   --chat          chat (non-thinking) mode
//   none            the conversation file's "thinking_mode" (default: thinking, as the server)
struct TemplateModeFlags {
  bool chat = false, thinking = false;
  std::string effort;
  bool any() const { return chat || thinking || !effort.empty(); }
};

inline Status check_template_mode(const TemplateModeFlags& f) {
  if (f.chat && f.thinking)
    return invalid_argument("--chat (chat mode) and --thinking contradict each other");
  if (!f.effort.empty()) {
    auto e = text::parse_reasoning_effort(f.effort);
    if (!e.ok()) return e.status().with_context("--effort");
  }
  return ok_status();
}

// Precondition: check_template_mode(f) is ok.
inline Status apply_template_mode(const TemplateModeFlags& f, text::ChatOptions* o) {
  if (!f.effort.empty()) {
    DS41_ASSIGN_OR_RETURN(o->reasoning_effort, text::parse_reasoning_effort(f.effort));
    o->thinking = true;
  } else if (f.thinking) {
    o->thinking = true;
  } else if (f.chat) {
    o->thinking = false;
  }
  return ok_status();
}

}  // namespace ds41::cli
