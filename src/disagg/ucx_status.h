// ucx_error: a UCX status as a kestrel Status naming the call that failed.
#pragma once

#include <ucs/type/status.h>

#include <string_view>

#include "base/result.h"

namespace kestrel::disagg {

// kUnavailable for a lost or unreachable peer and timeouts (the request may be retried elsewhere), kInternal for
// everything else. Never called with UCS_OK.
Status ucx_error(ucs_status_t status, std::string_view call);

}  // namespace kestrel::disagg
