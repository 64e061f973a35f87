// ds41 CLI: how `ds41 chat` reaches a model — one streaming chat-completions call, either to an
// in-process server::ApiService (--model: the same request path as `ds41 serve`, no socket) or
// to a running server over HTTP (--url, cpp-httplib client). Both yield the parsed SSE chunks.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"
#include "server/api_service.h"

namespace ds41::cli {

// Splits a Server-Sent-Events byte stream into the JSON of its `data:` lines ("[DONE]" ends it).
class SseReader {
 public:
  // Feeds bytes; calls on_data for each complete data line. Returns false once [DONE] was seen.
  bool feed(std::string_view bytes, const std::function<void(const std::string& data)>& on_data);

 private:
  std::string buf_;
  bool done_ = false;
};

class ChatTransport {
 public:
  virtual ~ChatTransport() = default;
  // Sends one streaming request (`request` has "stream": true) and calls on_chunk for each
  // chunk object. An HTTP error becomes a Status whose message is the API's error message.
  virtual Status stream(const nlohmann::json& request,
                        const std::function<void(const nlohmann::json& chunk)>& on_chunk) = 0;
};

// `service` must outlive the transport.
std::unique_ptr<ChatTransport> make_service_transport(server::ApiService* service);
// url: "http://host:port"; api_key empty: none.
Result<std::unique_ptr<ChatTransport>> make_http_transport(const std::string& url,
                                                           const std::string& api_key);

}  // namespace ds41::cli
