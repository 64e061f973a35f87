// ds41 server: OpenAI-shaped errors (see api_error.h).
#include "server/api_error.h"

namespace ds41::server {

ApiError bad_request(std::string message, std::string param, std::string code) {
  ApiError e;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

ApiError api_error_from_status(const Status& s, std::string param) {
  ApiError e;
  e.message = s.message();
  e.param = std::move(param);
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange: e.http_status = 400; break;
    case StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.code = "queue_full";
      e.retry_after_s = 1;
      break;
    case StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "service_unavailable";
      e.retry_after_s = 5;
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

nlohmann::ordered_json error_body(const ApiError& e) {
  nlohmann::ordered_json err;
  err["message"] = e.message;
  err["type"] = e.type;
  err["param"] = e.param.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(e.param);
  err["code"] = e.code.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(e.code);
  return {{"error", err}};
}

std::string json_text(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace ds41::server
