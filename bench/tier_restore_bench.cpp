// Restore bandwidth of the prefix cache's lower tiers against memcpy: what an admission pays to bring one boundary's
// pages object back into the pools, per tier. One thread, as on the scheduler thread.
//   tier_restore_bench [MiB=64] [reps=5] [--redis HOST:PORT]
// Rows (best of reps, GB/s of payload):
//   memcpy          the payload copied once (the floor of any restore: the copy into the pool's blocks)
//   verify          parse_tier_object_view alone (SHA-256 over the object, the identity and shape checks)
//   host  (L2)      get_shared + verify + copy into the destination (what a host-memory hit costs)
//   disk  (L3)      get (read(2) from a fresh file in the page cache: no device I/O) + verify + copy
//   redis (L4)      GET over the connection + verify + copy (only with --redis)
//   serialize       serialize_tier_object: the copy and checksum each stored boundary costs on the scheduler thread
//                   when a tier is on
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "cache/disk_store.h"
#include "cache/host_store.h"
#include "cache/redis_store.h"
#include "cache/tier_object.h"

namespace {

using namespace kestrel;

double best_gbs(int reps, size_t bytes, const std::function<bool()>& run) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!run()) return -1;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(bytes) / s * 1e-9);
  }
  return best;
}

void row(const char* name, double gbs, double memcpy_gbs) {
  if (gbs < 0) {
    std::printf("%-12s failed\n", name);
    return;
  }
  std::printf("%-12s %8.2f GB/s  %5.2fx memcpy\n", name, gbs, gbs / memcpy_gbs);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> pos;
  std::string redis;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--redis" && i + 1 < argc) redis = argv[++i];
    else pos.emplace_back(argv[i]);
  }
  const size_t mib = pos.size() > 0 ? static_cast<size_t>(std::atoll(pos[0].c_str())) : 64;
  const int reps = pos.size() > 1 ? std::atoi(pos[1].c_str()) : 5;
  const size_t n = mib << 20;

  TierObject o;
  o.kind = TierPayloadKind::kPages;
  o.blocks = static_cast<uint32_t>(mib);  // 1 MiB blocks: the format checks only that they are equal
  o.key = model_digest("bench-key");
  o.model = model_digest("bench-model");
  o.payload.resize(n);
  for (size_t i = 0; i < n; ++i) o.payload[i] = static_cast<uint8_t>(i * 131 + (i >> 12));
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> dst(n, 1);
  const Digest name = tier_store_key(o.key, o.kind);
  auto restore = [&](std::span<const uint8_t> obj) {
    auto v = parse_tier_object_view(obj, o.key, o.model, o.kind);
    if (!v || v->payload.size() != n) return false;
    std::memcpy(dst.data(), v->payload.data(), n);
    return true;
  };

  std::printf("object %zu MiB, best of %d, one thread\n", mib, reps);
  const double mc = best_gbs(reps, n, [&] {
    std::memcpy(dst.data(), o.payload.data(), n);
    return true;
  });
  row("memcpy", mc, mc);
  row("serialize", best_gbs(reps, n, [&] {
        bytes = serialize_tier_object(o);
        return true;
      }), mc);
  row("verify", best_gbs(reps, n, [&] {
        return static_cast<bool>(parse_tier_object_view(bytes, o.key, o.model, o.kind));
      }), mc);

  auto host = HostStore::create(HostStoreOptions{static_cast<int64_t>(2 * bytes.size())});
  if (!host || !(*host)->put(name, bytes).is_ok()) return 1;
  row("host (L2)", best_gbs(reps, n, [&] {
        auto g = (*host)->get_shared(name);
        return g && *g && restore(**g);
      }), mc);

  char tmpl[] = "/tmp/kestrel-tier-bench-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) ? tmpl : "";
  if (!dir.empty()) {
    {
      auto disk = DiskStore::open(DiskStoreOptions{dir, static_cast<int64_t>(2 * bytes.size()), {}});
      if (disk && (*disk)->put(name, bytes).is_ok()) {
        row("disk (L3)", best_gbs(reps, n, [&] {
              auto g = (*disk)->get(name);
              return g && g->has_value() && restore(**g);
            }), mc);
      }
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  if (!redis.empty()) {
    RedisStoreOptions ro;
    const auto colon = redis.rfind(':');
    ro.host = redis.substr(0, colon);
    ro.port = std::atoi(redis.substr(colon + 1).c_str());
    ro.key_prefix = "kestrel:bench:";
    ro.connect_timeout_ms = ro.command_timeout_ms = 30000;
    auto r = RedisStore::create(ro);
    if (r && (*r)->put(name, bytes).is_ok()) {
      row("redis (L4)", best_gbs(reps, n, [&] {
            auto g = (*r)->get(name);
            return g && g->has_value() && restore(**g);
          }), mc);
      (void)(*r)->erase(name);
    } else {
      std::printf("redis (L4)   unreachable at %s\n", redis.c_str());
    }
  }
  return 0;
}
