// FakeCommunicator: N ranks as N threads of one process, for unit tests of code above dist/ (no MPI needed).
//
// The ranks share a FakeHub. A collective posts this rank's buffers on the hub, waits until every rank has
// posted, copies what it needs straight out of the peers' buffers, and waits again so that no rank returns (and
// reuses its send buffer) while a peer is still reading it. The reductions are the base class's, so the fake
// and MPI give the same bits.
//
// A rank that never arrives (a test that forgot a call, a rank that threw) would hang its peers forever; every
// wait is bounded instead: after `timeout` the hub is marked broken, and that call and every later one on any
// rank returns kUnavailable naming the collective and the ranks that did not arrive.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace kestrel::dist {

class FakeHub {
 public:
  struct Options {
    std::chrono::milliseconds timeout{60000};
  };
  // What one rank posts for the collective in progress; pointers stay valid until the second wait.
  struct Posting {
    const char* op = nullptr;
    bool valid = true;  // false: this rank's own arguments were bad; every rank then fails the call
    const std::byte* data = nullptr;
    size_t bytes = 0;
    const size_t* counts = nullptr;  // all_to_all_v: this rank's send counts / displacements
    const size_t* displs = nullptr;
    int root = -1;
  };

  FakeHub(int nranks, Options options);
  int size() const { return nranks_; }
  Posting& posting(int rank) { return postings_[rank]; }
  // Blocks until all ranks have called wait for this round, or the timeout breaks the hub.
  Status wait(int rank, const char* op);

 private:
  const int nranks_;
  const Options options_;
  std::vector<Posting> postings_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  unsigned long long generation_ = 0;
  std::vector<bool> here_;  // ranks that arrived in the current round
  bool broken_ = false;
  std::string broken_reason_;
};

class FakeCommunicator final : public Communicator {
 public:
  FakeCommunicator(std::shared_ptr<FakeHub> hub, int rank);
  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  Status all_gather_v_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                            std::span<const size_t> recv_counts, std::span<const size_t> recv_displs) override;
  Status all_to_all_v_bytes(std::span<const std::byte> send, std::span<const size_t> send_counts,
                            std::span<const size_t> send_displs, std::span<std::byte> recv,
                            std::span<const size_t> recv_counts, std::span<const size_t> recv_displs) override;
  Status broadcast_bytes(std::span<std::byte> data, int root) override;
  Status barrier() override;

 private:
  // Posts, waits for the peers, runs `read` (which may only read peers' postings), waits again.
  Status round(const char* op, const FakeHub::Posting& mine, const std::function<Status()>& read);

  std::shared_ptr<FakeHub> hub_;
  int rank_;
};

// Runs body(communicator) on nranks threads sharing one hub and joins them.
void run_fake_ranks(int nranks, const std::function<void(Communicator&)>& body, FakeHub::Options options = {});

}  // namespace kestrel::dist
