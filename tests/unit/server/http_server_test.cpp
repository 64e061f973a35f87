// ds41 server tests: the whole HTTP path over a real loopback socket (cpp-httplib client) with a
// scripted fake Generator: auth, 404, 413, malformed JSON, queue full, streaming, stop strings,
// client disconnect -> cancel, /health while loading, /metrics.
#include "server/http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <thread>

#include "text/tokenizer.h"

namespace ds41::server {
namespace {

using Json = nlohmann::json;

const text::Tokenizer& tokenizer() {
  static const text::Tokenizer* t = [] {
    auto r = text::Tokenizer::from_file(std::string(DS41_SHARED_DIR) + "/tokenizer-v41/tokenizer.json");
    if (!r.ok()) {
      std::fprintf(stderr, "cannot load the tokenizer: %s\n", r.status().message().c_str());
      std::abort();
    }
    return r.value().release();
  }();
  return *t;
}

// Scripted generator: every request streams `script` (then `finish`) with `delay` per token.
class FakeGenerator final : public Generator {
 public:
  std::vector<int32_t> script;
  engine::FinishReason finish = engine::FinishReason::kStop;
  std::chrono::milliseconds delay{0};
  std::atomic<bool> queue_full{false};
  std::mutex mu;
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  std::vector<engine::GenerationRequest> requests;
  std::vector<std::thread> threads;

  ~FakeGenerator() override {
    for (auto& t : threads) t.join();
  }
  Result<std::shared_ptr<engine::RequestStream>> submit(engine::GenerationRequest req) override {
    if (queue_full.load()) return resource_exhausted("queue is full (1024 waiting)");
    auto s = std::make_shared<engine::RequestStream>();
    std::lock_guard<std::mutex> l(mu);
    streams.push_back(s);
    requests.push_back(req);
    const int64_t prompt = static_cast<int64_t>(req.prompt.size());
    const int64_t max_tokens = req.max_tokens;
    threads.emplace_back([this, s, prompt, max_tokens, script = script, finish = finish, delay = delay] {
      for (size_t i = 0; i < script.size(); ++i) {
        if (s->cancelled()) break;
        if (delay.count()) std::this_thread::sleep_for(delay);
        engine::TokenEvent ev;
        ev.token = script[i];
        ev.logprob = -0.5f;
        const bool last = i + 1 == script.size() || static_cast<int64_t>(i + 1) == max_tokens;
        if (last) {
          ev.finish = static_cast<int64_t>(i + 1) == max_tokens && i + 1 < script.size()
                          ? engine::FinishReason::kLength
                          : finish;
          ev.prompt_tokens = prompt;
        }
        s->push(ev);
        if (last) return;
      }
      engine::TokenEvent end;
      end.finish = engine::FinishReason::kAbort;
      end.prompt_tokens = prompt;
      s->push(end);
    });
    return s;
  }
  engine::LoopStats stats() const override {
    engine::LoopStats st;
    st.running = 3;
    st.kv_capacity_bytes = 1000;
    st.kv_used_bytes = 250;
    return st;
  }
  std::shared_ptr<engine::RequestStream> stream(size_t i) {
    std::lock_guard<std::mutex> l(mu);
    return i < streams.size() ? streams[i] : nullptr;
  }
};

class ServerHttp : public ::testing::Test {
 protected:
  void SetUp() override {
    signal(SIGPIPE, SIG_IGN);
    ServiceConfig sc;
    sc.served_model_name = "tiny";
    sc.api_key = "sekret";
    sc.max_context = 4096;
    sc.max_tokens_limit = 1000;
    service = std::make_unique<ApiService>(sc, &metrics);
    HttpServerConfig hc;
    hc.port = 0;
    hc.max_body_bytes = 64 * 1024;
    server = std::make_unique<HttpServer>(hc, service.get());
    ASSERT_TRUE(server->start().ok());
    client = std::make_unique<httplib::Client>("127.0.0.1", server->port());
    client->set_bearer_token_auth("sekret");
    client->set_read_timeout(10, 0);
  }
  void TearDown() override {
    client.reset();
    server->stop();
  }
  void ready() { service->set_ready(&gen, &tokenizer()); }
  httplib::Result post(const std::string& path, const std::string& body) {
    return client->Post(path.c_str(), body, "application/json");
  }

  FakeGenerator gen;
  ServerMetrics metrics;
  std::unique_ptr<ApiService> service;
  std::unique_ptr<HttpServer> server;
  std::unique_ptr<httplib::Client> client;
};

const char* kChat = R"({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]})";

void expect_openai_error(const httplib::Result& r, int status) {
  ASSERT_TRUE(r) << "no response";
  EXPECT_EQ(r->status, status) << r->body;
  Json j = Json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r->body;
  ASSERT_TRUE(j.contains("error")) << r->body;
  for (const char* k : {"message", "type", "param", "code"}) EXPECT_TRUE(j["error"].contains(k)) << k;
}

TEST_F(ServerHttp, HealthIs503WhileLoadingThen200) {
  auto r = client->Get("/health");
  expect_openai_error(r, 503);
  expect_openai_error(post("/v1/chat/completions", kChat), 503);
  ready();
  r = client->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(ServerHttp, AuthNotFoundAndBodyLimits) {
  ready();
  httplib::Client anon("127.0.0.1", server->port());
  expect_openai_error(anon.Get("/v1/models"), 401);
  httplib::Client wrong("127.0.0.1", server->port());
  wrong.set_bearer_token_auth("nope");
  expect_openai_error(wrong.Post("/v1/chat/completions", kChat, "application/json"), 401);
  auto h = anon.Get("/health");  // /health needs no key
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  expect_openai_error(client->Get("/v2/nothing"), 404);
  expect_openai_error(post("/v1/chat/completions", std::string(100 * 1024, ' ')), 413);
  expect_openai_error(post("/v1/chat/completions", "{\"messages\": [}"), 400);
  expect_openai_error(post("/v1/chat/completions", R"({"messages": [{"role": "robot", "content": "x"}]})"),
                      400);
  expect_openai_error(client->Get("/v1/chat/completions"), 405);
  auto m = client->Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(Json::parse(m->body)["data"][0]["id"], "tiny");
}

TEST_F(ServerHttp, LimitsAndQueueFull) {
  ready();
  gen.script = tokenizer().encode("ok");
  expect_openai_error(post("/v1/chat/completions",
                           R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5000})"),
                      400);
  auto big = post("/v1/completions", R"({"prompt": ")" + std::string(20000, 'a') + " " +
                                         std::string(20000, 'b') + R"(", "max_tokens": 10})");
  expect_openai_error(big, 400);
  gen.queue_full = true;
  auto r = post("/v1/chat/completions", kChat);
  expect_openai_error(r, 429);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
}

TEST_F(ServerHttp, ChatNonStreamWithStopString) {
  ready();
  gen.script = tokenizer().encode("The answer is 42. END more text");
  auto r = post("/v1/chat/completions",
                R"({"messages": [{"role": "user", "content": "Hi"}], "stop": ["END"],
                    "chat_template_kwargs": {"thinking": false}, "logprobs": true, "top_logprobs": 0})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  Json j = Json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "The answer is 42. ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(j["choices"][0]["message"].contains("reasoning_content"));
  EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(j["usage"]["total_tokens"].get<int>(),
            j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_TRUE(j["choices"][0]["logprobs"]["content"].is_array());
  // The stop string matched on the consumer side cancels the stream.
  auto s = gen.stream(0);
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->cancelled());
  // The prompt the engine got is the chat encoding (ends with the chat-mode header).
  std::lock_guard<std::mutex> l(gen.mu);
  auto text = tokenizer().decode(gen.requests[0].prompt);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text.value().find("Hi"), std::string::npos);
}

TEST_F(ServerHttp, ChatThinkingToolCallsAndLength) {
  ready();
  gen.script = tokenizer().encode(
      "plan it</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n"
      "<｜DSML｜ parameter name=\"x\" string=\"false\">1</｜DSML｜ parameter>\n</｜DSML｜ "
      "invoke>\n</｜DSML｜ calls>");
  auto r =
      post("/v1/chat/completions",
           R"({"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"thinking": true},
                    "tools": [{"type": "function", "function": {"name": "f"}}]})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  Json j = Json::parse(r->body);
  const Json& msg = j["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "plan it");
  EXPECT_TRUE(msg["content"].is_null());
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"x": 1})");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_GT(j["usage"]["completion_tokens_details"]["reasoning_tokens"].get<int>(), 0);

  gen.script = tokenizer().encode("one two three four five six");
  r = post("/v1/completions", R"({"prompt": "count", "max_tokens": 2, "echo": true})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  j = Json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][0]["text"], "countone two");
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
}

// Splits an SSE body into its data payloads.
std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  return out;
}

TEST_F(ServerHttp, ChatStreamsDeltasUsageAndDone) {
  ready();
  gen.script = tokenizer().encode("think</think>Hello there");
  std::string body;
  auto r = client->Post(
      "/v1/chat/completions", httplib::Headers{},
      R"({"messages": [{"role": "user", "content": "Hi"}], "stream": true, "stream_options": {"include_usage": true},
          "chat_template_kwargs": {"enable_thinking": true}, "reasoning_effort": "low"})",
      "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  auto events = sse_data(r->body);
  ASSERT_GE(events.size(), 4u) << r->body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string reasoning, content, finish;
  Json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    Json c = Json::parse(events[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (c["choices"].empty()) {
      usage = c["usage"];
      continue;
    }
    const Json& d = c["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(reasoning, "think");
  EXPECT_EQ(content, "Hello there");
  EXPECT_EQ(finish, "stop");
  ASSERT_TRUE(usage.is_object()) << r->body;
  EXPECT_EQ(usage["completion_tokens"], gen.script.size());
  // Effort "low" reached the prompt (MODEL_SPEC 6.2: low = 50).
  std::lock_guard<std::mutex> l(gen.mu);
  EXPECT_EQ(gen.requests.size(), 1u);
}

TEST_F(ServerHttp, ClientDisconnectCancelsTheStream) {
  ready();
  gen.script.assign(900, tokenizer().encode(" a")[0]);
  gen.delay = std::chrono::milliseconds(2);
  std::atomic<int> chunks{0};
  std::thread t([&] {
    httplib::Client c("127.0.0.1", server->port());
    c.set_bearer_token_auth("sekret");
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = R"({"messages": [{"role": "user", "content": "Hi"}], "stream": true, "max_tokens": 900,
                  "chat_template_kwargs": {"thinking": false}})";
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
    c.send(req);  // returns once the receiver refuses: the client closes the socket
  });
  t.join();
  EXPECT_GE(chunks.load(), 3);
  std::shared_ptr<engine::RequestStream> s;
  for (int i = 0; i < 500 && !(s && s->cancelled()); ++i) {
    s = gen.stream(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->cancelled()) << "the server did not cancel the request of a client that went away";
}

TEST_F(ServerHttp, TokenizeDetokenizeAndMetrics) {
  ready();
  auto r = post("/tokenize", R"({"prompt": "Hello, world!"})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  Json j = Json::parse(r->body);
  EXPECT_EQ(j["tokens"], Json(tokenizer().encode("Hello, world!")));
  r = post("/detokenize", Json{{"tokens", j["tokens"]}}.dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(Json::parse(r->body)["prompt"], "Hello, world!");
  expect_openai_error(post("/detokenize", R"({"tokens": [-1]})"), 400);
  gen.script = tokenizer().encode("x");
  ASSERT_TRUE(post("/v1/chat/completions", kChat));
  auto m = client->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  for (const char* name :
       {"ds41_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1", "ds41_running_sequences 3",
        "ds41_state_memory_free_bytes 750", "ds41_time_to_first_token_seconds_count 1",
        "ds41_e2e_request_latency_seconds_bucket", "ds41_generation_tokens_total", "ds41_preemptions_total"})
    EXPECT_NE(m->body.find(name), std::string::npos) << name << "\n" << m->body;
}

}  // namespace
}  // namespace ds41::server
