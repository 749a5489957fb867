#include "server/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "server/openai_schema.h"

namespace kestrel::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

constexpr size_t kMaxPendingOutput = 32u << 20;  // a client this far behind is treated as gone
constexpr size_t kMaxWatchBuffer = 64u << 10;    // pipelined bytes buffered while a response is pending
constexpr size_t kMaxLingerBytes = 16u << 20;    // drained after an error response before closing

class Session;

std::string_view sv(beast::string_view v) { return std::string_view(v.data(), v.size()); }

}  // namespace

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  HttpServerOptions opt;
  std::shared_ptr<const Router> router;
  net::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::steady_timer> accept_retry;
  std::vector<std::thread> threads;
  std::atomic<bool> stopping{false}, stopped{false};
  mutable std::mutex mu;
  std::condition_variable cv;
  std::unordered_map<Session*, std::weak_ptr<Session>> open;  // connections whose socket is open

  void do_accept();
  void add(const std::shared_ptr<Session>& s);
  void closed(Session* s) {
    std::lock_guard lock(mu);
    open.erase(s);
    cv.notify_all();
  }
  std::vector<std::shared_ptr<Session>> snapshot() {
    std::lock_guard lock(mu);
    std::vector<std::shared_ptr<Session>> out;
    for (auto& [p, w] : open)
      if (auto s = w.lock()) out.push_back(std::move(s));
    return out;
  }
};

namespace {

// One TCP connection. All members are touched only on the connection's strand.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<HttpServer::Impl> srv, tcp::socket socket)
      : srv_(std::move(srv)), stream_(std::move(socket)) {}

  void start() { net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); }); }
  auto executor() { return stream_.get_executor(); }
  bool gone() const { return gone_.load(); }
  void on_stop() {
    if (!busy_) close();
  }

  // ---- exchange operations (strand only; `gen` guards against stale exchanges) ----
  bool current(uint64_t gen) const { return busy_ && gen == gen_ && !ended_ && !closed_; }
  void respond(uint64_t gen, HttpResponse r) {
    if (!current(gen) || streaming_) return;
    ended_ = true;
    http::response<http::string_body> res{static_cast<http::status>(r.status), 11};
    res.set(http::field::server, "kestrel");
    res.set(http::field::content_type, r.content_type);
    for (auto& [k, v] : r.headers) res.set(k, v);
    res.keep_alive(keep_alive_ && !srv_->stopping);
    res.body() = std::move(r.body);
    res.prepare_payload();
    std::ostringstream os;
    os << res;
    enqueue(os.str(), /*ends=*/true);
  }
  void start_stream(uint64_t gen, int status, const std::string& ctype) {
    if (!current(gen) || streaming_) return;
    streaming_ = true;
    std::string h = "HTTP/1.1 " + std::to_string(status) + " " +
                    std::string(sv(http::obsolete_reason(static_cast<http::status>(status)))) +
                    "\r\nServer: kestrel\r\nContent-Type: " + ctype +
                    "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: " +
                    (keep_alive_ ? "keep-alive" : "close") + "\r\n\r\n";
    enqueue(std::move(h), false);
  }
  void write(uint64_t gen, const std::string& data) {
    if (!current(gen) || !streaming_ || data.empty()) return;
    char hex[24];
    snprintf(hex, sizeof hex, "%zx\r\n", data.size());
    enqueue(hex + data + "\r\n", false);
  }
  void end_stream(uint64_t gen) {
    if (!current(gen) || !streaming_) return;
    ended_ = true;
    enqueue("0\r\n\r\n", true);
  }
  void set_disconnect_cb(uint64_t gen, std::function<void()> cb) {
    if (gen != gen_) return;
    if (closed_ && busy_) return cb();
    if (current(gen)) disconnect_cb_ = std::move(cb);
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    gone_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
    if (auto cb = std::move(disconnect_cb_)) {
      disconnect_cb_ = nullptr;
      cb();
    }
    srv_->closed(this);
  }

 private:
  void do_read() {
    if (closed_) return;
    if (srv_->stopping) return close();
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(srv_->opt.max_header_bytes));
    parser_->body_limit(srv_->opt.max_body_bytes);
    stream_.expires_after(srv_->opt.read_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    const auto& msg = parser_->get();
    size_t count = 0;
    for (auto it = msg.begin(); it != msg.end(); ++it) ++count;
    if (count > srv_->opt.max_headers) return fail(431, "Too many request headers", "header_too_large");
    if (parser_->is_done()) return on_request();
    if (iequals(sv(msg[http::field::expect]), "100-continue")) enqueue("HTTP/1.1 100 Continue\r\n\r\n", false);
    stream_.expires_after(srv_->opt.read_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code e, size_t) {
                       if (e) return self->on_read_error(e);
                       self->on_request();
                     });
  }

  void on_read_error(beast::error_code ec) {
    if (ec == http::error::header_limit) return fail(431, "Request header too large", "header_too_large");
    if (ec == http::error::body_limit) return fail(413, "Request body too large", "request_too_large");
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset || ec == net::error::broken_pipe ||
        ec == net::error::bad_descriptor)
      return close();
    fail(400, "Malformed HTTP request: " + ec.message(), "bad_request");
  }

  // Answers a transport-level error and closes the connection (after draining what the client still sends).
  void fail(int status, std::string message, std::string code) {
    busy_ = true;
    ++gen_;
    ended_ = false;
    streaming_ = false;
    keep_alive_ = false;
    respond(gen_, json_error_response(status, std::move(message), "invalid_request_error", std::move(code)));
  }

  void on_request();

  void enqueue(std::string bytes, bool ends) {
    if (closed_) return;
    out_ += bytes;
    out_ends_ = out_ends_ || ends;
    if (out_.size() > kMaxPendingOutput) return close();
    if (!writing_) flush();
  }
  void flush() {
    writing_ = true;
    inflight_ = std::move(out_);
    out_.clear();
    bool ends = out_ends_;
    out_ends_ = false;
    net::async_write(stream_, net::buffer(inflight_), [self = shared_from_this(), ends](beast::error_code ec, size_t) {
      self->writing_ = false;
      if (ec) return self->close();
      if (ends) return self->exchange_done();
      if (!self->out_.empty()) self->flush();
    });
  }

  void exchange_done() {
    busy_ = false;
    disconnect_cb_ = nullptr;
    bool keep = keep_alive_ && !srv_->stopping;
    if (watching_) {  // one read at a time: the cancelled watch continues with the next read or the linger
      resume_after_watch_ = true;
      linger_after_watch_ = !keep;
      beast::error_code ec;
      stream_.socket().cancel(ec);
      return;
    }
    if (!keep) return linger_close();
    do_read();
  }

  // Watches the socket while a response is pending: EOF or reset means the client went away.
  void watch() {
    if (watching_ || closed_ || buffer_.size() > kMaxWatchBuffer) return;
    watching_ = true;
    stream_.expires_never();
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->watching_ = false;
      if (!ec) self->buffer_.commit(n);
      if (ec && ec != net::error::operation_aborted) return self->close();
      if (self->resume_after_watch_) {
        self->resume_after_watch_ = false;
        return self->linger_after_watch_ ? self->linger_close() : self->do_read();
      }
      if (self->busy_ && !ec) self->watch();
    });
  }

  void linger_close() {
    if (closed_) return;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(1));
    drain();
  }
  void drain() {
    stream_.async_read_some(net::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->lingered_ += n;
      if (ec || self->lingered_ > kMaxLingerBytes) return self->close();
      self->drain();
    });
  }

  std::shared_ptr<HttpServer::Impl> srv_;  // keeps the io_context alive as long as this socket
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::atomic<bool> gone_{false};
  bool closed_ = false, busy_ = false, ended_ = false, streaming_ = false, keep_alive_ = true;
  bool writing_ = false, out_ends_ = false, watching_ = false, resume_after_watch_ = false, linger_after_watch_ = false;
  uint64_t gen_ = 0;
  std::string out_, inflight_;
  std::function<void()> disconnect_cb_;
  std::array<char, 4096> scratch_{};
  size_t lingered_ = 0;
};

class Exchange : public HttpExchange {
 public:
  Exchange(std::shared_ptr<Session> s, std::shared_ptr<HttpServer::Impl> srv, uint64_t gen)
      : s_(std::move(s)), srv_(std::move(srv)), gen_(gen) {}
  ~Exchange() override {
    if (!answered_.exchange(true))
      post_strand([s = s_, g = gen_] {
        s->respond(g, json_error_response(500, "The handler did not answer", "server_error"));
      });
  }
  void respond(HttpResponse r) override {
    answered_ = true;
    post_strand([s = s_, g = gen_, r = std::move(r)]() mutable { s->respond(g, std::move(r)); });
  }
  void start_stream(int status, std::string ctype) override {
    answered_ = true;
    post_strand([s = s_, g = gen_, status, c = std::move(ctype)] { s->start_stream(g, status, c); });
  }
  void write(std::string data) override {
    post_strand([s = s_, g = gen_, d = std::move(data)] { s->write(g, d); });
  }
  void end_stream() override {
    post_strand([s = s_, g = gen_] { s->end_stream(g); });
  }
  void on_disconnect(std::function<void()> cb) override {
    post_strand([s = s_, g = gen_, cb = std::move(cb)]() mutable { s->set_disconnect_cb(g, std::move(cb)); });
  }
  void post(std::function<void()> fn) override { post_strand(std::move(fn)); }
  bool disconnected() const override { return s_->gone(); }

 private:
  template <typename F>
  void post_strand(F&& f) {
    if (srv_->stopped) return;
    net::post(s_->executor(), std::forward<F>(f));
  }
  std::shared_ptr<Session> s_;
  std::shared_ptr<HttpServer::Impl> srv_;
  uint64_t gen_;
  std::atomic<bool> answered_{false};
};

void Session::on_request() {
  auto msg = parser_->release();
  HttpRequest req;
  req.method = std::string(sv(msg.method_string()));
  req.target = std::string(sv(msg.target()));
  size_t q = req.target.find('?');
  req.path = req.target.substr(0, q);
  if (q != std::string::npos) req.query = req.target.substr(q + 1);
  for (const auto& f : msg) req.headers.emplace_back(std::string(sv(f.name_string())), std::string(sv(f.value())));
  req.body = std::move(msg.body());
  keep_alive_ = msg.keep_alive();
  busy_ = true;
  ended_ = false;
  streaming_ = false;
  ++gen_;
  stream_.expires_never();  // a pending response (e.g. a long stream) is not bounded by the read timeout
  auto ex = std::make_shared<Exchange>(shared_from_this(), srv_, gen_);
  watch();
  srv_->router->dispatch(req, ex);
}

}  // namespace

std::string_view HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return {};
}

std::string sse_event(std::string_view payload) {
  std::string s;
  s.reserve(payload.size() + 8);
  s.append("data: ").append(payload).append("\n\n");
  return s;
}

HttpResponse json_error_response(int status, std::string message, std::string type, std::string code) {
  ApiError e{status, std::move(message), std::move(type), {}, std::move(code)};
  return HttpResponse{status, "application/json", e.body(), {}};
}

void Router::add(std::string method, std::string path, HttpHandler handler) {
  routes_.push_back({std::move(method), std::move(path), std::move(handler)});
}

void Router::dispatch(const HttpRequest& req, const std::shared_ptr<HttpExchange>& ex) const {
  try {
    if (filter_ && filter_(req, ex)) return;
    std::string allow;
    for (const auto& r : routes_) {
      if (r.path != req.path) continue;
      if (r.method == req.method) return r.handler(req, ex);
      allow += (allow.empty() ? "" : ", ") + r.method;
    }
    if (!allow.empty()) {
      auto resp = json_error_response(405, "Method " + req.method + " not allowed on " + req.path,
                                      "invalid_request_error", "method_not_allowed");
      resp.headers.emplace_back("Allow", allow);
      return ex->respond(std::move(resp));
    }
    ex->respond(json_error_response(404, "Not found", "invalid_request_error", "not_found"));
  } catch (const std::exception& e) {
    ex->respond(json_error_response(500, std::string("Internal error: ") + e.what(), "server_error"));
  } catch (...) {
    ex->respond(json_error_response(500, "Internal error", "server_error"));
  }
}

void HttpServer::Impl::add(const std::shared_ptr<Session>& s) {
  std::lock_guard lock(mu);
  open.emplace(s.get(), s);
}

void HttpServer::Impl::do_accept() {
  acceptor->async_accept(net::make_strand(ioc), [self = shared_from_this()](beast::error_code ec, tcp::socket sock) {
    if (self->stopping) return;
    if (ec) {  // e.g. EMFILE: back off instead of spinning
      self->accept_retry->expires_after(std::chrono::milliseconds(50));
      self->accept_retry->async_wait([self](beast::error_code) {
        if (!self->stopping) self->do_accept();
      });
      return;
    }
    auto s = std::make_shared<Session>(self, std::move(sock));
    self->add(s);
    s->start();
    self->do_accept();
  });
}

HttpServer::HttpServer(HttpServerOptions options, std::shared_ptr<const Router> router)
    : impl_(std::make_shared<Impl>()) {
  impl_->opt = std::move(options);
  impl_->router = std::move(router);
}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::start() {
  beast::error_code ec;
  auto addr = net::ip::make_address(impl_->opt.address, ec);
  if (ec) return invalid_argument("bad bind address '" + impl_->opt.address + "'");
  tcp::endpoint ep(addr, impl_->opt.port);
  auto strand = net::make_strand(impl_->ioc);
  impl_->acceptor.emplace(strand);
  impl_->accept_retry.emplace(strand);
  auto& acc = *impl_->acceptor;
  if (acc.open(ep.protocol(), ec); ec) return io_error("socket: " + ec.message());
  acc.set_option(net::socket_base::reuse_address(true), ec);
  if (acc.bind(ep, ec); ec) return io_error("bind " + impl_->opt.address + ":" + std::to_string(ep.port()) +
                                            ": " + ec.message());
  if (acc.listen(net::socket_base::max_listen_connections, ec); ec) return io_error("listen: " + ec.message());
  port_ = acc.local_endpoint().port();
  impl_->do_accept();
  int n = std::max(1, impl_->opt.threads);
  for (int i = 0; i < n; ++i) impl_->threads.emplace_back([impl = impl_.get()] { impl->ioc.run(); });
  return Status::ok();
}

void HttpServer::stop() {
  auto& im = *impl_;
  if (im.stopping.exchange(true)) return;
  if (im.acceptor && im.threads.empty()) {
    beast::error_code ec;
    im.acceptor->close(ec);
  } else if (im.acceptor) {
    std::promise<void> done;
    net::dispatch(im.acceptor->get_executor(), [&] {
      beast::error_code ec;
      im.acceptor->close(ec);
      im.accept_retry->cancel();
      done.set_value();
    });
    done.get_future().wait();
  }
  for (auto& s : im.snapshot()) net::post(s->executor(), [s] { s->on_stop(); });
  {
    std::unique_lock lock(im.mu);
    im.cv.wait_for(lock, im.opt.shutdown_grace, [&] { return im.open.empty(); });
  }
  for (auto& s : im.snapshot()) net::post(s->executor(), [s] { s->close(); });
  {
    std::unique_lock lock(im.mu);
    im.cv.wait_for(lock, std::chrono::seconds(2), [&] { return im.open.empty(); });
  }
  im.stopped = true;
  im.ioc.stop();
  for (auto& t : im.threads) t.join();
  im.threads.clear();
  // Run what is still queued (all sockets are closed, so it completes at once) to release the sessions.
  im.ioc.restart();
  im.ioc.poll();
}

int HttpServer::open_connections() const {
  std::lock_guard lock(impl_->mu);
  return static_cast<int>(impl_->open.size());
}

}  // namespace kestrel::server
