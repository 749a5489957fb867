#include "cache/redis_store.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstring>

namespace kestrel {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

timeval to_timeval(int ms) { return timeval{ms / 1000, static_cast<suseconds_t>((ms % 1000) * 1000)}; }

// hiredis writes with write(2): a server that died makes that raise SIGPIPE, whose default action ends the process.
// The signal is blocked on this thread for the duration of a call and, if the call raised it, consumed (libpq does
// the same), so the failure arrives as EPIPE and nothing is changed for the rest of the program.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~SigpipeGuard() {
    sigset_t pending;
    if (!was_pending_ && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

}  // namespace

struct RedisStore::Reply {
  struct Free {
    void operator()(redisReply* r) const { freeReplyObject(r); }
  };
  std::unique_ptr<redisReply, Free> r;
};

Result<std::unique_ptr<RedisStore>> RedisStore::create(RedisStoreOptions opts) {
  if (opts.unix_socket.empty() && (opts.host.empty() || opts.port <= 0 || opts.port > 65535))
    return invalid_argument("redis store: needs host and port, or a unix socket");
  if (opts.connect_timeout_ms <= 0 || opts.command_timeout_ms <= 0)
    return invalid_argument("redis store: timeouts must be positive");
  return std::unique_ptr<RedisStore>(new RedisStore(std::move(opts)));
}

RedisStore::~RedisStore() { disconnect_locked(); }

void RedisStore::disconnect_locked() {
  if (ctx_ != nullptr) redisFree(ctx_);
  ctx_ = nullptr;
}

Status RedisStore::connect_locked() {
  const timeval ct = to_timeval(opts_.connect_timeout_ms);
  redisContext* c = opts_.unix_socket.empty() ? redisConnectWithTimeout(opts_.host.c_str(), opts_.port, ct)
                                              : redisConnectUnixWithTimeout(opts_.unix_socket.c_str(), ct);
  const std::string where = opts_.unix_socket.empty() ? opts_.host + ":" + std::to_string(opts_.port)
                                                      : opts_.unix_socket;
  if (c == nullptr) return unavailable("redis store: cannot allocate a connection to " + where);
  if (c->err != 0) {
    const std::string why = c->errstr;
    redisFree(c);
    return unavailable("redis store: cannot connect to " + where + ": " + why);
  }
  if (redisSetTimeout(c, to_timeval(opts_.command_timeout_ms)) != REDIS_OK) {
    redisFree(c);
    return unavailable("redis store: cannot set the command timeout on " + where);
  }
  ctx_ = c;
  ++connects_;
  return Status::ok();
}

Result<RedisStore::Reply> RedisStore::command(int argc, const char** argv, const size_t* lens) {
  SigpipeGuard guard;
  if (ctx_ == nullptr) KESTREL_RETURN_IF_ERROR(connect_locked());
  Reply reply{std::unique_ptr<redisReply, Reply::Free>(
      static_cast<redisReply*>(redisCommandArgv(ctx_, argc, argv, lens)))};
  if (reply.r == nullptr) {
    // A timeout shows as EAGAIN ("Resource temporarily unavailable"): the reply may still arrive later, so the
    // stream is out of step and the connection must go.
    const std::string why = ctx_->errstr[0] != '\0' ? ctx_->errstr : "no reply";
    disconnect_locked();
    return unavailable(std::string("redis store: ") + argv[0] + " failed: " + why);
  }
  if (reply.r->type == REDIS_REPLY_ERROR)
    return io_error(std::string("redis store: ") + argv[0] + ": " + std::string(reply.r->str, reply.r->len));
  return reply;
}

Status RedisStore::put(const Digest& key, std::span<const uint8_t> bytes) {
  const int64_t t0 = now_ns();
  const std::string k = redis_key(key);
  const char* value = bytes.empty() ? "" : reinterpret_cast<const char*>(bytes.data());
  const char* argv[] = {"SET", k.data(), value, "NX"};
  const size_t lens[] = {3, k.size(), bytes.size(), 2};
  std::lock_guard<std::mutex> lock(mu_);
  auto r = command(4, argv, lens);
  stats_.write_ns += now_ns() - t0;
  if (!r) {
    ++stats_.errors;
    return r.error();
  }
  if (r->r->type == REDIS_REPLY_NIL) {  // NX: already there
    ++stats_.duplicates;
  } else {
    ++stats_.writes;
    stats_.write_bytes += static_cast<int64_t>(bytes.size());
  }
  return Status::ok();
}

Result<std::optional<std::vector<uint8_t>>> RedisStore::get(const Digest& key) {
  const int64_t t0 = now_ns();
  const std::string k = redis_key(key);
  const char* argv[] = {"GET", k.data()};
  const size_t lens[] = {3, k.size()};
  std::lock_guard<std::mutex> lock(mu_);
  auto r = command(2, argv, lens);
  stats_.read_ns += now_ns() - t0;
  if (!r) {
    ++stats_.errors;
    return r.error();
  }
  ++stats_.reads;
  if (r->r->type == REDIS_REPLY_NIL) return std::optional<std::vector<uint8_t>>();
  if (r->r->type != REDIS_REPLY_STRING) {
    ++stats_.errors;
    return io_error("redis store: GET " + k + " is not a string value");
  }
  ++stats_.hits;
  stats_.read_bytes += static_cast<int64_t>(r->r->len);
  const auto* p = reinterpret_cast<const uint8_t*>(r->r->str);
  return std::optional<std::vector<uint8_t>>(std::vector<uint8_t>(p, p + r->r->len));
}

Result<bool> RedisStore::contains(const Digest& key) {
  const std::string k = redis_key(key);
  const char* argv[] = {"EXISTS", k.data()};
  const size_t lens[] = {6, k.size()};
  std::lock_guard<std::mutex> lock(mu_);
  auto r = command(2, argv, lens);
  if (!r) {
    ++stats_.errors;
    return r.error();
  }
  return r->r->type == REDIS_REPLY_INTEGER && r->r->integer > 0;
}

Status RedisStore::erase(const Digest& key) {
  const std::string k = redis_key(key);
  const char* argv[] = {"DEL", k.data()};
  const size_t lens[] = {3, k.size()};
  std::lock_guard<std::mutex> lock(mu_);
  auto r = command(2, argv, lens);
  if (!r) {
    ++stats_.errors;
    return r.error();
  }
  return Status::ok();
}

Status RedisStore::ping() {
  const char* argv[] = {"PING"};
  const size_t lens[] = {4};
  std::lock_guard<std::mutex> lock(mu_);
  auto r = command(1, argv, lens);
  if (!r) {
    ++stats_.errors;
    return r.error();
  }
  return Status::ok();
}

int64_t RedisStore::connects() const {
  std::lock_guard<std::mutex> lock(mu_);
  return connects_;
}

TierStoreStats RedisStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  TierStoreStats s = stats_;
  s.objects = -1;
  s.bytes = -1;
  return s;
}

}  // namespace kestrel
