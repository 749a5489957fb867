// Prometheus text exposition (format 0.0.4) of the scheduler's ServiceStats. Pure function; thread-safe.
#pragma once

#include <string>

#include "scheduler/engine_service.h"

namespace kestrel::server {

std::string prometheus_text(const ServiceStats& s, bool ready);

}  // namespace kestrel::server
