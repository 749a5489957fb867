#include "dist/liveness.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

namespace kestrel::dist {

namespace {
using Clock = LivenessTracker::Clock;
constexpr uint32_t kHelloMagic = 0x4b4c4956;  // "KLIV"
constexpr size_t kHelloBytes = 16;            // magic u32, rank u32, nonce u64 (host order: one machine's build)
constexpr size_t kHostBytes = 256;

int64_t ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

Status sys_error(const std::string& what) {
  return {StatusCode::kUnavailable, "liveness: " + what + ": " + std::strerror(errno)};
}

std::vector<uint8_t> hello(int rank, uint64_t nonce) {
  std::vector<uint8_t> h(kHelloBytes);
  const uint32_t magic = kHelloMagic, r = static_cast<uint32_t>(rank);
  std::memcpy(h.data(), &magic, 4);
  std::memcpy(h.data() + 4, &r, 4);
  std::memcpy(h.data() + 8, &nonce, 8);
  return h;
}

// Reads exactly n bytes before `until` (poll + recv); false on timeout, close or error.
bool read_exact(int fd, uint8_t* out, size_t n, Clock::time_point until) {
  size_t got = 0;
  while (got < n) {
    const int64_t left = ms_between(Clock::now(), until);
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(left));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return false;
    const ssize_t k = ::recv(fd, out + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    got += static_cast<size_t>(k);
  }
  return true;
}

std::string own_host_name() {
  char name[kHostBytes] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return {};
  return name;
}
}  // namespace

std::chrono::milliseconds heartbeat_period(const LivenessOptions& o) {
  return std::max(std::chrono::milliseconds(1), o.window / 5);
}

// ---- LivenessTracker

LivenessTracker::LivenessTracker(std::vector<int> peers, LivenessOptions o, Clock::time_point now) : o_(o) {
  for (int r : peers) peers_.push_back(Peer{r, now, false});
}

LivenessTracker::Peer* LivenessTracker::find(int rank) {
  for (Peer& p : peers_)
    if (p.rank == rank) return &p;
  return nullptr;
}

void LivenessTracker::heard(int rank, Clock::time_point now) {
  if (Peer* p = find(rank); p != nullptr && !p->lost) p->last = std::max(p->last, now);
}

void LivenessTracker::lost(int rank, Clock::time_point) {
  if (Peer* p = find(rank)) p->lost = true;
}

LivenessTracker::Verdict LivenessTracker::check(Clock::time_point now) const {
  Verdict v;
  const Peer* worst = nullptr;
  for (const Peer& p : peers_) {
    const bool bad = p.lost || now - p.last >= o_.window;
    if (!bad) continue;
    // The lost peer first, then the longest silent; peers_ is in rank order, so ties go to the lower rank.
    if (worst == nullptr || (p.lost && !worst->lost) || (p.lost == worst->lost && p.last < worst->last)) worst = &p;
  }
  for (const Peer& p : peers_)
    if (now - p.last >= o_.deadline) v.deadline_passed = true;
  if (worst == nullptr) return v;
  v.healthy = false;
  v.rank = worst->rank;
  const std::string silent = std::to_string(ms_between(worst->last, now)) + " ms";
  v.why = worst->lost ? "rank " + std::to_string(worst->rank) +
                            " closed its liveness connection (its process is gone); last heard " + silent + " ago"
                      : "rank " + std::to_string(worst->rank) + " sent no heartbeat for " + silent +
                            " (frozen, overloaded or unreachable)";
  return v;
}

LivenessTracker::Clock::time_point LivenessTracker::next_change(Clock::time_point now) const {
  auto next = Clock::time_point::max();
  for (const Peer& p : peers_) {
    if (!p.lost && p.last + o_.window > now) next = std::min(next, p.last + o_.window);
    if (p.last + o_.deadline > now) next = std::min(next, p.last + o_.deadline);
  }
  return next;
}

// ---- Liveness

Result<std::unique_ptr<Liveness>> Liveness::open(Communicator& comm, LivenessOptions o) {
  if (o.window.count() < 1 || o.deadline < o.window)
    return invalid_argument("liveness: the window must be at least 1 ms and the deadline at least the window");
  std::unique_ptr<Liveness> l(new Liveness(comm.rank(), comm.size(), o));
  // Rank 0's address and the cell's nonce, broadcast once: [port, nonce, host name].
  std::vector<std::byte> info(8 + 8 + kHostBytes);
  Status local = Status::ok();
  if (l->rank_ == 0) {
    uint16_t port = 0;
    local = l->listen_on_any(port);
    const uint64_t p64 = local.is_ok() ? port : 0;  // port 0 tells the peers that rank 0 failed
    std::random_device rd;
    const uint64_t nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    const std::string host = own_host_name();
    std::memcpy(info.data(), &p64, 8);
    std::memcpy(info.data() + 8, &nonce, 8);
    std::memcpy(info.data() + 16, host.data(), std::min(host.size(), kHostBytes - 1));
  }
  KESTREL_RETURN_IF_ERROR(comm.broadcast(std::span<std::byte>(info), 0));
  KESTREL_RETURN_IF_ERROR(local);
  uint64_t port = 0, nonce = 0;
  std::memcpy(&port, info.data(), 8);
  std::memcpy(&nonce, info.data() + 8, 8);
  if (port == 0) return unavailable("liveness: rank 0 could not listen");
  if (l->rank_ == 0) {
    KESTREL_RETURN_IF_ERROR(l->accept_peers(nonce));
  } else {
    const std::string host(reinterpret_cast<const char*>(info.data() + 16));
    KESTREL_RETURN_IF_ERROR(l->connect_to(host, static_cast<uint16_t>(port), nonce));
  }
  return l;
}

Status Liveness::listen_on_any(uint16_t& port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return sys_error("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return sys_error("bind");
  if (::listen(listen_fd_, std::max(16, size_)) != 0) return sys_error("listen");
  socklen_t len = sizeof a;
  if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return sys_error("getsockname");
  port = ntohs(a.sin_port);
  return Status::ok();
}

Status Liveness::accept_peers(uint64_t nonce) {
  const auto until = Clock::now() + o_.connect_timeout;
  fds_.assign(static_cast<size_t>(size_ - 1), -1);
  ranks_.resize(fds_.size());
  for (int r = 1; r < size_; ++r) ranks_[static_cast<size_t>(r - 1)] = r;
  for (int joined = 0; joined < size_ - 1;) {
    const int64_t left = ms_between(Clock::now(), until);
    pollfd p{listen_fd_, POLLIN, 0};
    const int rc = left > 0 ? ::poll(&p, 1, static_cast<int>(left)) : 0;
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return sys_error("poll");
    if (rc == 0) {
      std::string missing;
      for (size_t i = 0; i < fds_.size(); ++i)
        if (fds_[i] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(ranks_[i]);
      return unavailable("liveness: rank(s) " + missing + " did not connect to rank 0 within " +
                         std::to_string(o_.connect_timeout.count()) + " ms");
    }
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    uint8_t h[kHelloBytes];
    const auto expect = hello(0, nonce);
    uint32_t rank = 0;
    if (!read_exact(fd, h, sizeof h, std::min(until, Clock::now() + std::chrono::seconds(5))) ||
        std::memcmp(h, expect.data(), 4) != 0 || std::memcmp(h + 8, expect.data() + 8, 8) != 0) {
      ::close(fd);  // a stranger (or another cell's late peer): not ours
      continue;
    }
    std::memcpy(&rank, h + 4, 4);
    if (rank < 1 || rank >= static_cast<uint32_t>(size_) || fds_[rank - 1] >= 0) {
      ::close(fd);
      continue;
    }
    fds_[rank - 1] = fd;
    ++joined;
  }
  ::close(listen_fd_);
  listen_fd_ = -1;
  for (int fd : fds_) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return Status::ok();
}

Status Liveness::connect_to(const std::string& host, uint16_t port, uint64_t nonce) {
  // Ranks on rank 0's host use loopback (the host name may not resolve to a local address).
  const std::string target = host == own_host_name() ? "127.0.0.1" : host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(target.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    return unavailable("liveness: rank " + std::to_string(rank_) + " cannot resolve rank 0's host " + target + ": " +
                       gai_strerror(rc));
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd >= 0 && ::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0)
    return sys_error("rank " + std::to_string(rank_) + " cannot connect to rank 0 at " + target + ":" +
                     std::to_string(port));
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const auto h = hello(rank_, nonce);
  if (::send(fd, h.data(), h.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(h.size())) {
    ::close(fd);
    return sys_error("rank " + std::to_string(rank_) + " hello to rank 0");
  }
  fds_ = {fd};
  ranks_ = {0};
  return Status::ok();
}

void Liveness::start(Events events) {
  thread_ = std::thread([this, ev = std::move(events)] { loop(ev); });
}

std::string Liveness::unhealthy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return why_;
}

void Liveness::loop(Events ev) {
  const auto period = heartbeat_period(o_);
  LivenessTracker tracker(ranks_, o_, Clock::now());
  std::vector<pollfd> polls;
  std::vector<size_t> which;
  uint8_t buf[256];
  const uint8_t beat = 'h';
  auto next_beat = Clock::now();
  bool was_healthy = true, deadline_told = false;
  while (!stop_.load()) {
    const auto now = Clock::now();
    if (now >= next_beat) {
      for (size_t i = 0; i < fds_.size(); ++i) {
        if (fds_[i] < 0) continue;
        // Never blocks: a frozen peer's full receive buffer just drops this beat.
        if (::send(fds_[i], &beat, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
            errno != EINTR) {
          tracker.lost(ranks_[i], now);
          ::close(fds_[i]);
          fds_[i] = -1;
        }
      }
      next_beat = now + period;
    }
    polls.clear();
    which.clear();
    for (size_t i = 0; i < fds_.size(); ++i)
      if (fds_[i] >= 0) polls.push_back(pollfd{fds_[i], POLLIN, 0}), which.push_back(i);
    // Wake for the next beat or the moment a peer's window or deadline runs out, whichever comes first (+1 ms:
    // poll's timeout rounds down).
    const auto now2 = Clock::now();
    const auto wake = std::min(next_beat, tracker.next_change(now2));
    const int64_t wait = std::clamp<int64_t>(ms_between(now2, wake) + 1, 0, period.count());
    const int rc = ::poll(polls.data(), polls.size(), static_cast<int>(wait));
    const auto after = Clock::now();
    for (int k = 0; rc > 0 && k < static_cast<int>(polls.size()); ++k) {
      if (polls[k].revents == 0) continue;
      const size_t i = which[k];
      const ssize_t n = ::recv(fds_[i], buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        tracker.heard(ranks_[i], after);
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        tracker.lost(ranks_[i], after);
        ::close(fds_[i]);
        fds_[i] = -1;
      }
    }
    const LivenessTracker::Verdict v = tracker.check(after);
    {
      std::lock_guard<std::mutex> lock(mu_);
      why_ = v.why;
    }
    if (quiet_.load()) continue;
    if (!v.healthy && was_healthy && ev.unhealthy) ev.unhealthy(v.why);
    if (v.healthy && !was_healthy && ev.healthy) ev.healthy("");
    was_healthy = v.healthy;
    if (v.deadline_passed && !deadline_told) {
      deadline_told = true;
      if (ev.deadline) ev.deadline(v.why);
    }
  }
}

Liveness::~Liveness() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

}  // namespace kestrel::dist
