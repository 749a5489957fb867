#include "disagg/memory.h"

#include "disagg/ucx_status.h"
#include "disagg/worker.h"

namespace kestrel::disagg {

Result<std::unique_ptr<Region>> Region::map(Worker& worker, void* base, size_t length) {
  if (base == nullptr || length == 0) return invalid_argument("disagg: cannot register an empty region");
  std::unique_ptr<Region> r(new Region(worker.shared_context(), static_cast<std::byte*>(base), length));
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = base;
  params.length = length;
  ucs_status_t st = ucp_mem_map(r->context_->handle(), &params, &r->memh_);
  if (st != UCS_OK) return ucx_error(st, "ucp_mem_map");
  if (Status s = r->pack(); !s.is_ok()) return s;
  return r;
}

Result<std::unique_ptr<Region>> Region::allocate(std::shared_ptr<Context> context, size_t length) {
  if (context == nullptr || length == 0) return invalid_argument("disagg: cannot allocate an empty region");
  std::unique_ptr<Region> r(new Region(std::move(context), nullptr, length));
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.length = length;
  params.flags = UCP_MEM_MAP_ALLOCATE;
  ucs_status_t st = ucp_mem_map(r->context_->handle(), &params, &r->memh_);
  if (st != UCS_OK) return ucx_error(st, "ucp_mem_map(allocate " + std::to_string(length) + " bytes)");
  r->allocated_ = true;
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  st = ucp_mem_query(r->memh_, &attr);
  if (st != UCS_OK) return ucx_error(st, "ucp_mem_query");
  if (attr.length < length) return io_error("disagg: UCX allocated fewer bytes than asked");
  r->base_ = static_cast<std::byte*>(attr.address);
  if (Status s = r->pack(); !s.is_ok()) return s;
  return r;
}

Status Region::pack() {
  void* packed = nullptr;
  size_t packed_len = 0;
  ucs_status_t st = ucp_rkey_pack(context_->handle(), memh_, &packed, &packed_len);
  if (st != UCS_OK) return ucx_error(st, "ucp_rkey_pack");
  const auto* p = static_cast<const std::byte*>(packed);
  packed_rkey_.assign(p, p + packed_len);
  ucp_rkey_buffer_release(packed);
  return Status::ok();
}

Region::~Region() {
  if (memh_ != nullptr) ucp_mem_unmap(context_->handle(), memh_);
}

}  // namespace kestrel::disagg
