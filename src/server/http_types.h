// ds41 server: transport-neutral HTTP request/response values. The API service (api_service.h)
// maps requests to responses without knowing the HTTP library; http_server.cpp binds them to
// cpp-httplib, so the library can be swapped (e.g. for Boost.Beast) by replacing one file.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ds41::server {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string path;                            // without the query string
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::string remote;  // "addr:port", for logs

  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// A body produced while it is sent (Server-Sent Events). The transport calls next() on the
// connection's thread until it returns false; next() blocks for at most ~100 ms and may return
// true with an empty chunk (nothing to send yet). close(completed) is called exactly once: with
// false when the client went away or the server stopped before the end.
struct BodyStream {
  std::function<bool(std::string* chunk)> next;
  std::function<void(bool completed)> close;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  std::shared_ptr<BodyStream> stream;  // set: body is streamed (content_type text/event-stream)
};

}  // namespace ds41::server
