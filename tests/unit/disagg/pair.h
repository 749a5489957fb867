// Test fixtures for disagg/: a decode worker and a prefill worker in one process, connected both ways, a
// scripted fault policy, and the transports UCX_TLS asks for (the ctest entries set it to shm or tcp).
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "disagg/endpoint.h"
#include "disagg/fault_policy.h"
#include "disagg/listener.h"
#include "disagg/worker.h"

namespace kestrel::disagg::testing {

// Faults in the order they are to be applied: put faults by put index, dropped message kinds (every message of
// the kind, or only the n-th, counting from 0), and a stall switch.
class ScriptedFaults : public FaultPolicy {
 public:
  std::vector<std::pair<size_t, PutFault>> puts;  // (put index, fault)
  std::set<uint16_t> dropped_kinds;
  std::set<std::pair<uint16_t, size_t>> dropped_nth;  // (kind, n)
  std::atomic<bool> stalled{false};
  size_t puts_seen = 0;
  std::map<uint16_t, size_t> messages_seen;  // by kind

  PutFault on_put(uint64_t, size_t index, size_t) override {
    ++puts_seen;
    for (const auto& [i, f] : puts) {
      if (i == index) return f;
    }
    return {};
  }
  bool drop_message(uint16_t kind) override {
    const size_t n = messages_seen[kind]++;
    return dropped_kinds.count(kind) != 0 || dropped_nth.count({kind, n}) != 0;
  }
  bool stall_progress() override { return stalled; }
};

// The transport names a UCX_TLS value in these tests may produce on its endpoints' lanes.
inline std::set<std::string> expected_transports() {
  const char* tls = std::getenv("UCX_TLS");
  std::string v = tls == nullptr ? "" : tls;
  if (v == "tcp") return {"tcp"};
  if (v == "shm") return {"posix", "sysv", "cma", "xpmem", "knem"};
  return {};
}

// Every lane of the endpoint uses one of the transports UCX_TLS selects (skipped when UCX_TLS is another value).
inline void expect_transports(const Endpoint& ep) {
  std::set<std::string> allowed = expected_transports();
  if (allowed.empty()) return;
  std::vector<std::string> used = ep.transports();
  ASSERT_FALSE(used.empty()) << "no lanes reported";
  for (const std::string& t : used) EXPECT_TRUE(allowed.count(t) != 0) << "lane uses " << t;
}

// Closes `ep` while another thread progresses `peer`'s worker: a healthy close flushes, and the flush completes
// only when the peer answers (two processes progress by themselves; two workers in one test need the help).
inline Status close_with_peer(Endpoint& ep, Worker& peer, std::chrono::milliseconds limit) {
  std::atomic<bool> stop{false};
  std::thread t([&] {
    while (!stop) {
      if (!peer.progress()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  Status st = ep.close(Deadline::after(limit));
  stop = true;
  t.join();
  return st;
}

}  // namespace kestrel::disagg::testing
