// ds41 server: the HTTP transport (cpp-httplib from Debian: a bounded pool of connection threads,
// blocking sockets). Owns binding, limits (body size -> 413, concurrent connections -> 503 with
// Retry-After, read/write/keep-alive timeouts) and chunked SSE writing; a failed write (client
// gone) closes the response's BodyStream so the request is cancelled. All API logic is in
// ApiService; swapping the HTTP library means replacing http_server.cpp only.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/status.h"
#include "server/api_service.h"

namespace ds41::server {

struct HttpServerConfig {
  std::string host = "127.0.0.1";  // loopback unless --host says otherwise
  int port = 8000;                 // 0: an ephemeral port (tests)
  size_t max_body_bytes = size_t{8} << 20;
  int max_connections = 256;  // open connections served at once; more get 503
  int read_timeout_s = 30;    // a client that sends nothing for this long is dropped
  int write_timeout_s = 30;   // a client that reads nothing for this long is dropped
  int keep_alive_timeout_s = 5;
};

class HttpServer {
 public:
  // `service` must outlive the server.
  HttpServer(HttpServerConfig cfg, ApiService* service);
  ~HttpServer();  // stop()
  // Binds and serves on a background thread. Errors name the address.
  Status start();
  int port() const;  // the bound port (after start)
  // Stops accepting, ends streams at their next chunk and joins the connection threads.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds41::server
