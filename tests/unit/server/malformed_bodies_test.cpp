// ds41 server tests (issue 12): a mutation test of malformed request bodies through real HTTP
// over loopback (HttpServer + ApiService + a scripted generator, no model). Truncated JSON, a
// wrong type in every field, huge numbers, deep nesting, invalid UTF-8, duplicated keys, oversized
// bodies, wrong content types, lying Content-Length, slow and abandoned bodies: every answer is a
// 4xx OpenAI-shaped error (never 5xx, never a hang or a crash), and after each one the server
// still answers a valid request.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "server/http_server.h"
#include "text/tokenizer.h"

namespace ds41::server {
namespace {

using Json = nlohmann::json;

const text::Tokenizer& tok() {
  static const text::Tokenizer* t = [] {
    auto r = text::Tokenizer::from_file(std::string(DS41_SHARED_DIR) + "/tokenizer-v41/tokenizer.json");
    if (!r.ok()) std::abort();
    return r.value().release();
  }();
  return *t;
}

// Answers every request at once with two tokens and a stop.
class InstantGenerator final : public Generator {
 public:
  Result<std::shared_ptr<engine::RequestStream>> submit(engine::GenerationRequest req) override {
    auto s = std::make_shared<engine::RequestStream>();
    engine::TokenEvent a;
    a.token = 1000;
    s->push(a);
    engine::TokenEvent b;
    b.token = 1001;
    b.finish = engine::FinishReason::kStop;
    b.prompt_tokens = static_cast<int64_t>(req.prompt.size());
    s->push(b);
    return s;
  }
  engine::LoopStats stats() const override { return {}; }
};

constexpr size_t kMaxBody = 64 * 1024;
const char* kValidChat = R"({"model":"tiny","messages":[{"role":"user","content":"Hi"}],"max_tokens":4})";

class MalformedBodies : public ::testing::Test {
 protected:
  void SetUp() override {
    signal(SIGPIPE, SIG_IGN);
    ServiceConfig sc;
    sc.max_context = 4096;
    service = std::make_unique<ApiService>(sc, &metrics);
    service->set_ready(&gen, &tok());
    HttpServerConfig hc;
    hc.port = 0;
    hc.max_body_bytes = kMaxBody;
    hc.read_timeout_s = 1;  // slow-body cases wait this long
    server = std::make_unique<HttpServer>(hc, service.get());
    ASSERT_TRUE(server->start().ok());
    client = std::make_unique<httplib::Client>("127.0.0.1", server->port());
    client->set_read_timeout(10, 0);
  }
  void TearDown() override { server->stop(); }

  // A 4xx with an OpenAI error body; `param` checked when non-empty.
  void expect_4xx(const httplib::Result& r, const std::string& what, const std::string& param = "") {
    ASSERT_TRUE(r) << what << ": no response (" << httplib::to_string(r.error()) << ")";
    EXPECT_GE(r->status, 400) << what << ": " << r->body;
    EXPECT_LT(r->status, 500) << what << ": " << r->body;
    Json j = Json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error") && j["error"].is_object()) << what << ": " << r->body;
    for (const char* k : {"message", "type", "param", "code"}) EXPECT_TRUE(j["error"].contains(k)) << what;
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty()) << what;
    if (!param.empty()) EXPECT_EQ(j["error"]["param"], param) << what << ": " << r->body;
    ++checked;
  }
  // The server still serves (a fresh connection: the previous one may have been closed).
  void expect_still_serving(const std::string& after) {
    httplib::Client c("127.0.0.1", server->port());
    c.set_read_timeout(10, 0);
    auto r = c.Post("/v1/chat/completions", kValidChat, "application/json");
    ASSERT_TRUE(r) << "after " << after << ": no response";
    ASSERT_EQ(r->status, 200) << "after " << after << ": " << r->body;
  }
  void post_bad(const std::string& path, const std::string& body, const std::string& what,
                const std::string& param = "") {
    expect_4xx(client->Post(path.c_str(), body, "application/json"), what, param);
  }

  // Raw bytes over a new socket; returns what came back before the server closed or `wait` passed.
  std::string raw_exchange(const std::string& bytes, std::chrono::milliseconds hold,
                           std::chrono::seconds wait, double* seconds = nullptr) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(server->port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    const auto t0 = std::chrono::steady_clock::now();
    (void)!write(fd, bytes.data(), bytes.size());
    if (hold.count()) std::this_thread::sleep_for(hold);
    timeval tv{static_cast<time_t>(wait.count()), 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
    if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    close(fd);
    return out;
  }

  InstantGenerator gen;
  ServerMetrics metrics;
  std::unique_ptr<ApiService> service;
  std::unique_ptr<HttpServer> server;
  std::unique_ptr<httplib::Client> client;
  int checked = 0;
};

TEST_F(MalformedBodies, ValidRequestIsServed) { expect_still_serving("nothing"); }

TEST_F(MalformedBodies, EveryTruncationIsA400) {
  const std::string body = kValidChat;
  for (size_t n = 0; n < body.size(); ++n) {
    for (const char* path : {"/v1/chat/completions", "/v1/completions"})
      post_bad(path, body.substr(0, n), "truncated at " + std::to_string(n));
  }
  expect_still_serving("truncations");
  EXPECT_EQ(checked, 2 * static_cast<int>(body.size()));
}

// Every field gets every JSON type it does not accept; the error names the field.
TEST_F(MalformedBodies, WrongTypeInEveryFieldIsA400NamingTheField) {
  enum T { kStr = 1, kFloat = 2, kInt = 4, kBool = 8, kArr = 16, kObj = 32 };
  const std::pair<int, const char*> values[] = {{kStr, R"("x")"}, {kFloat, "1.5"}, {kInt, "7"},
                                                {kBool, "true"},  {kArr, "[1]"},   {kObj, R"({"a":1})"}};
  struct Field {
    const char* name;
    int accepts;
    bool chat_only;
  };
  const int kNum = kFloat | kInt;
  const Field fields[] = {{"model", kStr, false},
                          {"user", kStr, false},
                          {"messages", kArr, true},
                          {"temperature", kNum, false},
                          {"top_p", kNum, false},
                          {"min_p", kNum, false},
                          {"presence_penalty", kNum, false},
                          {"frequency_penalty", kNum, false},
                          {"repetition_penalty", kNum, false},
                          {"top_k", kInt, false},
                          {"seed", kInt, false},
                          {"max_tokens", kInt, false},
                          {"max_completion_tokens", kInt, false},
                          {"stop", kStr | kArr, false},
                          {"stop_token_ids", kArr, false},
                          {"ignore_eos", kBool, false},
                          {"stream", kBool, false},
                          {"stream_options", kObj, false},
                          {"tools", kArr, true},
                          {"tool_choice", kStr | kObj, true},
                          {"chat_template_kwargs", kObj, true},
                          {"reasoning_effort", kStr | kInt, true},
                          {"response_format", kObj, true},
                          {"logprobs", kBool, true},
                          {"echo", kBool, false},
                          {"prompt", kStr | kArr, false}};
  for (const Field& f : fields) {
    for (const auto& [type, text] : values) {
      if (f.accepts & type) continue;
      const bool prompt_field = std::string(f.name) == "prompt", echo = std::string(f.name) == "echo";
      if (!prompt_field && !echo) {
        Json chat = Json::parse(kValidChat);
        chat[f.name] = Json::parse(text);
        post_bad("/v1/chat/completions", chat.dump(), std::string("chat ") + f.name + "=" + text, f.name);
      }
      if (!f.chat_only) {
        Json c = {{"prompt", "Hi"}, {"max_tokens", 4}};
        c[f.name] = Json::parse(text);
        post_bad("/v1/completions", c.dump(), std::string("completion ") + f.name + "=" + text, f.name);
      }
    }
  }
  expect_still_serving("wrong types");
  EXPECT_GT(checked, 150);
}

TEST_F(MalformedBodies, HugeNumbersAreA400) {
  for (const char* field : {"max_tokens", "top_k", "seed", "temperature", "top_p", "max_completion_tokens",
                            "n", "top_logprobs"}) {
    for (const char* v : {"1e300", "-1e300", "18446744073709551616", "-9223372036854775809", "1e999"}) {
      std::string body = std::string(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,")") +
                         field + "\":" + v + "}";
      post_bad("/v1/chat/completions", body, std::string(field) + "=" + v);
    }
  }
  // Within the parser's range but over the context: still a 400 that says the numbers.
  post_bad("/v1/completions", R"({"prompt":"x","max_tokens":9223372036854775807})", "max_tokens = int64 max");
  post_bad("/v1/completions", R"({"prompt":[2147483647]})", "token id int32 max", "prompt");
  expect_still_serving("huge numbers");
}

TEST_F(MalformedBodies, DeepNestingIsA400) {
  for (int depth : {65, 1000, 30000}) {
    const std::string arr = std::string(depth, '[') + std::string(depth, ']');
    post_bad("/v1/chat/completions", R"({"messages":)" + arr + "}", "arrays nested " + std::to_string(depth));
    std::string obj;
    for (int i = 0; i < depth; ++i) obj += R"({"a":)";
    obj += "1" + std::string(depth, '}');
    post_bad("/v1/completions", R"({"prompt":"x","user":)" + obj + "}",
             "objects nested " + std::to_string(depth));
  }
  expect_still_serving("deep nesting");
}

TEST_F(MalformedBodies, InvalidUtf8IsA400) {
  for (const char* bad : {"\xff", "\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf", "a\xe2\x82"}) {
    post_bad("/v1/chat/completions",
             std::string(R"({"messages":[{"role":"user","content":")") + bad + "\"}]}",
             "invalid UTF-8 in content");
    post_bad("/v1/completions", std::string(R"({"prompt":")") + bad + "\"}", "invalid UTF-8 in prompt");
    post_bad("/v1/completions", std::string(R"({"prompt":"x","stop":")") + bad + "\"}",
             "invalid UTF-8 in stop");
  }
  expect_still_serving("invalid UTF-8");
}

TEST_F(MalformedBodies, DuplicatedKeysAreA400) {
  // Whichever copy a parser keeps, the body is ambiguous: refused, naming the key.
  post_bad("/v1/chat/completions",
           R"({"messages":[{"role":"user","content":"a"}],"max_tokens":4,"max_tokens":5})", "dup max_tokens",
           "max_tokens");
  post_bad("/v1/chat/completions", R"({"messages":[{"role":"user","role":"system","content":"a"}]})",
           "dup role", "role");
  post_bad("/v1/completions", R"({"prompt":"a","prompt":[1,2]})", "dup prompt", "prompt");
  // Many distinct keys in one object stay cheap (no quadratic scan) and are accepted.
  std::string many = R"({"prompt":"x","max_tokens":2)";
  for (int i = 0; i < 3000; ++i) many += ",\"k" + std::to_string(i) + "\":0";
  many += "}";
  auto r = client->Post("/v1/completions", many, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  expect_still_serving("duplicated keys");
}

TEST_F(MalformedBodies, OversizedBodyIsA413) {
  const std::string big = R"({"prompt":")" + std::string(kMaxBody + 100, 'a') + "\"}";
  auto r = client->Post("/v1/completions", big, "application/json");
  expect_4xx(r, "oversized body");
  EXPECT_EQ(r->status, 413);
  expect_still_serving("oversized body");
}

TEST_F(MalformedBodies, BodyIsParsedAsJsonWhateverTheContentType) {
  // curl -d (form-urlencoded) and fetch with a string body (text/plain) send valid JSON with
  // another Content-Type: served. A body that is not JSON is a 400 whatever the type says.
  for (const char* ct : {"text/plain", "application/x-www-form-urlencoded", "Application/JSON; charset=utf-8"}) {
    auto ok = client->Post("/v1/chat/completions", kValidChat, ct);
    ASSERT_TRUE(ok) << ct;
    EXPECT_EQ(ok->status, 200) << ct << ": " << ok->body;
  }
  auto r = client->Post("/v1/chat/completions", "<chat><msg>hi</msg></chat>", "application/xml");
  expect_4xx(r, "xml body");
  EXPECT_EQ(r->status, 400);
  // httplib parses multipart bodies itself and refuses this one first (a 400, OpenAI-shaped).
  expect_4xx(client->Post("/v1/chat/completions", kValidChat, "multipart/form-data; boundary=x"),
             "multipart");
  expect_still_serving("content types");
}

TEST_F(MalformedBodies, NonObjectBodiesAreA400) {
  for (const char* b :
       {"", " ", "null", "[]", "\"x\"", "1", "true", "{}", "{\"messages\":[]}", "\xef\xbb\xbf{}"})
    post_bad("/v1/chat/completions", b, std::string("body '") + b + "'");
  expect_still_serving("non-objects");
}

TEST_F(MalformedBodies, LyingAndSlowBodiesNeverHang) {
  const std::string head =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: "
      "close\r\n";  // time the server, not keep-alive
  // Content-Length larger than what is sent, then silence: dropped after the read timeout.
  double s = 0;
  std::string out =
      raw_exchange(head + "Content-Length: 500\r\n\r\n{\"messages\":", std::chrono::milliseconds(0),
                   std::chrono::seconds(8), &s);
  EXPECT_LT(s, 4.0) << "an abandoned body held the connection";
  if (!out.empty()) EXPECT_NE(out.find(" 4"), std::string::npos) << out;  // a 4xx, if anything
  expect_still_serving("abandoned body");
  // Garbage Content-Length values.
  for (const char* cl : {"-5", "abc", "99999999999999999999", "1, 2"}) {
    out = raw_exchange(head + "Content-Length: " + cl + "\r\n\r\n{}", std::chrono::milliseconds(0),
                       std::chrono::seconds(8), &s);
    EXPECT_LT(s, 4.0) << cl;
    EXPECT_EQ(out.find(" 500 "), std::string::npos) << cl << ": " << out;
    expect_still_serving(std::string("Content-Length ") + cl);
  }
  // Broken chunked encodings.
  for (const char* chunked : {"zz\r\n{}\r\n0\r\n\r\n", "5\r\n{}\r\n0\r\n\r\n", "ffffffffffffffff\r\n{}"}) {
    out = raw_exchange(head + "Transfer-Encoding: chunked\r\n\r\n" + chunked, std::chrono::milliseconds(0),
                       std::chrono::seconds(8), &s);
    EXPECT_LT(s, 4.0) << chunked;
    EXPECT_EQ(out.find(" 500 "), std::string::npos) << out;
    expect_still_serving(std::string("chunked ") + chunked);
  }
  // Not HTTP at all.
  out = raw_exchange(std::string("\x16\x03\x01\x02\x00garbage\r\n\r\n", 16), std::chrono::milliseconds(0),
                     std::chrono::seconds(10), &s);
  EXPECT_LT(s, 7.0);  // no Connection: close here: bounded by the 5 s keep-alive timeout
  expect_still_serving("TLS bytes on the HTTP port");
}

TEST_F(MalformedBodies, SlowButCompleteBodyIsServed) {
  const std::string body = kValidChat;
  const std::string req =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Connection: close\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(server->port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  for (size_t i = 0; i < body.size(); i += 16) {  // 16-byte pieces, 50 ms apart (< read timeout)
    const std::string piece = body.substr(i, 16);
    ASSERT_EQ(write(fd, piece.data(), piece.size()), static_cast<ssize_t>(piece.size()));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  timeval tv{8, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  EXPECT_EQ(out.rfind("HTTP/1.1 200", 0), 0u) << out;
}

}  // namespace
}  // namespace ds41::server
