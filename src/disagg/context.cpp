#include "disagg/context.h"

#include <cstdlib>

#include "disagg/ucx_status.h"

namespace kestrel::disagg {

Result<std::shared_ptr<Context>> Context::create(const std::string& transports) {
  std::shared_ptr<Context> c(new Context());
  const char* env = std::getenv("UCX_TLS");
  c->transports_ = !transports.empty() ? transports : env != nullptr ? env : "";
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return ucx_error(st, "ucp_config_read");
  if (!transports.empty()) st = ucp_config_modify(config, "TLS", transports.c_str());
  if (st != UCS_OK) {
    ucp_config_release(config);
    return ucx_error(st, "ucp_config_modify(TLS=" + transports + ")");
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
  params.mt_workers_shared = 0;
  st = ucp_init(&params, config, &c->context_);
  ucp_config_release(config);
  if (st != UCS_OK) return ucx_error(st, "ucp_init");
  return c;
}

Context::~Context() {
  if (context_ != nullptr) ucp_cleanup(context_);
}

}  // namespace kestrel::disagg
