// ds41 server: OpenAI-shaped errors ({"error": {"message", "type", "param", "code"}}) with their
// HTTP status, and ApiResult<T> (a value or an ApiError) for the request parsers.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <variant>

#include "core/check.h"
#include "core/status.h"

namespace ds41::server {

struct ApiError {
  int http_status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;      // the offending field ("messages[2].role"), empty when none
  std::string code;       // machine-readable reason ("context_length_exceeded"), empty when none
  int retry_after_s = 0;  // > 0: send a Retry-After header (429 / 503)
};

ApiError bad_request(std::string message, std::string param = "", std::string code = "");
// Maps an engine/library Status: InvalidArgument/OutOfRange -> 400, ResourceExhausted -> 429,
// Unavailable -> 503, anything else -> 500 (server fault, never bad input).
ApiError api_error_from_status(const Status& s, std::string param = "");
// {"error": {...}} (param and code are null when empty, as OpenAI sends them).
nlohmann::ordered_json error_body(const ApiError& e);

template <class T>
class ApiResult {
 public:
  ApiResult(T value) : v_(std::move(value)) {}         // NOLINT: implicit like Result<T>
  ApiResult(ApiError error) : v_(std::move(error)) {}  // NOLINT
  bool ok() const { return v_.index() == 0; }
  T& value() {
    DS41_CHECK(ok());
    return std::get<0>(v_);
  }
  const ApiError& error() const {
    DS41_CHECK(!ok());
    return std::get<1>(v_);
  }

 private:
  std::variant<T, ApiError> v_;
};

// Serializes JSON whose strings may hold model output: invalid UTF-8 becomes U+FFFD instead of
// throwing.
std::string json_text(const nlohmann::ordered_json& j);

}  // namespace ds41::server
