// ds41 CLI: chat transports for `ds41 chat` (see chat_client.h).
#include "chat_client.h"

#include <httplib.h>

namespace ds41::cli {
namespace {

using Json = nlohmann::json;

// The API's error message from an error body, else the body itself.
Status http_error(int status, const std::string& body) {
  Json j = Json::parse(body, nullptr, false);
  std::string msg = body;
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string())
    msg = j["error"]["message"].get<std::string>();
  return Status(status == 401 ? StatusCode::kFailedPrecondition : StatusCode::kInvalidArgument,
                "HTTP " + std::to_string(status) + ": " + msg);
}

// Feeds SSE bytes through a reader, parsing each data line into a chunk.
Status feed_chunks(SseReader* sse, std::string_view bytes, const std::function<void(const Json&)>& on_chunk,
                   bool* done) {
  Status st = ok_status();
  *done = !sse->feed(bytes, [&](const std::string& data) {
    if (!st.ok()) return;
    Json j = Json::parse(data, nullptr, false);
    if (j.is_discarded()) {
      st = internal_error("bad SSE data from the server: " + data.substr(0, 200));
      return;
    }
    if (j.contains("error")) {
      st = http_error(500, data);
      return;
    }
    on_chunk(j);
  });
  return st;
}

class ServiceTransport final : public ChatTransport {
 public:
  explicit ServiceTransport(server::ApiService* s) : service_(s) {}
  Status stream(const Json& request, const std::function<void(const Json&)>& on_chunk) override {
    server::HttpRequest req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.remote = "ds41-chat";
    req.body = request.dump();
    if (!service_->config().api_key.empty())
      req.headers["authorization"] = "Bearer " + service_->config().api_key;
    server::HttpResponse res = service_->handle(req);
    if (!res.stream) return http_error(res.status, res.body);
    SseReader sse;
    std::string chunk;
    bool done = false;
    Status st = ok_status();
    while (st.ok() && !done && res.stream->next(&chunk)) {
      st = feed_chunks(&sse, chunk, on_chunk, &done);
      chunk.clear();
    }
    res.stream->close(st.ok());
    return st;
  }

 private:
  server::ApiService* service_;
};

class HttpTransport final : public ChatTransport {
 public:
  HttpTransport(const std::string& url, std::string key) : client_(url), key_(std::move(key)) {
    client_.set_read_timeout(600, 0);
  }
  Status stream(const Json& request, const std::function<void(const Json&)>& on_chunk) override {
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.body = request.dump();
    req.set_header("Content-Type", "application/json");
    req.set_header("Accept", "text/event-stream");
    if (!key_.empty()) req.set_header("Authorization", "Bearer " + key_);
    int status = 0;
    std::string error_body;
    SseReader sse;
    Status st = ok_status();
    bool done = false;
    req.response_handler = [&](const httplib::Response& r) {
      status = r.status;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (status != 200) {
        error_body.append(data, n);
        return true;
      }
      st = feed_chunks(&sse, std::string_view(data, n), on_chunk, &done);
      return st.ok();
    };
    httplib::Result r = client_.send(req);
    if (!st.ok()) return st;
    if (!r) return unavailable("cannot reach the server: " + httplib::to_string(r.error()));
    if (status != 200) return http_error(status, error_body.empty() ? r->body : error_body);
    return ok_status();
  }

 private:
  httplib::Client client_;
  std::string key_;
};

}  // namespace

bool SseReader::feed(std::string_view bytes, const std::function<void(const std::string& data)>& on_data) {
  if (done_) return false;
  buf_.append(bytes);
  size_t cut;
  while ((cut = buf_.find('\n')) != std::string::npos) {
    std::string line = buf_.substr(0, cut);
    buf_.erase(0, cut + 1);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("data:", 0) != 0) continue;
    std::string data = line.substr(5);
    if (!data.empty() && data.front() == ' ') data.erase(0, 1);
    if (data == "[DONE]") {
      done_ = true;
      return false;
    }
    on_data(data);
  }
  return true;
}

std::unique_ptr<ChatTransport> make_service_transport(server::ApiService* service) {
  return std::make_unique<ServiceTransport>(service);
}

Result<std::unique_ptr<ChatTransport>> make_http_transport(const std::string& url,
                                                           const std::string& api_key) {
  if (url.rfind("http://", 0) != 0)
    return invalid_argument("--url must start with http:// (e.g. http://127.0.0.1:8000), got '" + url + "'");
  return std::unique_ptr<ChatTransport>(std::make_unique<HttpTransport>(url, api_key));
}

}  // namespace ds41::cli
