#include "disagg/messages.h"

#include <unistd.h>

#include <string>

#include "disagg/checksum.h"

namespace kestrel::disagg {
namespace {

constexpr uint32_t kMagic = 0x4753444b;  // "KDSG" little-endian
// 4: kCancel (3: per-segment checksums; 2: one XXH3-64 in the completion; 1: FNV-1a)
constexpr uint16_t kVersion = 5;
constexpr size_t kHeaderBytes = 4 + 2 + 2 + 8 + 4 + 8;

class Writer {
 public:
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void bytes(std::span<const std::byte> b) { out_.insert(out_.end(), b.begin(), b.end()); }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  void put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<std::byte>(v >> (8 * i)));
  }
  std::vector<std::byte> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  bool u16(uint16_t& v) { return get(v, 2); }
  bool u32(uint32_t& v) { return get(v, 4); }
  bool u64(uint64_t& v) { return get(v, 8); }
  bool bytes(size_t n, std::vector<std::byte>& v) {
    if (in_.size() - pos_ < n) return false;
    v.assign(in_.begin() + pos_, in_.begin() + pos_ + n);
    pos_ += n;
    return true;
  }
  size_t left() const { return in_.size() - pos_; }
  std::span<const std::byte> rest() const { return in_.subspan(pos_); }

 private:
  template <typename T>
  bool get(T& v, int n) {
    if (in_.size() - pos_ < static_cast<size_t>(n)) return false;
    uint64_t x = 0;
    for (int i = 0; i < n; ++i) x |= static_cast<uint64_t>(in_[pos_ + i]) << (8 * i);
    v = static_cast<T>(x);
    pos_ += n;
    return true;
  }
  std::span<const std::byte> in_;
  size_t pos_ = 0;
};

Writer header(MessageKind kind, uint64_t sender, uint64_t transfer_id) {
  Writer w;
  w.u32(kMagic);
  w.u16(kVersion);
  w.u16(static_cast<uint16_t>(kind));
  w.u64(sender);
  w.u32(static_cast<uint32_t>(getpid()));
  w.u64(transfer_id);
  return w;
}

Status bad(const std::string& what) { return corrupt("disagg: malformed message: " + what); }

}  // namespace

const char* to_string(CancelReason r) {
  switch (r) {
    case CancelReason::kClient: return "its client cancelled";
    case CancelReason::kEnded: return "its request ended before the hand-off";
  }
  return "?";
}

std::vector<std::byte> encode_heartbeat(uint64_t sender) {
  return header(MessageKind::kHeartbeat, sender, 0).take();
}

std::vector<std::byte> encode_queued(uint64_t sender, uint64_t transfer_id) {
  return header(MessageKind::kQueued, sender, transfer_id).take();
}

std::vector<std::byte> encode_destinations(uint64_t sender, uint64_t transfer_id, const Destinations& d) {
  Writer w = header(MessageKind::kDestinations, sender, transfer_id);
  w.u32(static_cast<uint32_t>(d.rkeys.size()));
  for (const auto& k : d.rkeys) {
    w.u32(static_cast<uint32_t>(k.size()));
    w.bytes(k);
  }
  w.u32(static_cast<uint32_t>(d.ranges.size()));
  for (const auto& r : d.ranges) {
    w.u64(r.address);
    w.u64(r.length);
    w.u32(r.rkey);
  }
  return w.take();
}

std::vector<std::byte> encode_segment(uint64_t sender, uint64_t transfer_id, const Segment& s) {
  Writer w = header(MessageKind::kSegment, sender, transfer_id);
  w.u32(s.index);
  w.u64(s.offset);
  w.u64(s.length);
  w.u64(s.checksum);
  return w.take();
}

std::vector<std::byte> encode_completion(uint64_t sender, uint64_t transfer_id, const Completion& c) {
  Writer w = header(MessageKind::kCompletion, sender, transfer_id);
  w.u32(c.status);
  w.u32(c.ranges);
  w.u64(c.bytes);
  w.u32(c.segments);
  w.u64(c.checksum);
  return w.take();
}

std::vector<std::byte> encode_cancel(uint64_t sender, uint64_t transfer_id, CancelReason reason) {
  Writer w = header(MessageKind::kCancel, sender, transfer_id);
  w.u32(static_cast<uint32_t>(reason));
  return w.take();
}

void SegmentDigest::add(uint64_t segment_checksum) {
  for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<std::byte>(segment_checksum >> (8 * i)));
}

uint64_t SegmentDigest::value() const {
  Checksum c;
  c.update(bytes_);
  return c.value();
}

Result<MessageHeader> decode_header(std::span<const std::byte> message, std::span<const std::byte>* body) {
  Reader r(message);
  uint32_t magic = 0;
  uint16_t version = 0, kind = 0;
  MessageHeader h;
  if (message.size() < kHeaderBytes) return bad("shorter than the header");
  r.u32(magic);
  r.u16(version);
  r.u16(kind);
  r.u64(h.sender);
  r.u32(h.pid);
  r.u64(h.transfer_id);
  if (magic != kMagic) return bad("bad magic");
  if (version != kVersion) return bad("version " + std::to_string(version) + ", expected " + std::to_string(kVersion));
  if (kind == 0 || kind > kMaxMessageKind) return bad("unknown kind " + std::to_string(kind));
  h.kind = static_cast<MessageKind>(kind);
  *body = r.rest();
  return h;
}

Result<Destinations> decode_destinations(std::span<const std::byte> body) {
  Reader r(body);
  Destinations d;
  uint32_t nkeys = 0, nranges = 0;
  if (!r.u32(nkeys)) return bad("destinations: truncated rkey count");
  if (nkeys > kMaxRkeys) return bad("destinations: " + std::to_string(nkeys) + " rkeys");
  d.rkeys.resize(nkeys);
  for (auto& k : d.rkeys) {
    uint32_t n = 0;
    if (!r.u32(n) || n > kMaxRkeyBytes || !r.bytes(n, k)) return bad("destinations: bad rkey");
  }
  if (!r.u32(nranges)) return bad("destinations: truncated range count");
  if (nranges > kMaxRanges || r.left() != size_t{nranges} * 20) return bad("destinations: bad range list");
  d.ranges.resize(nranges);
  for (auto& rr : d.ranges) {
    r.u64(rr.address);
    r.u64(rr.length);
    r.u32(rr.rkey);
    if (rr.rkey >= nkeys) return bad("destinations: rkey index " + std::to_string(rr.rkey) + " out of range");
    if (rr.address + rr.length < rr.address) return bad("destinations: range wraps around");
  }
  return d;
}

Result<Segment> decode_segment(std::span<const std::byte> body) {
  Reader r(body);
  Segment s;
  if (body.size() != 28) return bad("segment: " + std::to_string(body.size()) + " body bytes, expected 28");
  r.u32(s.index);
  r.u64(s.offset);
  r.u64(s.length);
  r.u64(s.checksum);
  if (s.length == 0) return bad("segment: empty");
  if (s.offset + s.length < s.offset) return bad("segment: wraps around");
  return s;
}

Result<Completion> decode_completion(std::span<const std::byte> body) {
  Reader r(body);
  Completion c;
  if (body.size() != 28) return bad("completion: " + std::to_string(body.size()) + " body bytes, expected 28");
  r.u32(c.status);
  r.u32(c.ranges);
  r.u64(c.bytes);
  r.u32(c.segments);
  r.u64(c.checksum);
  return c;
}

Result<CancelReason> decode_cancel(std::span<const std::byte> body) {
  Reader r(body);
  uint32_t reason = 0;
  if (body.size() != 4) return bad("cancel: " + std::to_string(body.size()) + " body bytes, expected 4");
  r.u32(reason);
  if (reason == 0 || reason > kMaxCancelReason) return bad("cancel: unknown reason " + std::to_string(reason));
  return static_cast<CancelReason>(reason);
}

}  // namespace kestrel::disagg
