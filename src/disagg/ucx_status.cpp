#include "disagg/ucx_status.h"

#include <string>

namespace kestrel::disagg {

Status ucx_error(ucs_status_t status, std::string_view call) {
  std::string message = "disagg: " + std::string(call) + " failed: " + ucs_status_string(status);
  switch (status) {
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_REJECTED:
    case UCS_ERR_CANCELED:
    case UCS_ERR_NOT_CONNECTED:
      return unavailable(std::move(message));
    default:
      return {StatusCode::kInternal, std::move(message)};
  }
}

}  // namespace kestrel::disagg
