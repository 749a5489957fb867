#include "disagg/transfer.h"

#include <algorithm>
#include <string>
#include <utility>

#include "disagg/checksum.h"
#include "disagg/put.h"

namespace kestrel::disagg {

const char* to_string(TransferState s) {
  switch (s) {
    case TransferState::kCreated: return "created";
    case TransferState::kAdvertised: return "advertised";
    case TransferState::kPosted: return "posted";
    case TransferState::kFlushed: return "flushed";
    case TransferState::kCompleted: return "completed";
    case TransferState::kFailed: return "failed";
    case TransferState::kWithdrawn: return "withdrawn";
    case TransferState::kCancelled: return "cancelled";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------- decode side

IncomingTransfer::IncomingTransfer(uint64_t id, Endpoint& ep, RegionRegistry& registry,
                                   std::vector<DestinationRange> ranges)
    : id_(id), ep_(ep), registry_(registry), ranges_(std::move(ranges)) {
  ep_.worker().reopen(id_);
  for (const DestinationRange& r : ranges_) {
    starts_.push_back(total_);
    total_ += r.length;
  }
}

IncomingTransfer::~IncomingTransfer() {
  if (state_ == TransferState::kAdvertised) (void)registry_.fail(id_);
  ep_.worker().discard(id_);
}

Status IncomingTransfer::fail(Status reason) {
  if (state_ == TransferState::kAdvertised) (void)registry_.fail(id_);
  state_ = TransferState::kFailed;
  return reason;
}

Status IncomingTransfer::advertise(Deadline deadline) {
  if (state_ != TransferState::kCreated) return invalid_argument("disagg: transfer advertised twice");
  if (id_ == 0) {
    state_ = TransferState::kFailed;
    return invalid_argument("disagg: transfer id 0 is reserved");
  }
  Destinations d;
  std::vector<HeldRange> held;
  for (const DestinationRange& r : ranges_) {
    if (r.region == nullptr || r.offset > r.region->length() || r.length > r.region->length() - r.offset) {
      state_ = TransferState::kFailed;
      return invalid_argument("disagg: destination range outside its registered region");
    }
    uint32_t key = 0;
    while (key < d.rkeys.size() && d.rkeys[key] != r.region->packed_rkey()) ++key;
    if (key == d.rkeys.size()) d.rkeys.push_back(r.region->packed_rkey());
    d.ranges.push_back({r.region->address(r.offset), r.length, key});
    held.push_back({r.region->base() + r.offset, r.length});
  }
  Status leased = registry_.advertise(id_, ep_.id(), held);
  if (!leased.is_ok()) {
    state_ = TransferState::kFailed;
    return leased;
  }
  state_ = TransferState::kAdvertised;
  advertised_at_ = Clock::now();
  Status sent = ep_.send(encode_destinations(ep_.worker().instance(), id_, d), MessageKind::kDestinations, deadline);
  if (!sent.is_ok()) return fail(sent);
  return Status::ok();
}

Status IncomingTransfer::wait(Deadline deadline, std::chrono::milliseconds silence) {
  if (state_ != TransferState::kAdvertised) {
    return invalid_argument(std::string("disagg: wait on a transfer in state ") + to_string(state_));
  }
  std::optional<Status> outcome;
  Status waited = ep_.worker().wait([&] { return (outcome = step(silence)).has_value(); }, deadline,
                                    "waiting for the completion of transfer " + std::to_string(id_));
  if (!waited.is_ok()) return fail(waited);
  return *outcome;
}

std::optional<Status> IncomingTransfer::poll(Deadline deadline, std::chrono::milliseconds silence,
                                             std::chrono::milliseconds renewal) {
  if (state_ != TransferState::kAdvertised) {
    return invalid_argument(std::string("disagg: poll on a transfer in state ") + to_string(state_));
  }
  if (std::optional<Status> outcome = step(silence)) return outcome;
  const bool renewed = renewal.count() > 0 && queued_at_ && Clock::now() < *queued_at_ + renewal;
  if (deadline.expired() && !renewed) {
    // What was seen of the peer says where it stood: never started (no segment; still computing the prompt or
    // queued), stopped between segments, or silent.
    const Clock::time_point now = Clock::now();
    auto ago = [&](Clock::time_point t) {
      return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - t).count()) + " ms ago";
    };
    const std::optional<Clock::time_point> heard = ep_.peer() ? ep_.worker().last_heard(*ep_.peer()) : std::nullopt;
    return fail(unavailable("disagg: waiting for the completion of transfer " + std::to_string(id_) +
                            ": deadline passed (destinations sent " + ago(advertised_at_) + "; " +
                            std::to_string(segments_) + " segments verified; last queued notice " +
                            (queued_at_ ? ago(*queued_at_) : std::string("never")) + "; peer last heard " +
                            (heard ? ago(*heard) : std::string("never")) + ")"));
  }
  return std::nullopt;
}

Status IncomingTransfer::cancel(CancelReason reason, Deadline deadline) {
  if (state_ != TransferState::kAdvertised) {
    return invalid_argument(std::string("disagg: cancel of a transfer in state ") + to_string(state_));
  }
  if (cancel_sent_) return Status::ok();
  cancel_sent_ = true;  // a failed send fails the endpoint, and the transfer at its next poll
  return ep_.send(encode_cancel(ep_.worker().instance(), id_, reason), MessageKind::kCancel, deadline);
}

std::optional<Status> IncomingTransfer::step(std::chrono::milliseconds silence) {
  Worker& worker = ep_.worker();
  // Never a stale message from another peer. Segments first: a completion counts only the verified ones.
  while (std::optional<Message> m = worker.take(MessageKind::kSegment, id_, ep_.peer())) {
    if (std::optional<Status> failed = verify_segment(*m)) return failed;
  }
  while (worker.take(MessageKind::kQueued, id_, ep_.peer())) queued_at_ = Clock::now();
  if (!completion_) {
    if (std::optional<Message> m = worker.take(MessageKind::kCompletion, id_, ep_.peer())) {
      Result<Completion> c = decode_completion(m->body);
      if (!c) return fail(c.error());
      completion_ = *c;
    }
  }
  if (completion_) {
    if (std::optional<Status> outcome = settle()) return outcome;
  }
  if (ep_.failed()) return fail(ep_.failure());
  if (ep_.peer()) {
    Clock::time_point since = advertised_at_;
    const std::optional<Clock::time_point> heard = worker.last_heard(*ep_.peer());
    if (heard && *heard > since) since = *heard;
    const Clock::time_point now = Clock::now();
    if (now - since > silence) {
      auto ms = [&](Clock::time_point t) {
        return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - t).count());
      };
      Status why = unavailable("disagg: peer silent for more than " + std::to_string(silence.count()) +
                               " ms (destinations sent " + ms(advertised_at_) + " ms ago; last heard " +
                               (heard ? ms(*heard) + " ms ago" : std::string("never")) + "; " +
                               std::to_string(segments_) + " segments verified)");
      ep_.mark_failed(why);
      return fail(why);
    }
  }
  return std::nullopt;
}

std::optional<Status> IncomingTransfer::verify_segment(const Message& message) {
  const std::string name = "disagg: transfer " + std::to_string(id_) + ": segment ";
  Result<Segment> s = decode_segment(message.body);
  if (!s) return fail(s.error());
  if (s->index != segments_ || s->offset != verified_to_ || s->length > total_ - verified_to_) {
    return fail(corrupt(name + std::to_string(s->index) + " at " + std::to_string(s->offset) + " (+" +
                        std::to_string(s->length) + "), expected segment " + std::to_string(segments_) + " at " +
                        std::to_string(verified_to_) + " of " + std::to_string(total_) + " bytes"));
  }
  // The destination bytes of [offset, offset + length): from the range that holds `offset` on.
  Checksum sum;
  const uint64_t end = s->offset + s->length;
  size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), s->offset) - starts_.begin()) - 1;
  for (uint64_t at = s->offset; at < end; ++i) {
    const DestinationRange& r = ranges_[i];
    const uint64_t from = at - starts_[i], n = std::min<uint64_t>(r.length - from, end - at);
    sum.update({r.region->base() + r.offset + from, n});
    at += n;
  }
  if (sum.value() != s->checksum) return fail(corrupt(name + std::to_string(s->index) + ": checksum mismatch"));
  digest_.add(s->checksum);
  ++segments_;
  verified_to_ = end;
  return std::nullopt;
}

std::optional<Status> IncomingTransfer::settle() {
  const Completion& c = *completion_;
  if (c.status == kCompletionWithdrawn) {
    if (segments_ != 0) {
      return fail(corrupt("disagg: transfer " + std::to_string(id_) + " withdrawn after " +
                          std::to_string(segments_) + " segments had landed"));
    }
    // The sender's word that it never put and never will: the same trust as a completion's.
    Status freed = registry_.complete(id_);
    if (!freed.is_ok()) return fail(freed);
    state_ = TransferState::kWithdrawn;
    return unavailable("disagg: the sender withdrew transfer " + std::to_string(id_) + " before any put");
  }
  if (c.status == kCompletionCancelled) {
    if (!cancel_sent_) {
      return fail(corrupt("disagg: transfer " + std::to_string(id_) + " reported cancelled, but no cancel was sent"));
    }
    // The sender flushed every put it issued before this message and issues none after it: the same trust as a
    // completion's. The bytes that landed are not used.
    Status freed = registry_.complete(id_);
    if (!freed.is_ok()) return fail(freed);
    state_ = TransferState::kCancelled;
    return unavailable("disagg: the sender stopped transfer " + std::to_string(id_) + " at the cancel");
  }
  if (c.status != 0) return fail(unavailable("disagg: the sender failed transfer " + std::to_string(id_)));
  if (c.ranges != ranges_.size() || c.bytes != total_ || c.segments < segments_) {
    return fail(corrupt("disagg: transfer " + std::to_string(id_) + ": completion reports " +
                        std::to_string(c.ranges) + " ranges / " + std::to_string(c.bytes) + " bytes / " +
                        std::to_string(c.segments) + " segments, expected " + std::to_string(ranges_.size()) +
                        " / " + std::to_string(total_) + " / at least the " + std::to_string(segments_) +
                        " verified"));
  }
  if (segments_ < c.segments) return std::nullopt;  // announced, not yet here: until the deadline
  if (verified_to_ != total_) {
    return fail(corrupt("disagg: transfer " + std::to_string(id_) + ": segments cover " +
                        std::to_string(verified_to_) + " of " + std::to_string(total_) + " bytes"));
  }
  if (c.checksum != digest_.value()) {
    return fail(corrupt("disagg: transfer " + std::to_string(id_) + ": checksum mismatch (segment digest)"));
  }
  Status done = registry_.complete(id_);
  if (!done.is_ok()) return fail(done);
  state_ = TransferState::kCompleted;
  return Status::ok();
}

// --------------------------------------------------------------------------------------------- prefill side

Result<Destinations> wait_destinations(Worker& worker, uint64_t id, Deadline deadline, uint64_t* sender) {
  std::optional<Message> m;
  Status waited = worker.wait([&] { return (m = worker.take(MessageKind::kDestinations, id)).has_value(); },
                              deadline, "waiting for the destinations of transfer " + std::to_string(id));
  if (!waited.is_ok()) return waited;
  if (sender != nullptr) *sender = m->header.sender;
  return decode_destinations(m->body);
}

Status send_withdrawal(Endpoint& ep, uint64_t id, Deadline deadline) {
  Completion c;
  c.status = kCompletionWithdrawn;
  return ep.send(encode_completion(ep.worker().instance(), id, c), MessageKind::kCompletion, deadline);
}

Status send_queued(Endpoint& ep, uint64_t id, Deadline deadline) {
  return ep.send(encode_queued(ep.worker().instance(), id), MessageKind::kQueued, deadline);
}

Status send_cancel(Endpoint& ep, uint64_t id, CancelReason reason, Deadline deadline) {
  return ep.send(encode_cancel(ep.worker().instance(), id, reason), MessageKind::kCancel, deadline);
}

OutgoingTransfer::OutgoingTransfer(uint64_t id, Endpoint& ep, Destinations destinations,
                                   std::vector<std::span<const std::byte>> sources, size_t segment_bytes)
    : id_(id),
      ep_(ep),
      destinations_(std::move(destinations)),
      sources_(std::move(sources)),
      segment_bytes_(segment_bytes) {}

Status OutgoingTransfer::fail(Status reason, Deadline deadline) {
  state_ = TransferState::kFailed;
  if (!ep_.failed() && !ep_.closed()) {
    Completion c;
    c.status = kCompletionFailed;
    (void)ep_.send(encode_completion(ep_.worker().instance(), id_, c), MessageKind::kCompletion, deadline);
  }
  return reason;
}

Status OutgoingTransfer::run(Deadline deadline, std::chrono::milliseconds lease) {
  if (state_ != TransferState::kCreated) return invalid_argument("disagg: transfer run twice");
  const auto& dst = destinations_.ranges;
  if (dst.size() != sources_.size()) {
    return fail(invalid_argument("disagg: transfer " + std::to_string(id_) + ": " + std::to_string(sources_.size()) +
                                 " sources for " + std::to_string(dst.size()) + " destinations"),
                deadline);
  }
  std::vector<const RemoteKey*> keys;  // unpacked once per endpoint (Endpoint::cached_rkey)
  for (const auto& packed : destinations_.rkeys) {
    Result<const RemoteKey*> k = ep_.cached_rkey(packed);
    if (!k) return fail(k.error(), deadline);
    keys.push_back(*k);
  }
  if (segment_bytes_ == 0) return fail(invalid_argument("disagg: segment size 0"), deadline);
  // The ranges' byte stream cut every segment_bytes_: a range across a boundary becomes two puts.
  std::vector<PutRange> puts;
  Segments segments;
  uint64_t at = 0;
  for (size_t i = 0; i < dst.size(); ++i) {
    if (sources_[i].size() != dst[i].length) {
      return fail(invalid_argument("disagg: transfer " + std::to_string(id_) + ": range " + std::to_string(i) +
                                   " has " + std::to_string(sources_[i].size()) + " source bytes for " +
                                   std::to_string(dst[i].length) + " destination bytes"),
                  deadline);
    }
    size_t done = 0;
    do {
      const uint64_t boundary = (at / segment_bytes_ + 1) * segment_bytes_;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(sources_[i].size() - done, boundary - at));
      puts.push_back({sources_[i].data() + done, dst[i].address + done, n, keys[dst[i].rkey]});
      done += n;
      at += n;
      if (at == boundary) segments.ends.push_back(puts.size());
    } while (done < sources_[i].size());
  }
  const uint64_t total = at;
  if (total == 0 || total % segment_bytes_ != 0) segments.ends.push_back(puts.size());
  else segments.ends.back() = puts.size();  // zero-length ranges after the last boundary
  Completion c;
  c.ranges = static_cast<uint32_t>(dst.size());
  c.bytes = total;
  c.segments = total == 0 ? 0 : static_cast<uint32_t>(segments.ends.size());
  std::vector<uint64_t> sums(segments.ends.size());
  SegmentDigest digest;
  // The checksum of a segment's sources right after its puts, while the bytes they read are still in cache.
  segments.posted = [&](size_t k) {
    if (total == 0) return Status::ok();  // no segment to announce
    Checksum sum;
    for (size_t p = k == 0 ? 0 : segments.ends[k - 1]; p < segments.ends[k]; ++p) sum.update({puts[p].source, puts[p].length});
    sums[k] = sum.value();
    digest.add(sums[k]);
    return Status::ok();
  };
  segments.flushed = [&](size_t k) {
    if (total == 0) return Status::ok();
    const uint64_t offset = k * segment_bytes_;
    const Segment s{static_cast<uint32_t>(k), offset, std::min<uint64_t>(segment_bytes_, total - offset), sums[k]};
    return ep_.send(encode_segment(ep_.worker().instance(), id_, s), MessageKind::kSegment, deadline);
  };
  segments.window = std::max<size_t>(2, kMaxBytesAhead / segment_bytes_);
  // The receiver's cancel, looked for before every put (the worker reads messages between puts).
  std::optional<CancelReason> cancelled;
  segments.stop = [&] {
    std::optional<Message> m = ep_.worker().take(MessageKind::kCancel, id_, ep_.peer());
    if (m) {
      Result<CancelReason> r = decode_cancel(m->body);
      cancelled = r ? *r : CancelReason::kClient;  // a malformed cancel still asks to stop
    }
    return cancelled.has_value();
  };
  state_ = TransferState::kPosted;
  Status put = put_and_flush(ep_, id_, puts, segments, deadline, lease);
  if (!put.is_ok()) return fail(put, deadline);
  if (cancelled) {
    Completion stopped;
    stopped.status = kCompletionCancelled;
    state_ = TransferState::kCancelled;
    Status sent = ep_.send(encode_completion(ep_.worker().instance(), id_, stopped), MessageKind::kCompletion, deadline);
    if (!sent.is_ok()) return sent;
    return unavailable("disagg: transfer " + std::to_string(id_) + " stopped: the receiver cancelled it (" +
                       to_string(*cancelled) + ")");
  }
  c.checksum = digest.value();
  state_ = TransferState::kFlushed;
  Status sent = ep_.send(encode_completion(ep_.worker().instance(), id_, c), MessageKind::kCompletion, deadline);
  if (!sent.is_ok()) {
    state_ = TransferState::kFailed;
    return sent;
  }
  state_ = TransferState::kCompleted;
  return Status::ok();
}

}  // namespace kestrel::disagg
