// Asynchronous HTTP/1.1 server (Boost.Beast/Asio) with a fixed pool of I/O threads, keep-alive, limits,
// chunked (SSE) streaming and client-disconnect notification.
//
// Threading: `threads` I/O threads run one io_context; each connection is serialised on its own strand.
// Handlers are called on an I/O thread and must not block: they answer through the HttpExchange, possibly
// later and from any thread (every HttpExchange method is thread-safe and posts to the connection's strand).
// A connection serves one request at a time (pipelined requests wait); while a response is pending the
// socket is watched so a client that goes away is reported at once via on_disconnect().
//
// Limits (all answered, then the connection is closed): request header bytes → 431, body bytes → 413,
// header count → 431, malformed request / bad chunked encoding → 400. A header or body that does not arrive
// within read_timeout closes the connection (slowloris).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"

namespace kestrel::server {

struct HttpRequest {
  std::string method;  // as sent, e.g. "POST"
  std::string target;  // raw request-target
  std::string path;    // target before '?'
  std::string query;   // target after '?' (may be empty)
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // Case-insensitive header lookup; empty if absent.
  std::string_view header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

// One request in flight. Thread-safe. Exactly one of respond() or start_stream()...end_stream() should be
// used; calls after the exchange has ended (or after the client went away) are ignored. Dropping the last
// reference without answering sends a 500.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual void respond(HttpResponse response) = 0;
  // Starts a chunked response (e.g. text/event-stream); write() appends one chunk; end_stream() finishes it.
  virtual void start_stream(int status, std::string content_type) = 0;
  virtual void write(std::string data) = 0;
  virtual void end_stream() = 0;
  // `cb` runs once, on an I/O thread, if the client disconnects (or the server force-closes) before the
  // exchange ends; immediately if that already happened. Replaces any previous callback.
  virtual void on_disconnect(std::function<void()> cb) = 0;
  // Runs fn on the connection's strand (serialised with this exchange's own work); dropped after shutdown.
  virtual void post(std::function<void()> fn) = 0;
  virtual bool disconnected() const = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, std::shared_ptr<HttpExchange>)>;

// Exact method + path routing. Unknown path → 404; known path, other method → 405 with Allow.
class Router {
 public:
  void add(std::string method, std::string path, HttpHandler handler);
  // Called before routing for every request; returning true means it answered (e.g. 401).
  void set_filter(std::function<bool(const HttpRequest&, const std::shared_ptr<HttpExchange>&)> filter) {
    filter_ = std::move(filter);
  }
  void dispatch(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) const;

 private:
  struct Route {
    std::string method, path;
    HttpHandler handler;
  };
  std::vector<Route> routes_;
  std::function<bool(const HttpRequest&, const std::shared_ptr<HttpExchange>&)> filter_;
};

struct HttpServerOptions {
  std::string address = "127.0.0.1";
  uint16_t port = 8000;  // 0 → ephemeral (see HttpServer::port())
  int threads = 2;
  std::chrono::milliseconds read_timeout{30'000};    // per header / per body
  std::chrono::milliseconds shutdown_grace{5'000};  // in-flight responses may finish within this
  size_t max_header_bytes = 16 * 1024;
  size_t max_headers = 100;
  size_t max_body_bytes = 8 * 1024 * 1024;
};

// "data: <payload>\n\n" (payload must not contain newlines; JSON dumps do not).
std::string sse_event(std::string_view payload);
// A JSON error body {"error":{...}} as the OpenAI API uses for transport-level errors.
HttpResponse json_error_response(int status, std::string message, std::string type, std::string code = {});

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, std::shared_ptr<const Router> router);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the I/O threads. Error if the address is bad or the port is taken.
  Status start();
  uint16_t port() const { return port_; }
  // Stops accepting, closes idle connections, waits up to shutdown_grace for in-flight responses, then
  // closes the rest (firing on_disconnect) and joins the threads. Idempotent; not callable from a handler.
  void stop();
  int open_connections() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace kestrel::server
