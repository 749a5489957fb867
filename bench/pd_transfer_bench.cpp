// P->D transfer throughput of one request's state against the link's own limit, measured in one run between two
// processes (fork: the child is the prefill side, the parent the decode side) over the transports UCX_TLS names
// (tcp: loopback TCP; shm: shared memory), on the same pair of endpoints, so the same lanes carry every row.
//   pd_transfer_bench MODEL_DIR [--tokens 4096] [--page-tokens 64] [--kv-cache-dtype fp32|bf16|fp8] [--reps 7]
//                     [--segment-kib 2048] [--scatter] [--heap-pools] [--json]
// MODEL_DIR: a checkpoint directory (only its config.json is read). The request is a prompt of --tokens tokens in
// real CachePools of that model's geometry (pd::handoff_layout: MLA pages per block, DSA indexer pages, KDA conv +
// recurrent state of every KDA layer, the first-token record). --scatter takes the decode side's pages in a random
// order (a pool after churn) instead of a fresh pool's ascending run. The decode side's pools are allocated as a
// decode server allocates them (pd::DecodeArenas: through UCX, shared memory a same-host peer puts into directly);
// --heap-pools registers heap pools instead (ucp_mem_map of existing memory: over shared memory UCX 1.13 emulates
// those puts with active messages). Rows (GB/s of payload; best and median of --reps after one warm-up):
//   link, 1 put        ucp_put_nbx of the whole payload from one contiguous buffer into a UCX-allocated buffer of
//                      the decode side, then ucp_ep_flush_nbx
//   link, 1 MiB puts   the same payload as 1 MiB puts, then the flush
//   link, registered   one put into a heap buffer that is only registered (the emulated path over shared memory;
//                      not part of the link's limit)
//   hand-off puts      disagg::put_and_flush over the request's ranges (the data plane alone), prefill side
//   hand-off           the transfer as the decode side sees it, destinations advertised → completion verified:
//                      OutgoingTransfer::run in segments of --segment-kib (puts, checksum of the segment's sources,
//                      flush, segment message; the completion) and IncomingTransfer (each segment's landed bytes
//                      verified as it is announced); what a hand-off costs a request
//   hand-off, 1 segment  the same with the whole payload as one segment (every check after the last put: the
//                      serial form, for comparison)
//   checksum           disagg::Checksum over the payload, one core, in process
// ratio = row / the faster link row.
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cache/cache_pools.h"
#include "disagg/checksum.h"
#include "disagg/endpoint.h"
#include "disagg/put.h"
#include "disagg/region_registry.h"
#include "disagg/transfer.h"
#include "disagg/ucx_status.h"
#include "disagg/worker.h"
#include "kernels/cpu/dsa_indexer.h"
#include "layers/kda_layer.h"
#include "loader/model_config.h"
#include "models/model.h"
#include "pd/decode_arenas.h"
#include "pd/first_token.h"
#include "pd/layout.h"
#include "tensor/kv_cache_dtype.h"

namespace {

using namespace kestrel;
using disagg::Clock;
using disagg::Deadline;
using std::chrono::milliseconds;

struct Options {
  std::string model;
  int64_t tokens = 4096, page_tokens = 64;
  KvCacheDtype kv = KvCacheDtype::kF32;
  int reps = 7;
  size_t segment_bytes = disagg::kDefaultSegmentBytes;
  bool scatter = false, json = false, heap_pools = false;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "pd_transfer_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T must(Result<T> r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().message());
  return std::move(*r);
}

void must(const Status& s, const char* what) {
  if (!s.is_ok()) die(std::string(what) + ": " + s.message());
}

// One side's pools holding one request of opts.tokens tokens.
struct Request {
  std::unique_ptr<CachePools> pools;
  SequenceState seq;
  CacheLocation loc;
  std::vector<pd::PoolRange> layout;
  size_t bytes = 0;
};

Request make_request(const CacheGeometry& g, const Options& o, bool scatter,
                     std::shared_ptr<ArenaSource> arenas = nullptr) {
  CachePoolConfig pc;
  pc.arenas = std::move(arenas);
  pc.page_tokens = o.page_tokens;
  pc.max_slots = 1;
  pc.max_seq_tokens = o.tokens;
  pc.kv_dtype = o.kv;
  const int64_t blocks = (o.tokens + o.page_tokens - 1) / o.page_tokens;
  const int64_t block_bytes = o.page_tokens * (g.mla_bytes_per_token(o.kv) + g.index_bytes_per_token());
  // Twice the pages the request needs, so that --scatter has room to scatter.
  pc.budget_bytes = g.slot_floats() * 4 + 2 * blocks * block_bytes + (1 << 20);
  Request r;
  r.pools = must(CachePools::create(g, pc), "cache pools");
  r.loc.slot = *r.pools->acquire_slot(r.seq);
  if (scatter) {  // take every page, keep a random half, return the rest
    std::vector<int32_t> all;
    if (!r.pools->grow(r.seq, all, r.pools->num_blocks() * o.page_tokens)) die("cannot take the pool's pages");
    std::mt19937 rng(7);
    std::shuffle(all.begin(), all.end(), rng);
    r.loc.blocks.assign(all.begin(), all.begin() + blocks);
    for (size_t i = static_cast<size_t>(blocks); i < all.size(); ++i) r.pools->drop_ref(all[i]);
  } else if (!r.pools->grow(r.seq, r.loc.blocks, o.tokens)) {
    die("cannot take the request's pages");
  }
  r.loc.n_tokens = o.tokens;
  r.layout = pd::handoff_layout(*r.pools, r.loc);
  for (const auto& x : r.layout) r.bytes += x.length;
  return r;
}

void fill(std::span<std::byte> b, uint64_t seed) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  size_t i = 0;
  for (; i + 8 <= b.size(); i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(b.data() + i, &x, 8);
  }
  for (; i < b.size(); ++i) b[i] = static_cast<std::byte>(i);
}

std::string to_hex(std::span<const std::byte> b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (std::byte x : b) s += d[static_cast<int>(x) >> 4], s += d[static_cast<int>(x) & 15];
  return s;
}

std::vector<std::byte> from_hex(const std::string& s) {
  std::vector<std::byte> b;
  for (size_t i = 0; i + 1 < s.size(); i += 2) b.push_back(static_cast<std::byte>(std::stoi(s.substr(i, 2), nullptr, 16)));
  return b;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

// Line protocol between the two processes over pipes; the waiting side keeps progressing its worker (over tcp a
// put lands only while the target progresses).
class Pipe {
 public:
  Pipe(int in, int out) : in_(in), out_(out) {}
  void send(const std::string& line) {
    const std::string l = line + "\n";
    if (write(out_, l.data(), l.size()) != static_cast<ssize_t>(l.size())) die("pipe write");
  }
  std::string receive(disagg::Worker* w, milliseconds limit = milliseconds(60000)) {
    Deadline d = Deadline::after(limit);
    while (buf_.find('\n') == std::string::npos) {
      if (d.expired()) die("no answer from the other process");
      pollfd p{in_, POLLIN, 0};
      if (poll(&p, 1, w == nullptr ? 100 : 0) > 0) {
        char b[65536];
        const ssize_t n = read(in_, b, sizeof b);
        if (n <= 0) die("the other process ended");
        buf_.append(b, static_cast<size_t>(n));
      } else if (w != nullptr && !w->progress()) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
    const size_t nl = buf_.find('\n');
    std::string line = buf_.substr(0, nl);
    buf_.erase(0, nl + 1);
    return line;
  }

 private:
  int in_, out_;
  std::string buf_;
};

constexpr uint64_t kRawSeed = 11, kPoolSeed = 5;

uint64_t transfer_id(int n) { return static_cast<uint64_t>(n + 1) | (uint64_t{1} << 63); }

std::span<std::byte> arena(CachePools& p, pd::Pool pool, std::span<std::byte> record) {
  switch (pool) {
    case pd::Pool::kSlots: return p.slot_arena();
    case pd::Pool::kMla: return p.mla_arena();
    case pd::Pool::kIndex: return p.index_arena();
    case pd::Pool::kRecord: return record;
  }
  return {};
}

// ------------------------------------------------------------------------------------------------ prefill (child)

// Plain UCX: the payload from one contiguous buffer in puts of `piece` bytes, then one flush. Returns seconds.
double raw_put_loop(disagg::Endpoint& ep, const std::byte* src, size_t bytes, uint64_t remote, ucp_rkey_h rkey,
                    size_t piece) {
  disagg::Worker& w = ep.worker();
  std::vector<void*> reqs;
  const auto t0 = Clock::now();
  for (size_t off = 0; off < bytes; off += piece) {
    ucp_request_param_t param{};
    void* r = ucp_put_nbx(ep.handle(), src + off, std::min(piece, bytes - off), remote + off, rkey, &param);
    if (UCS_PTR_IS_ERR(r)) die("ucp_put_nbx: " + std::string(ucs_status_string(UCS_PTR_STATUS(r))));
    if (r != nullptr) reqs.push_back(r);
  }
  ucp_request_param_t param{};
  void* f = ucp_ep_flush_nbx(ep.handle(), &param);
  if (UCS_PTR_IS_ERR(f)) die("ucp_ep_flush_nbx");
  auto done = [](void*& r) {
    if (r == nullptr) return true;
    const ucs_status_t st = ucp_request_check_status(r);
    if (st == UCS_INPROGRESS) return false;
    if (st != UCS_OK) die("put or flush failed: " + std::string(ucs_status_string(st)));
    ucp_request_free(r);
    r = nullptr;
    return true;
  };
  for (;;) {
    bool all = done(f);
    for (void*& r : reqs) all = done(r) && all;
    if (all) break;
    ucp_worker_progress(w.handle());
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int prefill_main(const CacheGeometry& g, const Options& o, Pipe pipe) {
  auto worker = must(disagg::Worker::create({}), "worker");
  Request req = make_request(g, o, false);
  fill(req.pools->slot_arena(), kPoolSeed);
  fill(req.pools->mla_arena(), kPoolSeed + 1);
  fill(req.pools->index_arena(), kPoolSeed + 2);
  std::vector<std::byte> record(pd::kRecordBytes);
  fill(record, kPoolSeed + 3);
  std::vector<std::span<const std::byte>> sources;
  for (const auto& r : req.layout) {
    const size_t off = r.pool == pd::Pool::kRecord ? 0 : r.offset;
    sources.push_back(arena(*req.pools, r.pool, record).subspan(off, r.length));
  }
  std::vector<std::byte> raw(req.bytes);
  fill(raw, kRawSeed);

  pipe.send(std::to_string(worker->instance()) + " " + to_hex(must(worker->address(), "address")));
  unsigned long long decode_instance = 0, raw_remote[2] = {0, 0};
  char addr_hex[8192], rkey_hex[2][8192];
  const std::string hello = pipe.receive(nullptr);
  if (std::sscanf(hello.c_str(), "%llu %8191s %llu %8191s %llu %8191s", &decode_instance, addr_hex, &raw_remote[0],
                  rkey_hex[0], &raw_remote[1], rkey_hex[1]) != 6)
    die("bad hello from the decode side");
  auto ep = must(disagg::Endpoint::connect_address(*worker, from_hex(addr_hex)), "connect");
  ep->set_peer(decode_instance);
  disagg::RemoteKey raw_key[2] = {must(ep->unpack_rkey(from_hex(rkey_hex[0])), "raw rkey"),
                                  must(ep->unpack_rkey(from_hex(rkey_hex[1])), "registered raw rkey")};
  std::optional<disagg::Destinations> last;
  std::vector<disagg::RemoteKey> keys;
  for (;;) {
    const std::string cmd = pipe.receive(worker.get());
    int n = 0;
    unsigned long long piece = 0, segment = 0, which = 0;
    if (cmd == "quit") break;
    if (cmd == "lanes") {
      pipe.send(join(ep->transports()));
    } else if (std::sscanf(cmd.c_str(), "raw %llu %llu", &piece, &which) == 2 && which < 2) {
      const double s = raw_put_loop(*ep, raw.data(), raw.size(), raw_remote[which], raw_key[which].handle(), piece);
      pipe.send("ok " + std::to_string(s));
    } else if (std::sscanf(cmd.c_str(), "full %d %llu", &n, &segment) == 2) {
      uint64_t sender = 0;
      auto dst = must(disagg::wait_destinations(*worker, transfer_id(n), Deadline::after(milliseconds(10000)), &sender),
                      "destinations");
      last = dst;
      disagg::OutgoingTransfer out(transfer_id(n), *ep, std::move(dst), sources, segment);
      const auto t0 = Clock::now();
      must(out.run(Deadline::after(milliseconds(30000))), "transfer");
      pipe.send("ok " + std::to_string(std::chrono::duration<double>(Clock::now() - t0).count()));
    } else if (std::sscanf(cmd.c_str(), "puts %d", &n) == 1) {
      if (!last) die("puts before any destinations");
      if (keys.empty())
        for (const auto& k : last->rkeys) keys.push_back(must(ep->unpack_rkey(k), "rkey"));
      std::vector<disagg::PutRange> puts;
      for (size_t i = 0; i < sources.size(); ++i)
        puts.push_back({sources[i].data(), last->ranges[i].address, sources[i].size(), &keys[last->ranges[i].rkey]});
      const auto t0 = Clock::now();
      must(disagg::put_and_flush(*ep, transfer_id(n), puts, Deadline::after(milliseconds(30000))), "puts");
      pipe.send("ok " + std::to_string(std::chrono::duration<double>(Clock::now() - t0).count()));
    } else {
      die("unknown command '" + cmd + "'");
    }
  }
  keys.clear();
  raw_key[0] = disagg::RemoteKey();
  raw_key[1] = disagg::RemoteKey();
  (void)ep->close(Deadline::after(milliseconds(2000)));
  return 0;
}

// ------------------------------------------------------------------------------------------------- decode (parent)

struct Row {
  std::string name;
  std::vector<double> seconds;
  double best_gbs(size_t bytes) const { return bytes / *std::min_element(seconds.begin(), seconds.end()) * 1e-9; }
  double median_gbs(size_t bytes) const {
    std::vector<double> s = seconds;
    std::sort(s.begin(), s.end());
    return bytes / s[s.size() / 2] * 1e-9;
  }
};

double answer(Pipe& pipe, disagg::Worker& w) {
  const std::string a = pipe.receive(&w);
  double s = 0;
  if (std::sscanf(a.c_str(), "ok %lf", &s) != 1) die("bad answer '" + a + "'");
  return s;
}

int decode_main(const CacheGeometry& g, const Options& o, Pipe pipe, pid_t child) {
  // As a decode server: the pools allocated through UCX on the worker's context (unless --heap-pools).
  auto arenas = must(pd::DecodeArenas::create(), "decode arenas");
  disagg::WorkerOptions wo;
  wo.context = arenas->context();
  auto worker = must(disagg::Worker::create(wo), "worker");
  Request req = make_request(g, o, o.scatter, o.heap_pools ? nullptr : arenas);
  std::shared_ptr<std::byte> record_mem =
      o.heap_pools ? std::shared_ptr<std::byte>(new std::byte[pd::kRecordBytes](), std::default_delete<std::byte[]>())
                   : must(arenas->allocate(pd::kRecordBytes, "record"), "record");
  std::span<std::byte> record(record_mem.get(), pd::kRecordBytes);
  std::shared_ptr<disagg::Region> regions[4];
  const pd::Pool pools[] = {pd::Pool::kSlots, pd::Pool::kMla, pd::Pool::kIndex, pd::Pool::kRecord};
  for (pd::Pool p : pools) {
    std::span<std::byte> a = arena(*req.pools, p, record);
    if (a.empty()) continue;
    regions[static_cast<int>(p)] = o.heap_pools ? must(disagg::Region::map(*worker, a.data(), a.size()), "register")
                                                : arenas->region_of(a);
    if (regions[static_cast<int>(p)] == nullptr) die("a pool was not allocated by the decode arenas");
  }
  auto raw_region = must(disagg::Region::allocate(arenas->context(), req.bytes), "allocate raw");
  std::span<std::byte> raw(raw_region->base(), req.bytes);
  std::vector<std::byte> heap_raw(req.bytes);
  auto heap_raw_region = must(disagg::Region::map(*worker, heap_raw.data(), heap_raw.size()), "register raw");
  std::vector<disagg::DestinationRange> ranges;
  for (const auto& r : req.layout) ranges.push_back({regions[static_cast<int>(r.pool)].get(), r.offset, r.length});

  unsigned long long prefill_instance = 0;
  char addr_hex[8192];
  if (std::sscanf(pipe.receive(nullptr).c_str(), "%llu %8191s", &prefill_instance, addr_hex) != 2)
    die("bad hello from the prefill side");
  auto ep = must(disagg::Endpoint::connect_address(*worker, from_hex(addr_hex)), "connect");
  ep->set_peer(prefill_instance);
  pipe.send(std::to_string(worker->instance()) + " " + to_hex(must(worker->address(), "address")) + " " +
            std::to_string(raw_region->address(0)) + " " + to_hex(raw_region->packed_rkey()) + " " +
            std::to_string(heap_raw_region->address(0)) + " " + to_hex(heap_raw_region->packed_rkey()));

  disagg::RegionRegistry registry;
  Row link1{"link, 1 put", {}}, link_mib{"link, 1 MiB puts", {}}, link_reg{"link, registered", {}},
      puts{"hand-off puts", {}}, full{"hand-off", {}}, whole{"hand-off, 1 segment", {}};
  // The decode side of one hand-off (its prefill told to go with `segment` bytes per segment): seconds.
  int n = 0;
  auto hand_off = [&](size_t segment) {
    pipe.send("full " + std::to_string(n) + " " + std::to_string(segment));
    disagg::IncomingTransfer in(transfer_id(n++), *ep, registry, ranges);
    const auto t0 = Clock::now();
    must(in.advertise(Deadline::after(milliseconds(10000))), "advertise");
    must(in.wait(Deadline::after(milliseconds(30000)), milliseconds(5000)), "hand-off");
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    (void)answer(pipe, *worker);
    return t;
  };
  for (int rep = 0; rep <= o.reps; ++rep) {  // rep 0: warm-up (connection wire-up, first touch of the pages)
    pipe.send("raw " + std::to_string(req.bytes) + " 0");
    const double a = answer(pipe, *worker);
    pipe.send("raw " + std::to_string(1 << 20) + " 0");
    const double b = answer(pipe, *worker);
    pipe.send("raw " + std::to_string(req.bytes) + " 1");
    const double r = answer(pipe, *worker);
    const double c = hand_off(o.segment_bytes);
    const double e = hand_off(req.bytes);
    pipe.send("puts " + std::to_string(n++));
    const double d = answer(pipe, *worker);
    if (rep == 0) continue;
    link1.seconds.push_back(a), link_mib.seconds.push_back(b), full.seconds.push_back(c), puts.seconds.push_back(d);
    link_reg.seconds.push_back(r);
    whole.seconds.push_back(e);
  }
  pipe.send("lanes");
  const std::string prefill_lanes = pipe.receive(worker.get());
  const std::string decode_lanes = join(ep->transports());
  pipe.send("quit");
  // The link rows really moved the bytes.
  std::vector<std::byte> expect(raw.size());
  fill(expect, kRawSeed);
  if (std::memcmp(expect.data(), raw.data(), raw.size()) != 0) die("the put loop's bytes did not land");
  if (std::memcmp(expect.data(), heap_raw.data(), heap_raw.size()) != 0) die("the registered put loop's bytes did not land");
  Row sum_row{"checksum", {}};
  for (int rep = 0; rep < o.reps; ++rep) {
    const auto t0 = Clock::now();
    disagg::Checksum s;
    s.update(raw);
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s.value() == 0) die("checksum");  // uses the value, so the pass cannot be optimised away
    sum_row.seconds.push_back(t);
  }
  const auto limit = Deadline::after(milliseconds(5000));
  while (!limit.expired()) {
    int status = 0;
    if (waitpid(child, &status, WNOHANG) == child) break;
    if (!worker->progress()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  (void)ep->close(Deadline::after(milliseconds(1000)));

  const char* tls = std::getenv("UCX_TLS");
  const size_t bytes = req.bytes;
  const double lim = std::max(link1.best_gbs(bytes), link_mib.best_gbs(bytes));
  const double lim_med = std::max(link1.median_gbs(bytes), link_mib.median_gbs(bytes));
  const Row* rows[] = {&link1, &link_mib, &link_reg, &puts, &full, &whole, &sum_row};
  double load[1] = {0};
  (void)getloadavg(load, 1);  // the machine may be shared: the 1-minute load average goes with the numbers
  if (o.json) {
    std::printf("{\"bench\": \"pd_transfer_bench\", \"loadavg_1m\": %.2f, \"ucx_tls\": \"%s\", \"model\": \"%s\", \"tokens\": %lld, "
                "\"page_tokens\": %lld, \"kv_cache_dtype\": \"%s\", \"scatter\": %s, \"heap_pools\": %s, \"segment_bytes\": %zu, \"payload_bytes\": %zu, "
                "\"ranges\": %zu, \"reps\": %d, \"lanes\": {\"prefill\": \"%s\", \"decode\": \"%s\"}, \"rows\": [",
                load[0], tls ? tls : "", std::filesystem::path(o.model).filename().c_str(), static_cast<long long>(o.tokens),
                static_cast<long long>(o.page_tokens), std::string(kv_cache_dtype_name(o.kv)).c_str(),
                o.scatter ? "true" : "false", o.heap_pools ? "true" : "false", o.segment_bytes, bytes, ranges.size(), o.reps, prefill_lanes.c_str(), decode_lanes.c_str());
    for (size_t i = 0; i < std::size(rows); ++i) {
      const Row& r = *rows[i];
      std::printf("%s{\"name\": \"%s\", \"best_gbs\": %.4f, \"median_gbs\": %.4f, \"ratio_best\": %.4f, "
                  "\"ratio_median\": %.4f, \"seconds\": [",
                  i ? ", " : "", r.name.c_str(), r.best_gbs(bytes), r.median_gbs(bytes), r.best_gbs(bytes) / lim,
                  r.median_gbs(bytes) / lim_med);
      for (size_t k = 0; k < r.seconds.size(); ++k) std::printf("%s%.6f", k ? ", " : "", r.seconds[k]);
      std::printf("]}");
    }
    std::printf("]}\n");
  } else {
    std::printf("UCX_TLS=%s  %s, %lld tokens, page %lld, %s%s%s, segments of %zu KiB: %zu bytes in %zu ranges; lanes "
                "prefill %s, decode %s; load %.2f\n",
                tls ? tls : "", std::filesystem::path(o.model).filename().c_str(), static_cast<long long>(o.tokens),
                static_cast<long long>(o.page_tokens), std::string(kv_cache_dtype_name(o.kv)).c_str(),
                o.scatter ? ", scattered pages" : "", o.heap_pools ? ", heap pools" : "", o.segment_bytes >> 10, bytes, ranges.size(), prefill_lanes.c_str(), decode_lanes.c_str(),
                load[0]);
    std::printf("%-20s %10s %10s %12s\n", "row", "best GB/s", "med GB/s", "best / link");
    for (const Row* r : rows)
      std::printf("%-20s %10.3f %10.3f %11.0f%%\n", r->name.c_str(), r->best_gbs(bytes), r->median_gbs(bytes),
                  100 * r->best_gbs(bytes) / lim);
  }
  return 0;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--tokens") o.tokens = std::stoll(next());
    else if (a == "--page-tokens") o.page_tokens = std::stoll(next());
    else if (a == "--reps") o.reps = std::stoi(next());
    else if (a == "--kv-cache-dtype") {
      auto d = parse_kv_cache_dtype(next());
      if (!d) die("--kv-cache-dtype: fp32, bf16 or fp8");
      o.kv = *d;
    } else if (a == "--segment-kib") o.segment_bytes = std::stoull(next()) << 10;
    else if (a == "--scatter") o.scatter = true;
    else if (a == "--heap-pools") o.heap_pools = true;
    else if (a == "--json") o.json = true;
    else if (!a.empty() && a[0] != '-' && o.model.empty()) o.model = a;
    else die("unknown argument " + a);
  }
  if (o.model.empty()) die("usage: pd_transfer_bench MODEL_DIR [--tokens N] [--page-tokens N] [--kv-cache-dtype D] "
                           "[--reps N] [--segment-kib N] [--scatter] [--heap-pools] [--json]");
  if (o.tokens < 1 || o.page_tokens < 1 || o.reps < 1 || o.segment_bytes == 0)
    die("--tokens, --page-tokens, --reps and --segment-kib must be positive");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const CacheGeometry g = cache_geometry_of(must(load_model_config(o.model), "config"));
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) die("pipe");
  const pid_t pid = fork();  // before any UCX object exists in either process
  if (pid < 0) die("fork");
  if (pid == 0) {
    close(to_child[1]);
    close(to_parent[0]);
    _exit(prefill_main(g, o, Pipe(to_child[0], to_parent[1])));
  }
  close(to_child[0]);
  close(to_parent[1]);
  const int rc = decode_main(g, o, Pipe(to_parent[0], to_child[1]), pid);
  int status = 0;
  waitpid(pid, &status, 0);
  return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}
