#include "pd/decode_arenas.h"

#include <algorithm>

namespace kestrel::pd {

Result<std::shared_ptr<DecodeArenas>> DecodeArenas::create(const std::string& transports) {
  auto c = disagg::Context::create(transports);
  if (!c) return c.error();
  return std::shared_ptr<DecodeArenas>(new DecodeArenas(std::move(*c)));
}

Result<std::shared_ptr<std::byte>> DecodeArenas::allocate(size_t bytes, const char* what) {
  auto r = disagg::Region::allocate(context_, bytes);
  if (!r) return Status(r.error().code(), std::string("decode arenas: ") + what + ": " + r.error().message());
  std::shared_ptr<disagg::Region> region = std::move(*r);
  std::lock_guard<std::mutex> lk(mu_);
  std::erase_if(regions_, [](const std::weak_ptr<disagg::Region>& w) { return w.expired(); });
  regions_.push_back(region);
  return std::shared_ptr<std::byte>(region, region->base());
}

std::shared_ptr<disagg::Region> DecodeArenas::region_of(std::span<const std::byte> arena) {
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& w : regions_) {
    std::shared_ptr<disagg::Region> r = w.lock();
    if (r != nullptr && r->base() == arena.data() && arena.size() <= r->length()) return r;
  }
  return nullptr;
}

}  // namespace kestrel::pd
