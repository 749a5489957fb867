#include "disagg/memory.h"

#include "disagg/ucx_status.h"
#include "disagg/worker.h"

namespace kestrel::disagg {

Result<std::unique_ptr<Region>> Region::map(Worker& worker, void* base, size_t length) {
  if (base == nullptr || length == 0) return invalid_argument("disagg: cannot register an empty region");
  std::unique_ptr<Region> r(new Region(worker.context(), static_cast<std::byte*>(base), length));
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = base;
  params.length = length;
  ucs_status_t st = ucp_mem_map(worker.context(), &params, &r->memh_);
  if (st != UCS_OK) return ucx_error(st, "ucp_mem_map");
  void* packed = nullptr;
  size_t packed_len = 0;
  st = ucp_rkey_pack(worker.context(), r->memh_, &packed, &packed_len);
  if (st != UCS_OK) return ucx_error(st, "ucp_rkey_pack");
  const auto* p = static_cast<const std::byte*>(packed);
  r->packed_rkey_.assign(p, p + packed_len);
  ucp_rkey_buffer_release(packed);
  return r;
}

Region::~Region() {
  if (memh_ != nullptr) ucp_mem_unmap(context_, memh_);
}

}  // namespace kestrel::disagg
