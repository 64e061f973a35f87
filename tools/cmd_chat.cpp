// ds41 chat: an interactive terminal chat. --model DIR runs the engine in-process (same start-up
// as `ds41 serve`, requests go through server::ApiService without a socket); --url talks to a
// running `ds41 serve` over HTTP. Multi-turn history in memory; the reasoning is shown under a
// "thinking" header (dimmed with ANSI only when stdout is a terminal) and is not sent back in the
// history; tool calls are printed as blocks. Commands: /reset, /effort low|high|max|off, /exit;
// end of input exits 0.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "chat_client.h"
#include "cli_registry.h"
#include "core/log.h"
#include "engine_factory.h"
#include "server/api_service.h"
#include "serving_engine.h"

namespace ds41::cli {
namespace {
namespace cmd_chat {  // one name per file: the unity build of tools/ (CMakeLists.txt)

using Json = nlohmann::json;

struct ChatArgs {
  EngineArgs engine;
  std::string url, api_key, effort = "high";
  int64_t max_tokens = 1024;
  double temperature = -1;  // < 0: the server's default
  int64_t seed = -1;        // < 0: none
};

bool valid_effort(const std::string& e) { return e == "off" || e == "low" || e == "high" || e == "max"; }

// Prints one streamed answer: the thinking section, the answer and tool-call blocks.
class TurnPrinter {
 public:
  explicit TurnPrinter(bool tty) : tty_(tty) {}
  void reasoning(const std::string& t) {
    if (!in_thinking_) {
      std::printf("%s--- thinking ---%s\n", dim(), plain());
      in_thinking_ = true;
    }
    std::printf("%s%s%s", dim(), t.c_str(), plain());
    std::fflush(stdout);
  }
  void content(const std::string& t) {
    end_thinking();
    std::printf("%s", t.c_str());
    std::fflush(stdout);
    content_ += t;
  }
  void tool_call(const Json& tc) {
    end_thinking();
    const Json f = tc.value("function", Json::object());
    std::printf("\n[tool call] %s(%s)\n", f.value("name", "").c_str(), f.value("arguments", "").c_str());
    std::fflush(stdout);
    Json call = {{"id", tc.value("id", "")}, {"type", "function"}, {"function", f}};
    tool_calls_.push_back(std::move(call));
  }
  void finish() {
    end_thinking();
    std::printf("\n");
    std::fflush(stdout);
  }
  const std::string& content_text() const { return content_; }
  const Json& tool_calls() const { return tool_calls_; }

 private:
  const char* dim() const { return tty_ ? "\033[2m" : ""; }
  const char* plain() const { return tty_ ? "\033[0m" : ""; }
  void end_thinking() {
    if (in_thinking_) {
      std::printf("\n%s--- answer ---%s\n", dim(), plain());
      in_thinking_ = false;
    }
  }
  bool tty_;
  bool in_thinking_ = false;
  std::string content_;
  Json tool_calls_ = Json::array();
};

// One user turn: streams the answer, prints it, appends it to the history. Errors leave the
// history as it was.
Status chat_turn(ChatTransport* t, const ChatArgs& a, const std::string& model, Json* messages, bool tty) {
  Json req = {{"model", model},
              {"messages", *messages},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}},
              {"max_tokens", a.max_tokens}};
  req["chat_template_kwargs"] = {{"thinking", a.effort != "off"}};
  if (a.effort != "off") req["reasoning_effort"] = a.effort;
  if (a.temperature >= 0) req["temperature"] = a.temperature;
  if (a.seed >= 0) req["seed"] = a.seed;
  TurnPrinter out(tty);
  std::string finish;
  int64_t completion_tokens = -1, prompt_tokens = -1, pieces = 0;
  const auto t0 = std::chrono::steady_clock::now();
  Status st = t->stream(req, [&](const Json& chunk) {
    if (chunk.contains("usage") && chunk["usage"].is_object()) {
      completion_tokens = chunk["usage"].value("completion_tokens", int64_t{-1});
      prompt_tokens = chunk["usage"].value("prompt_tokens", int64_t{-1});
    }
    if (!chunk.contains("choices") || !chunk["choices"].is_array()) return;
    for (const Json& ch : chunk["choices"]) {
      const Json d = ch.value("delta", Json::object());
      if (d.contains("reasoning_content") && d["reasoning_content"].is_string()) {
        out.reasoning(d["reasoning_content"].get<std::string>());
        ++pieces;
      }
      if (d.contains("content") && d["content"].is_string()) {
        out.content(d["content"].get<std::string>());
        ++pieces;
      }
      if (d.contains("tool_calls") && d["tool_calls"].is_array())
        for (const Json& tc : d["tool_calls"]) out.tool_call(tc);
      if (ch.contains("finish_reason") && ch["finish_reason"].is_string()) finish = ch["finish_reason"];
    }
  });
  out.finish();
  if (!st.ok()) return st;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t n = completion_tokens >= 0 ? completion_tokens : pieces;
  std::fprintf(stderr, "(%lld tokens, %.1f tokens/s, finish %s, prompt %lld tokens)\n",
               static_cast<long long>(n), s > 0 ? static_cast<double>(n) / s : 0.0, finish.c_str(),
               static_cast<long long>(prompt_tokens));
  Json msg = {{"role", "assistant"}, {"content", out.content_text()}};
  if (!out.tool_calls().empty()) msg["tool_calls"] = out.tool_calls();
  messages->push_back(std::move(msg));
  return ok_status();
}

Status run_chat(ChatArgs a) {
  if (a.url.empty() == a.engine.model_dir.empty())
    return invalid_argument("give exactly one of --model DIR (in-process) or --url http://host:port");
  if (!valid_effort(a.effort))
    return invalid_argument("--effort must be off, low, high or max, got '" + a.effort + "'");
  if (a.max_tokens <= 0) return invalid_argument("--max-tokens must be > 0");
  const bool tty_in = isatty(0), tty_out = isatty(1);

  std::unique_ptr<ServingEngine> eng;
  std::unique_ptr<server::ServerMetrics> metrics;
  std::unique_ptr<server::ApiService> service;
  std::unique_ptr<ChatTransport> transport;
  std::string model = "ds41";
  if (!a.engine.model_dir.empty()) {
    DS41_RETURN_IF_ERROR(validate_engine_args(a.engine));
    model = model_name_from_dir(a.engine.model_dir);
    DS41_ASSIGN_OR_RETURN(eng, start_serving_engine(a.engine, model, "ds41 chat"));
    metrics = std::make_unique<server::ServerMetrics>();
    server::ServiceConfig sc;
    sc.served_model_name = model;
    service = std::make_unique<server::ApiService>(sc, metrics.get());
    service->set_ready(eng->generator(), eng->tokenizer(), eng->max_context());
    set_log_level(LogLevel::kWarn);  // no per-request server log lines in a terminal chat
    transport = make_service_transport(service.get());
  } else {
    DS41_ASSIGN_OR_RETURN(transport, make_http_transport(a.url, a.api_key));
  }
  if (tty_in)
    std::fprintf(stderr, "ds41 chat: %s, effort %s. Commands: /reset, /effort low|high|max|off, /exit\n",
                 model.c_str(), a.effort.c_str());

  Json messages = Json::array();
  std::string line;
  for (;;) {
    if (tty_in) {
      std::printf("> ");
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;  // EOF
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages = Json::array();
      std::printf("(conversation cleared)\n");
      continue;
    }
    if (line.rfind("/effort", 0) == 0) {
      std::string e = line.size() > 8 ? line.substr(8) : "";
      if (!valid_effort(e)) {
        std::printf("(usage: /effort low|high|max|off; now %s)\n", a.effort.c_str());
      } else {
        a.effort = e;
        std::printf("(effort %s)\n", e.c_str());
      }
      continue;
    }
    if (line[0] == '/') {
      std::printf("(unknown command %s; commands: /reset, /effort low|high|max|off, /exit)\n", line.c_str());
      continue;
    }
    messages.push_back({{"role", "user"}, {"content", line}});
    Status st = chat_turn(transport.get(), a, model, &messages, tty_out);
    if (!st.ok()) {
      messages.erase(messages.end() - 1);
      std::fprintf(stderr, "ds41 chat: error: %s\n", st.message().c_str());
      if (!a.url.empty() && st.code() == StatusCode::kUnavailable) return st;  // server gone
    }
  }
  std::fflush(stdout);
  if (eng) eng->stop(std::chrono::milliseconds(0));
  return ok_status();
}

void setup_chat(CLI::App& parent, int& exit_code) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* cmd =
      parent.add_subcommand("chat", "Interactive terminal chat (in-process model or a ds41 server)");
  cmd->add_option("--model", a->engine.model_dir, "Model directory (runs the engine in this process)");
  cmd->add_option("--url", a->url, "A running ds41 serve, e.g. http://127.0.0.1:8000");
  cmd->add_option("--api-key", a->api_key, "Bearer key for --url");
  cmd->add_option("--tokenizer", a->engine.tokenizer_dir,
                  "Folder with tokenizer.json (default: the model directory)");
  add_engine_device_flags(cmd, &a->engine.device, /*seed_flag=*/false);  // --seed samples
  cmd->add_option("--threads", a->engine.threads, "CPU threads (default 2)");
  cmd->add_option("--kv-memory", a->engine.kv_memory, "Sequence state capacity (default 8GiB)");
  cmd->add_option(
      "--memory-limit", a->engine.memory_limit,
      "Memory the model may use (e.g. 20GB, 64GiB); default MemAvailable. Checked before loading");
  cmd->add_option("--effort", a->effort, "Thinking: off, low, high (default) or max; /effort changes it");
  cmd->add_option("--max-tokens", a->max_tokens, "Tokens per answer (default 1024)");
  cmd->add_option("--temperature", a->temperature, "Sampling temperature (default: the server's)");
  cmd->add_option("--seed", a->seed, "Sampling seed");
  cmd->add_flag("-q,--quiet", a->engine.quiet, "No load progress");
  cmd->callback([a, &exit_code] {
    Status s = run_chat(*a);
    if (!s.ok()) {
      std::cerr << "ds41 chat: " << s.message() << "\n";
      exit_code = s.code() == StatusCode::kInvalidArgument ? 2 : 1;
    }
  });
}

}  // namespace cmd_chat
}  // namespace

DS41_REGISTER_COMMAND("chat", ::ds41::cli::cmd_chat::setup_chat);

}  // namespace ds41::cli
