// The prefill side of disagg_peer_test, as its own process: connects to the test (decode side), waits for the
// destinations of one transfer, and then, by its behaviour argument:
//   normal: puts a deterministic pattern into every range (byte j of range i = (7 i + 13 j + 1) mod 256), flushes,
//           sends the completion;
//   stop:   raises SIGSTOP (a frozen process: no puts, no heartbeats) and does the normal work if continued;
//   hold:   prints "held" and only progresses (heartbeats), waiting to be killed;
//   own:    does not wait for destinations: allocates a region through UCX (shared memory when the context has
//           it), prints "key <packed remote key hex>" and only progresses (heartbeats), waiting to be killed.
// Afterwards it progresses until the decode side has closed (its endpoint fails, or it has been silent for 500 ms).
// Usage: disagg_peer address|sockaddr normal|stop|hold|own TRANSFER_ID. Prints "<instance> <pid> <address hex|port>"
// first; in address mode it reads the decode worker's address (hex) from stdin before connecting.
#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "disagg/endpoint.h"
#include "disagg/listener.h"
#include "disagg/transfer.h"
#include "disagg/worker.h"
#include "hex.h"

using namespace kestrel::disagg;
using std::chrono::milliseconds;
using testing::from_hex;
using testing::to_hex;

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "disagg_peer: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return fail("usage: disagg_peer address|sockaddr normal|stop|hold|own TRANSFER_ID");
  const std::string mode = argv[1], behaviour = argv[2];
  const uint64_t id = std::stoull(argv[3]);
  WorkerOptions options;
  auto worker = Worker::create(options);
  if (!worker) return fail(worker.error().message());
  Worker& w = **worker;
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Endpoint> ep;
  if (mode == "address") {
    std::cout << w.instance() << " " << getpid() << " " << to_hex(w.address().value()) << std::endl;
    std::string peer;
    if (!std::getline(std::cin, peer)) return fail("no decode address on stdin");
    auto e = Endpoint::connect_address(w, from_hex(peer));
    if (!e) return fail(e.error().message());
    ep = std::move(*e);
  } else {
    auto l = Listener::create(w, "127.0.0.1", 0);
    if (!l) return fail(l.error().message());
    listener = std::move(*l);
    std::cout << w.instance() << " " << getpid() << " " << listener->port() << std::endl;
    auto e = listener->accept(Deadline::after(milliseconds(10000)));
    if (!e) return fail(e.error().message());
    ep = std::move(*e);
  }
  if (behaviour == "own") {
    auto region = Region::allocate(w.shared_context(), size_t{8} << 20);
    if (!region) return fail(region.error().message());
    std::cout << "key " << to_hex((*region)->packed_rkey()) << std::endl;
    Deadline limit = Deadline::after(milliseconds(20000));
    while (!limit.expired() && !ep->failed()) {
      if (!w.progress()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return 0;
  }
  uint64_t sender = 0;
  auto dst = wait_destinations(w, id, Deadline::after(milliseconds(10000)), &sender);
  if (!dst) return fail(dst.error().message());
  ep->set_peer(sender);

  if (behaviour == "stop") raise(SIGSTOP);
  if (behaviour == "hold") {
    std::cout << "held" << std::endl;
    Deadline limit = Deadline::after(milliseconds(20000));
    while (!limit.expired() && !ep->failed()) {
      if (!w.progress()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return 0;
  }
  std::vector<std::vector<std::byte>> data;
  std::vector<std::span<const std::byte>> sources;
  for (size_t i = 0; i < dst->ranges.size(); ++i) {
    std::vector<std::byte> b(dst->ranges[i].length);
    for (size_t j = 0; j < b.size(); ++j) b[j] = static_cast<std::byte>((7 * i + 13 * j + 1) % 256);
    data.push_back(std::move(b));
  }
  for (const auto& b : data) sources.emplace_back(b);
  OutgoingTransfer out(id, *ep, std::move(*dst), sources);
  kestrel::Status st = out.run(Deadline::after(milliseconds(30000)));
  if (!st.is_ok()) return fail(st.message());
  // Until the decode side is done with us.
  Deadline limit = Deadline::after(milliseconds(10000));
  while (!limit.expired() && !ep->failed()) {
    auto heard = w.last_heard(sender);
    if (heard && Clock::now() - *heard > milliseconds(500)) break;
    if (!w.progress()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return 0;
}
