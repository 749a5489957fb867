#include "dist/fake_communicator.h"

#include <cstring>
#include <thread>

namespace kestrel::dist {

FakeHub::FakeHub(int nranks, Options options)
    : nranks_(nranks), options_(options), postings_(nranks), here_(nranks, false) {}

Status FakeHub::wait(int rank, const char* op) {
  std::unique_lock<std::mutex> lock(mu_);
  if (broken_) return unavailable(broken_reason_);
  const unsigned long long gen = generation_;
  here_[rank] = true;
  if (++arrived_ == nranks_) {
    arrived_ = 0;
    here_.assign(nranks_, false);
    ++generation_;
    cv_.notify_all();
    return Status::ok();
  }
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  if (!cv_.wait_until(lock, deadline, [&] { return generation_ != gen || broken_; })) {
    std::string missing;
    for (int r = 0; r < nranks_; ++r)
      if (!here_[r]) missing += (missing.empty() ? "" : ",") + std::to_string(r);
    broken_ = true;
    broken_reason_ = "dist: fake " + std::string(op) + ": rank " + std::to_string(rank) + " waited " +
                     std::to_string(options_.timeout.count()) + " ms; rank(s) " + missing +
                     " never arrived (the hub is now broken)";
    cv_.notify_all();
  }
  if (generation_ == gen) return unavailable(broken_reason_);
  return Status::ok();
}

FakeCommunicator::FakeCommunicator(std::shared_ptr<FakeHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

Status FakeCommunicator::round(const char* op, const FakeHub::Posting& mine, const std::function<Status()>& read) {
  hub_->posting(rank_) = mine;
  KESTREL_RETURN_IF_ERROR(hub_->wait(rank_, op));
  Status st = Status::ok();
  for (int r = 0; r < size() && st.is_ok(); ++r) {
    const FakeHub::Posting& p = hub_->posting(r);
    if (std::strcmp(p.op, op) != 0)
      st = invalid_argument("dist: fake: rank " + std::to_string(rank_) + " called " + op + " while rank " +
                            std::to_string(r) + " called " + p.op);
    else if (!p.valid)
      st = invalid_argument("dist: fake " + std::string(op) + ": rank " + std::to_string(r) +
                            " passed invalid arguments");
  }
  if (st.is_ok()) st = read();
  // Second wait: peers may still be copying out of this rank's buffers.
  KESTREL_RETURN_IF_ERROR(hub_->wait(rank_, op));
  return st;
}

Status FakeCommunicator::all_gather_v_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                            std::span<const size_t> recv_counts,
                                            std::span<const size_t> recv_displs) {
  const Status layout = check_layout(recv_counts, recv_displs, recv.size(), size(), "all_gather_v");
  FakeHub::Posting mine{.op = "all_gather_v", .valid = layout.is_ok(), .data = send.data(), .bytes = send.size()};
  Status st = round("all_gather_v", mine, [&]() -> Status {
    for (int r = 0; r < size(); ++r) {
      const FakeHub::Posting& p = hub_->posting(r);
      if (p.bytes != recv_counts[r])
        return invalid_argument("dist: fake all_gather_v: rank " + std::to_string(r) + " sent " +
                                std::to_string(p.bytes) + " bytes, rank " + std::to_string(rank_) + " expected " +
                                std::to_string(recv_counts[r]));
      if (p.bytes > 0) std::memcpy(recv.data() + recv_displs[r], p.data, p.bytes);
    }
    return Status::ok();
  });
  return layout.is_ok() ? st : layout;
}

Status FakeCommunicator::all_to_all_v_bytes(std::span<const std::byte> send, std::span<const size_t> send_counts,
                                            std::span<const size_t> send_displs, std::span<std::byte> recv,
                                            std::span<const size_t> recv_counts,
                                            std::span<const size_t> recv_displs) {
  Status layout = check_layout(send_counts, send_displs, send.size(), size(), "all_to_all_v (send)");
  if (layout.is_ok()) layout = check_layout(recv_counts, recv_displs, recv.size(), size(), "all_to_all_v (recv)");
  FakeHub::Posting mine{.op = "all_to_all_v", .valid = layout.is_ok(), .data = send.data(), .bytes = send.size(),
                        .counts = send_counts.data(), .displs = send_displs.data()};
  Status st = round("all_to_all_v", mine, [&]() -> Status {
    for (int r = 0; r < size(); ++r) {
      const FakeHub::Posting& p = hub_->posting(r);
      const size_t n = p.counts[rank_];
      if (n != recv_counts[r])
        return invalid_argument("dist: fake all_to_all_v: rank " + std::to_string(r) + " sends " +
                                std::to_string(n) + " bytes to rank " + std::to_string(rank_) + ", which expects " +
                                std::to_string(recv_counts[r]));
      if (n > 0) std::memcpy(recv.data() + recv_displs[r], p.data + p.displs[rank_], n);
    }
    return Status::ok();
  });
  return layout.is_ok() ? st : layout;
}

Status FakeCommunicator::broadcast_bytes(std::span<std::byte> data, int root) {
  const bool ok_root = root >= 0 && root < size();
  FakeHub::Posting mine{.op = "broadcast", .valid = ok_root, .data = data.data(), .bytes = data.size(), .root = root};
  Status st = round("broadcast", mine, [&]() -> Status {
    const FakeHub::Posting& p = hub_->posting(root);
    if (hub_->posting(rank_).root != p.root || p.bytes != data.size())
      return invalid_argument("dist: fake broadcast: rank " + std::to_string(rank_) + " has root " +
                              std::to_string(root) + " and " + std::to_string(data.size()) +
                              " bytes, the root posted " + std::to_string(p.bytes));
    if (rank_ != root && !data.empty()) std::memcpy(data.data(), p.data, data.size());
    return Status::ok();
  });
  if (!ok_root) return invalid_argument("dist: fake broadcast: root " + std::to_string(root) + " is not a rank");
  return st;
}

Status FakeCommunicator::barrier() {
  return round("barrier", FakeHub::Posting{.op = "barrier"}, [] { return Status::ok(); });
}

void run_fake_ranks(int nranks, const std::function<void(Communicator&)>& body, FakeHub::Options options) {
  auto hub = std::make_shared<FakeHub>(nranks, options);
  std::vector<std::thread> threads;
  threads.reserve(nranks);
  for (int r = 0; r < nranks; ++r)
    threads.emplace_back([&hub, &body, r] {
      FakeCommunicator comm(hub, r);
      body(comm);
    });
  for (auto& t : threads) t.join();
}

}  // namespace kestrel::dist
