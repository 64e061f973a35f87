// ds41 server: cpp-httplib binding of ApiService (see http_server.h).
#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <thread>

namespace ds41::server {
namespace {

constexpr int kListenBacklog = 1024;
thread_local bool t_over_limit = false;  // this connection exceeds max_connections

// httplib hands each accepted connection to a TaskQueue. This one serves up to `limit`
// connections on its pool and answers the rest on a small side pool with 503 (instead of
// leaving them waiting unseen in a queue).
class ConnectionQueue final : public httplib::TaskQueue {
 public:
  explicit ConnectionQueue(int limit)
      : limit_(std::max(1, limit)), pool_(static_cast<size_t>(limit_)), overflow_(2) {}
  void enqueue(std::function<void()> fn) override {
    if (active_.fetch_add(1) >= limit_) {
      active_.fetch_sub(1);
      overflow_.enqueue([fn = std::move(fn)] {
        t_over_limit = true;
        fn();
        t_over_limit = false;
      });
      return;
    }
    pool_.enqueue([this, fn = std::move(fn)] {
      fn();
      active_.fetch_sub(1);
    });
  }
  void shutdown() override {
    pool_.shutdown();
    overflow_.shutdown();
  }

 private:
  int limit_;
  std::atomic<int> active_{0};
  httplib::ThreadPool pool_, overflow_;
};

void write_error(httplib::Response& res, const ApiError& e) {
  HttpResponse r = error_response(e);
  res.status = r.status;
  for (const auto& [k, v] : r.headers) res.set_header(k, v);
  res.set_content(r.body, r.content_type);
}

}  // namespace

struct HttpServer::Impl {
  HttpServerConfig cfg;
  ApiService* service;
  httplib::Server svr;
  std::thread thread;
  int port = -1;
  int listen_fd = -1;
  std::atomic<bool> capturing{false};
  bool started = false;

  void serve(const httplib::Request& req, httplib::Response& res) {
    HttpRequest r;
    r.method = req.method;
    r.path = req.path;
    r.body = req.body;
    r.remote = req.remote_addr + ":" + std::to_string(req.remote_port);
    for (const auto& [k, v] : req.headers) {
      std::string lk = k;
      std::transform(lk.begin(), lk.end(), lk.begin(), [](unsigned char c) { return std::tolower(c); });
      r.headers.emplace(std::move(lk), v);
    }
    HttpResponse out = service->handle(r);
    res.status = out.status;
    for (const auto& [k, v] : out.headers) res.set_header(k, v);
    if (!out.stream) {
      res.set_content(out.body, out.content_type);
      return;
    }
    std::shared_ptr<BodyStream> body = out.stream;
    res.set_chunked_content_provider(
        out.content_type,
        [body](size_t /*offset*/, httplib::DataSink& sink) {
          std::string chunk;
          if (!body->next(&chunk)) {
            sink.done();
            return true;
          }
          // An empty write would end the response early (httplib treats it as the end).
          if (!chunk.empty() && !sink.write(chunk.data(), chunk.size())) return false;
          return true;
        },
        [body](bool success) { body->close(success); });
  }
};

HttpServer::HttpServer(HttpServerConfig cfg, ApiService* service) : impl_(std::make_unique<Impl>()) {
  impl_->cfg = std::move(cfg);
  impl_->service = service;
}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::start() {
  Impl* m = impl_.get();
  const HttpServerConfig& c = m->cfg;
  const int limit = c.max_connections;
  m->svr.new_task_queue = [limit] { return new ConnectionQueue(limit); };
  m->svr.set_payload_max_length(c.max_body_bytes);
  m->svr.set_read_timeout(c.read_timeout_s, 0);
  m->svr.set_write_timeout(c.write_timeout_s, 0);
  m->svr.set_keep_alive_timeout(c.keep_alive_timeout_s);
  m->svr.set_tcp_nodelay(true);
  // cpp-httplib listens with a backlog of 5 (a compile-time constant of the Debian library). A
  // burst of connections (64 clients opening at once while the accept thread is short of CPU)
  // overflows it: the kernel completes the client's handshake, drops the connection from the
  // full queue, and the client's request dies with a read error. The listening socket passes
  // through the socket-options hook before bind; listen() is called again on it with a real
  // backlog after bind (Linux takes the new value).
  m->listen_fd = -1;
  m->capturing = true;  // only the sockets created by bind below (on this thread)
  m->svr.set_socket_options([m](socket_t sock) {
    int one = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (m->capturing) m->listen_fd = sock;  // the last one created is the one that bound
  });
  m->svr.set_pre_routing_handler([](const httplib::Request&, httplib::Response& res) {
    if (!t_over_limit) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e = api_error_from_status(unavailable("too many open connections; retry later"));
    write_error(res, e);
    res.set_header("Connection", "close");
    return httplib::Server::HandlerResponse::Handled;
  });
  // Errors httplib raises itself (body too large, malformed request line) get OpenAI bodies.
  const size_t max_body = c.max_body_bytes;
  httplib::Server::HandlerWithResponse on_error = [max_body](const httplib::Request&,
                                                             httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.http_status = res.status;
    if (res.status == 413) {
      e.message = "request body is larger than " + std::to_string(max_body) + " bytes";
      e.code = "body_too_large";
    } else {
      e.message = "HTTP error " + std::to_string(res.status);
    }
    write_error(res, e);
    return httplib::Server::HandlerResponse::Handled;
  };
  m->svr.set_error_handler(std::move(on_error));
  m->svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    ApiError e;
    e.http_status = 500;
    e.type = "server_error";
    e.message = "internal error";
    write_error(res, e);
  });
  auto handler = [m](const httplib::Request& req, httplib::Response& res) { m->serve(req, res); };
  m->svr.Get(".*", handler);
  m->svr.Post(".*", handler);
  m->svr.Put(".*", handler);
  m->svr.Delete(".*", handler);
  m->svr.Patch(".*", handler);

  if (c.port == 0) {
    m->port = m->svr.bind_to_any_port(c.host);
    if (m->port < 0) return io_error("cannot bind " + c.host + ":0");
  } else {
    if (!m->svr.bind_to_port(c.host, c.port))
      return io_error("cannot bind " + c.host + ":" + std::to_string(c.port) +
                      " (in use, or not a local address)");
    m->port = c.port;
  }
  m->capturing = false;
  if (m->listen_fd >= 0) ::listen(m->listen_fd, kListenBacklog);  // best effort: 5 stays if refused
  m->started = true;
  m->thread = std::thread([m] { m->svr.listen_after_bind(); });
  return ok_status();
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::stop() {
  if (!impl_ || !impl_->started) return;
  impl_->started = false;
  impl_->svr.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace ds41::server
