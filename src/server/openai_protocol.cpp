// ds41 server: OpenAI request parsing and validation (see openai_protocol.h).
#include "server/openai_protocol.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <unordered_set>

#include "core/json_depth.h"
#include "text/chat_json.h"

namespace ds41::server {
namespace {

using Json = nlohmann::ordered_json;

std::string fmt(double d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", d);
  return buf;
}

std::string type_name(const Json& v) { return v.is_number_integer() ? "integer" : v.type_name(); }

ApiError wrong_type(const std::string& field, const char* want, const Json& v) {
  return bad_request("'" + field + "' must be " + want + ", got " + type_name(v), field);
}

// Optional fields: absent or null leaves *out unchanged.
std::optional<ApiError> read_number(const Json& j, const char* key, double lo, double hi, double* out) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const Json& v = j[key];
  if (!v.is_number()) return wrong_type(key, "a number", v);
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    return bad_request(
        "'" + std::string(key) + "' must be in [" + fmt(lo) + ", " + fmt(hi) + "], got " + v.dump(), key);
  *out = d;
  return std::nullopt;
}

std::optional<ApiError> read_int(const Json& j, const char* key, int64_t lo, int64_t hi,
                                 std::optional<int64_t>* out) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const Json& v = j[key];
  // 5.0 is accepted as 5 (JavaScript clients cannot tell them apart).
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) return wrong_type(key, "an integer", v);
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
      return bad_request("'" + std::string(key) + "' must be in [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "], got " + v.dump(),
                         key);
    *out = static_cast<int64_t>(d);
    return std::nullopt;
  }
  if (!v.is_number_integer()) return wrong_type(key, "an integer", v);
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return bad_request("'" + std::string(key) + "' is too large: " + v.dump(), key);
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    return bad_request("'" + std::string(key) + "' must be in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "], got " + v.dump(),
                       key);
  *out = x;
  return std::nullopt;
}

std::optional<ApiError> read_bool(const Json& j, const char* key, bool* out) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_boolean()) return wrong_type(key, "a boolean", j[key]);
  *out = j[key].get<bool>();
  return std::nullopt;
}

std::optional<ApiError> read_string(const Json& j, const char* key, std::string* out) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_string()) return wrong_type(key, "a string", j[key]);
  *out = j[key].get<std::string>();
  return std::nullopt;
}

#define DS41_API_TRY(expr)                           \
  do {                                               \
    if (auto _e = (expr); _e) return std::move(*_e); \
  } while (0)

std::optional<ApiError> read_token_ids(const Json& v, const std::string& field, std::vector<int32_t>* out) {
  if (!v.is_array()) return wrong_type(field, "an array of token ids", v);
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& t = v[i];
    if (!t.is_number_integer() || (!t.is_number_unsigned() && t.get<int64_t>() < 0) ||
        (t.is_number_unsigned() &&
         t.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) ||
        t.get<int64_t>() > std::numeric_limits<int32_t>::max())
      return bad_request(
          "'" + field + "[" + std::to_string(i) + "]' must be a token id (a non-negative integer)", field);
    out->push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return std::nullopt;
}

// Sampling, limits, stop, stream, n, user: the fields both endpoints share.
std::optional<ApiError> read_common(const Json& j, CommonParams* c) {
  DS41_API_TRY(read_string(j, "model", &c->model));
  DS41_API_TRY(read_string(j, "user", &c->user));
  engine::SamplingParams& s = c->sampling;
  DS41_API_TRY(read_number(j, "temperature", 0.0, 2.0, &s.temperature));
  DS41_API_TRY(read_number(j, "top_p", 0.0, 1.0, &s.top_p));
  if (j.contains("top_p") && j["top_p"].is_number() && s.top_p <= 0.0)
    return bad_request("'top_p' must be in (0, 1], got " + j["top_p"].dump(), "top_p");
  std::optional<int64_t> top_k;
  DS41_API_TRY(read_int(j, "top_k", -1, std::numeric_limits<int32_t>::max(), &top_k));
  if (top_k) s.top_k = *top_k < 0 ? 0 : *top_k;  // -1 (vLLM) and 0 both mean off
  DS41_API_TRY(read_number(j, "min_p", 0.0, 1.0, &s.min_p));
  DS41_API_TRY(read_number(j, "presence_penalty", -2.0, 2.0, &s.presence_penalty));
  DS41_API_TRY(read_number(j, "frequency_penalty", -2.0, 2.0, &s.frequency_penalty));
  DS41_API_TRY(read_number(j, "repetition_penalty", 0.0, 100.0, &s.repetition_penalty));
  if (j.contains("repetition_penalty") && j["repetition_penalty"].is_number() && s.repetition_penalty <= 0.0)
    return bad_request("'repetition_penalty' must be > 0", "repetition_penalty");
  if (j.contains("seed") && !j["seed"].is_null()) {
    const Json& v = j["seed"];
    if (!v.is_number_integer()) return wrong_type("seed", "an integer", v);
    s.seed = v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
  }
  std::optional<int64_t> mt, mct, n;
  DS41_API_TRY(read_int(j, "max_tokens", 1, std::numeric_limits<int64_t>::max(), &mt));
  DS41_API_TRY(read_int(j, "max_completion_tokens", 1, std::numeric_limits<int64_t>::max(), &mct));
  c->max_tokens = mct ? mct : mt;
  DS41_API_TRY(
      read_int(j, "n", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &n));
  if (n && *n != 1) return bad_request("'n' must be 1: this server returns one choice per prompt", "n");
  if (j.contains("best_of") && !j["best_of"].is_null() && j["best_of"] != 1)
    return bad_request("'best_of' is not supported", "best_of");
  if (j.contains("stop") && !j["stop"].is_null()) {
    const Json& v = j["stop"];
    if (v.is_string()) {
      c->stop.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      if (v.size() > kMaxStopStrings)
        return bad_request(
            "'stop' has " + std::to_string(v.size()) + " entries; at most " + std::to_string(kMaxStopStrings),
            "stop");
      for (const Json& x : v) {
        if (!x.is_string()) return wrong_type("stop", "a string or an array of strings", v);
        c->stop.push_back(x.get<std::string>());
      }
    } else {
      return wrong_type("stop", "a string or an array of strings", v);
    }
    for (const std::string& st : c->stop)
      if (st.empty()) return bad_request("'stop' strings must not be empty", "stop");
  }
  if (j.contains("stop_token_ids") && !j["stop_token_ids"].is_null())
    DS41_API_TRY(read_token_ids(j["stop_token_ids"], "stop_token_ids", &c->stop_token_ids));
  DS41_API_TRY(read_bool(j, "ignore_eos", &c->ignore_eos));
  DS41_API_TRY(read_bool(j, "stream", &c->stream));
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const Json& so = j["stream_options"];
    if (!so.is_object()) return wrong_type("stream_options", "an object", so);
    if (so.contains("include_usage") && !so["include_usage"].is_null()) {
      if (!so["include_usage"].is_boolean())
        return wrong_type("stream_options.include_usage", "a boolean", so["include_usage"]);
      c->include_usage = so["include_usage"].get<bool>();
    }
  }
  return std::nullopt;
}

std::optional<ApiError> read_tools(const Json& j, ChatCompletionRequest* r) {
  if (j.contains("tools") && !j["tools"].is_null()) {
    const Json& t = j["tools"];
    if (!t.is_array()) return wrong_type("tools", "an array", t);
    for (size_t i = 0; i < t.size(); ++i) {
      const std::string w = "tools[" + std::to_string(i) + "]";
      if (!t[i].is_object()) return wrong_type(w, "an object", t[i]);
      if (t[i].contains("type") && t[i]["type"] != "function")
        return bad_request("'" + w + ".type' must be \"function\"", w + ".type");
      if (!t[i].contains("function") || !t[i]["function"].is_object())
        return bad_request("'" + w + "' has no 'function' object", w + ".function");
      const Json& f = t[i]["function"];
      if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
        return bad_request("'" + w + ".function.name' must be a non-empty string", w + ".function.name");
      if (f.contains("parameters") && !f["parameters"].is_null() && !f["parameters"].is_object())
        return wrong_type(w + ".function.parameters", "an object", f["parameters"]);
    }
    if (!t.empty()) r->tools = t;
  }
  if (j.contains("tool_choice") && !j["tool_choice"].is_null()) {
    const Json& tc = j["tool_choice"];
    if (tc.is_string()) {
      const std::string s = tc.get<std::string>();
      if (s == "auto")
        r->tool_choice = ToolChoice::kAuto;
      else if (s == "none")
        r->tool_choice = ToolChoice::kNone;
      else if (s == "required")
        r->tool_choice = ToolChoice::kRequired;
      else
        return bad_request(
            "'tool_choice' must be \"auto\", \"none\", \"required\" or a named function, got \"" + s + "\"",
            "tool_choice");
    } else if (tc.is_object()) {
      if (!tc.contains("function") || !tc["function"].is_object() || !tc["function"].contains("name") ||
          !tc["function"]["name"].is_string())
        return bad_request("'tool_choice.function.name' must be a string", "tool_choice");
      r->tool_choice = ToolChoice::kNamed;
      r->tool_choice_name = tc["function"]["name"].get<std::string>();
    } else {
      return wrong_type("tool_choice", "a string or an object", tc);
    }
  }
  if (r->tool_choice != ToolChoice::kAuto && r->tool_choice != ToolChoice::kNone && r->tools.is_null())
    return bad_request("'tool_choice' needs 'tools'", "tool_choice");
  if (r->tool_choice == ToolChoice::kNone) r->tools = Json();  // rendered without tools
  if (r->tool_choice == ToolChoice::kNamed) {
    Json only = Json::array();
    for (const Json& t : r->tools)
      if (t["function"]["name"] == r->tool_choice_name) only.push_back(t);
    if (only.empty())
      return bad_request("'tool_choice' names function '" + r->tool_choice_name + "' which is not in 'tools'",
                         "tool_choice");
    r->tools = std::move(only);
  }
  return std::nullopt;
}

std::optional<ApiError> read_thinking(const Json& j, ChatCompletionRequest* r) {
  if (j.contains("chat_template_kwargs") && !j["chat_template_kwargs"].is_null()) {
    const Json& k = j["chat_template_kwargs"];
    if (!k.is_object()) return wrong_type("chat_template_kwargs", "an object", k);
    for (const char* key : {"thinking", "enable_thinking"}) {
      if (!k.contains(key) || k[key].is_null()) continue;
      if (!k[key].is_boolean())
        return wrong_type(std::string("chat_template_kwargs.") + key, "a boolean", k[key]);
      r->thinking = k[key].get<bool>();
    }
  }
  if (j.contains("reasoning_effort") && !j["reasoning_effort"].is_null()) {
    const Json& v = j["reasoning_effort"];
    if (!v.is_string() && !v.is_number_integer())
      return wrong_type("reasoning_effort", "a string or an integer", v);
    Result<int> e = text::reasoning_effort_from_json(v);
    if (!e.ok() || (v.is_number_integer() && (v.get<int64_t>() < 1 || v.get<int64_t>() > 100)))
      return bad_request(
          "'reasoning_effort' must be \"low\", \"high\", \"max\" or an integer 1..100, got " + v.dump(),
          "reasoning_effort");
    r->reasoning_effort = e.value();
  }
  return std::nullopt;
}

std::optional<ApiError> read_response_format(const Json& j, ChatCompletionRequest* r) {
  if (!j.contains("response_format") || j["response_format"].is_null()) return std::nullopt;
  const Json& rf = j["response_format"];
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    return bad_request("'response_format' must be an object with a string 'type'", "response_format");
  const std::string type = rf["type"].get<std::string>();
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    r->response_format = Json{{"type", "json_object"}};
  } else if (type == "json_schema") {
    if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
      return bad_request("'response_format.json_schema' must be an object", "response_format.json_schema");
    r->response_format = rf["json_schema"];
  } else {
    return bad_request("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"",
                       "response_format.type");
  }
  return std::nullopt;
}

// Chat messages go through text::chat_messages_from_json (one parser for the CLI and the
// server); image parts are checked for shape here and resolved by the service.
std::optional<ApiError> read_messages(const Json& j, ChatCompletionRequest* r) {
  if (!j.contains("messages")) return bad_request("'messages' is required", "messages");
  const Json& m = j["messages"];
  if (!m.is_array()) return wrong_type("messages", "an array", m);
  if (m.empty()) return bad_request("'messages' must not be empty", "messages");
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string w = "messages[" + std::to_string(i) + "]";
    if (!m[i].is_object()) return wrong_type(w, "an object", m[i]);
    if (m[i].contains("content") && !m[i]["content"].is_null() && !m[i]["content"].is_string() &&
        !m[i]["content"].is_array())
      return wrong_type(w + ".content", "a string or an array of content parts", m[i]["content"]);
    Result<text::ChatMessage> msg = text::chat_message_from_json(m[i], i);
    if (!msg.ok()) {
      const bool role = m[i].contains("role") && m[i]["role"].is_string() &&
                        msg.status().message().find(".role") != std::string::npos;
      return bad_request(msg.status().message(), role ? w + ".role" : w);
    }
    // Image parts (issue 16): `image_url` as {"url": ..., "detail": "auto"|"low"|"high"} or a
    // plain string. `detail` is accepted and has no effect: the model's vision config fixes the
    // resize plan (README "Images"). The URL itself is resolved by the service (image_inputs.h).
    if (m[i].contains("content") && m[i]["content"].is_array()) {
      const Json& parts = m[i]["content"];
      for (size_t k = 0; k < parts.size(); ++k) {
        const Json& part = parts[k];
        if (!part.is_object() || !part.contains("type") || part["type"] != "image_url") continue;
        const std::string pw = w + ".content[" + std::to_string(k) + "].image_url";
        if (!part.contains("image_url") || !(part["image_url"].is_object() || part["image_url"].is_string()))
          return bad_request("'" + pw + "' must be an object with a 'url'", pw);
        const Json& iu = part["image_url"];
        if (iu.is_object()) {
          if (!iu.contains("url") || !iu["url"].is_string() || iu["url"].get<std::string>().empty())
            return bad_request("'" + pw + ".url' must be a non-empty string", pw + ".url");
          if (iu.contains("detail") && !iu["detail"].is_null()) {
            const Json& d = iu["detail"];
            if (!d.is_string() || (d != "auto" && d != "low" && d != "high"))
              return bad_request("'" + pw + ".detail' must be \"auto\", \"low\" or \"high\"", pw + ".detail");
          }
        }
      }
    }
    r->messages.push_back(std::move(msg.value()));
  }
  return std::nullopt;
}

}  // namespace

ApiResult<Json> parse_json_object(std::string_view body) {
  if (json_nesting_exceeds(body, kMaxJsonDepth))
    return bad_request("request body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  // Duplicated keys are refused: parsers disagree on which one wins, and a proxy that validated
  // the first must not see the server act on the last (RFC 8259 4: names SHOULD be unique).
  std::vector<std::unordered_set<std::string>> keys;  // per open object, the keys seen so far
  std::string duplicate;
  Json::parser_callback_t on_event = [&](int, nlohmann::json::parse_event_t ev, Json& v) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) keys.emplace_back();
    if (ev == E::object_end && !keys.empty()) keys.pop_back();
    if (ev == E::key && !keys.empty() && duplicate.empty()) {
      if (!keys.back().insert(v.get<std::string>()).second) duplicate = v.get<std::string>();
    }
    return true;
  };
  Json j = Json::parse(body, on_event, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad_request("request body is not valid JSON", "", "invalid_json");
  if (!duplicate.empty())
    return bad_request("request body repeats the key \"" + duplicate + "\" in one object", duplicate,
                       "duplicate_key");
  if (!j.is_object()) return bad_request("request body must be a JSON object, got " + type_name(j));
  return j;
}

ApiResult<ChatCompletionRequest> parse_chat_request(std::string_view body, const ParseLimits& lim) {
  ApiResult<Json> jr = parse_json_object(body);
  if (!jr.ok()) return jr.error();
  const Json& j = jr.value();
  ChatCompletionRequest r;
  if (auto e = read_common(j, &r.common)) return *e;
  if (auto e = read_messages(j, &r)) return *e;
  if (auto e = read_tools(j, &r)) return *e;
  if (auto e = read_thinking(j, &r)) return *e;
  if (auto e = read_response_format(j, &r)) return *e;
  if (auto e = read_bool(j, "logprobs", &r.logprobs)) return *e;
  std::optional<int64_t> top;
  if (auto e = read_int(j, "top_logprobs", 0, kMaxTopLogprobs, &top)) return *e;
  if (top && !r.logprobs) return bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  if (r.logprobs) r.common.sampling.top_logprobs = top ? static_cast<int>(*top) : 0;
  return r;
}

ApiResult<CompletionRequest> parse_completion_request(std::string_view body, const ParseLimits& lim) {
  ApiResult<Json> jr = parse_json_object(body);
  if (!jr.ok()) return jr.error();
  const Json& j = jr.value();
  CompletionRequest r;
  if (auto e = read_common(j, &r.common)) return *e;
  if (!j.contains("prompt") || j["prompt"].is_null()) return bad_request("'prompt' is required", "prompt");
  const Json& p = j["prompt"];
  const char* kPromptTypes = "a string, an array of token ids, or an array of either";
  if (p.is_string()) {
    r.prompts.push_back({p.get<std::string>(), {}});
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    CompletionPrompt cp;
    if (auto e = read_token_ids(p, "prompt", &cp.ids)) return *e;
    r.prompts.push_back(std::move(cp));
  } else if (p.is_array() && !p.empty()) {
    if (p.size() > lim.max_batch_prompts)
      return bad_request("'prompt' batch has " + std::to_string(p.size()) + " prompts; at most " +
                             std::to_string(lim.max_batch_prompts),
                         "prompt");
    for (size_t i = 0; i < p.size(); ++i) {
      CompletionPrompt cp;
      if (p[i].is_string()) {
        cp.text = p[i].get<std::string>();
      } else if (p[i].is_array()) {
        if (auto e = read_token_ids(p[i], "prompt[" + std::to_string(i) + "]", &cp.ids)) return *e;
        if (cp.ids.empty()) return bad_request("'prompt[" + std::to_string(i) + "]' is empty", "prompt");
      } else {
        return wrong_type("prompt", kPromptTypes, p);
      }
      r.prompts.push_back(std::move(cp));
    }
  } else if (p.is_array()) {
    return bad_request("'prompt' must not be empty", "prompt");
  } else {
    return wrong_type("prompt", kPromptTypes, p);
  }
  if (auto e = read_bool(j, "echo", &r.echo)) return *e;
  std::optional<int64_t> lp;
  if (auto e = read_int(j, "logprobs", 0, kMaxTopLogprobs, &lp)) return *e;
  if (lp) r.common.sampling.top_logprobs = static_cast<int>(*lp);
  if (r.common.stream && r.prompts.size() > 1)
    return bad_request("streaming a batch of prompts is not supported; send one prompt per request",
                       "stream");
  return r;
}

}  // namespace ds41::server
