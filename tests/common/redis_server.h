// A redis-server child for the tests of the Redis tier (cache/redis_store.h and the prefix cache's L4 wiring): each
// test starts its own, without persistence, on a unix socket in a scratch directory (and a TCP port if asked), and
// can kill it (SIGKILL), stall it (SIGSTOP) and resume it (SIGCONT). KESTREL_REDIS_SERVER names the binary (default:
// redis-server on PATH); without one a test skips, or fails where CI (or KESTREL_CI) is set.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cache/redis_store.h"

extern char** environ;

namespace kestrel::testing {

inline std::string find_redis_server() {
  // An explicit binary is the only candidate, so pointing it at nothing shows what a machine without one does.
  if (const char* p = std::getenv("KESTREL_REDIS_SERVER"); p && *p) return ::access(p, X_OK) == 0 ? p : "";
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/bin:/usr/sbin:/usr/local/bin";
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find(':', start), path.size());
    const std::string cand = path.substr(start, end - start) + "/redis-server";
    if (end > start && ::access(cand.c_str(), X_OK) == 0) return cand;
    start = end + 1;
  }
  return "";
}

inline bool in_ci() {
  for (const char* var : {"CI", "KESTREL_CI"}) {
    const char* v = std::getenv(var);
    if (v && *v && std::string(v) != "0") return true;
  }
  return false;
}

inline int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// One redis-server child without persistence, on a unix socket in a scratch directory (and a TCP port if asked).
class RedisServer {
 public:
  RedisServer(std::string binary, std::string dir, int tcp_port)
      : binary_(std::move(binary)), dir_(std::move(dir)), port_(tcp_port) {}
  ~RedisServer() { kill9(); }
  std::string socket() const { return dir_ + "/redis.sock"; }
  int port() const { return port_; }

  // Starts the server and waits until it answers PING.
  bool start() {
    std::vector<std::string> args = {binary_,       "--port",        std::to_string(port_),
                                      "--bind",      "127.0.0.1",     "--unixsocket",
                                      socket(),      "--unixsocketperm", "700",
                                      "--save",      "",              "--appendonly",
                                      "no",          "--dir",         dir_,
                                      "--logfile",   dir_ + "/redis.log"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (::posix_spawn(&pid_, binary_.c_str(), nullptr, nullptr, argv.data(), environ) != 0) return false;
    RedisStoreOptions o;
    o.unix_socket = socket();
    auto probe = RedisStore::create(o);
    for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10); std::chrono::steady_clock::now() < deadline;) {
      if ((*probe)->ping().is_ok()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  void kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
    paused_ = false;
  }
  // Both return once the child is seen stopped / running again (a signal is delivered asynchronously: a server
  // still running for a moment after kill() could answer a request the test means to stall).
  // Each is a no-op unless the server is running / stopped (a teardown may resume a server it never paused).
  void pause() {
    if (pid_ <= 0 || paused_) return;
    ::kill(pid_, SIGSTOP);
    int st = 0;
    while (::waitpid(pid_, &st, WUNTRACED) < 0 && errno == EINTR) {
    }
    paused_ = true;
  }
  void resume() {
    if (pid_ <= 0 || !paused_) return;
    ::kill(pid_, SIGCONT);
    int st = 0;
    while (::waitpid(pid_, &st, WCONTINUED) < 0 && errno == EINTR) {
    }
    paused_ = false;
  }

 private:
  std::string binary_, dir_;
  int port_;
  pid_t pid_ = -1;
  bool paused_ = false;
};

// Skips the calling test (or fails it in CI) when there is no redis-server; returns its path otherwise.
#define KESTREL_REQUIRE_REDIS_SERVER(path_var)                                                                \
  const std::string path_var = ::kestrel::testing::find_redis_server();                                        \
  if (path_var.empty()) {                                                                                      \
    const char* why_ = "redis-server is not installed (Debian package redis-server; scripts/install-deps.sh)"; \
    if (::kestrel::testing::in_ci()) GTEST_FAIL() << "Redis test cannot run: " << why_;                       \
    GTEST_SKIP() << why_;                                                                                      \
  }

}  // namespace kestrel::testing
