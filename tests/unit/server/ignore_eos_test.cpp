// ds41 server tests (issue 12, bench serve): the vLLM extension `ignore_eos` that `ds41 bench
// serve` relies on for exact output lengths is parsed on both endpoints and reaches the engine
// request; a non-boolean is a 400.
#include <gtest/gtest.h>

#include "server/api_service.h"
#include "text/tokenizer.h"

namespace ds41::server {
namespace {

class CapturingGenerator final : public Generator {
 public:
  std::vector<engine::GenerationRequest> seen;
  Result<std::shared_ptr<engine::RequestStream>> submit(engine::GenerationRequest req) override {
    seen.push_back(req);
    auto s = std::make_shared<engine::RequestStream>();
    engine::TokenEvent ev;
    ev.token = 1000;
    ev.finish = engine::FinishReason::kLength;
    ev.prompt_tokens = static_cast<int64_t>(req.prompt.size());
    s->push(ev);
    return s;
  }
  engine::LoopStats stats() const override { return {}; }
};

TEST(IgnoreEos, ParsedOnBothEndpoints) {
  auto c = parse_completion_request(R"({"prompt":[1000,1001],"ignore_eos":true})");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c.value().common.ignore_eos);
  auto d = parse_completion_request(R"({"prompt":[1000]})");
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d.value().common.ignore_eos);
  auto chat = parse_chat_request(R"({"messages":[{"role":"user","content":"x"}],"ignore_eos":true})");
  ASSERT_TRUE(chat.ok());
  EXPECT_TRUE(chat.value().common.ignore_eos);
  auto bad = parse_completion_request(R"({"prompt":"x","ignore_eos":"yes"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().param, "ignore_eos");
}

TEST(IgnoreEos, ReachesTheEngineRequest) {
  auto tok = text::Tokenizer::from_file(std::string(DS41_SHARED_DIR) + "/tokenizer-v41/tokenizer.json");
  ASSERT_TRUE(tok.ok());
  ServerMetrics metrics;
  ServiceConfig sc;
  sc.max_context = 4096;
  ApiService svc(sc, &metrics);
  CapturingGenerator gen;
  svc.set_ready(&gen, tok.value().get());
  for (bool flag : {true, false}) {
    HttpRequest req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = std::string(R"({"prompt":[1000,1001,1002],"max_tokens":1,"ignore_eos":)") +
               (flag ? "true" : "false") + "}";
    HttpResponse r = svc.handle(req);
    ASSERT_EQ(r.status, 200) << r.body;
    ASSERT_FALSE(gen.seen.empty());
    EXPECT_EQ(gen.seen.back().ignore_eos, flag);
    EXPECT_EQ(gen.seen.back().prompt, (std::vector<int32_t>{1000, 1001, 1002}));
  }
}

}  // namespace
}  // namespace ds41::server
