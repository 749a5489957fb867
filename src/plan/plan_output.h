// Renders a Plan: machine-readable JSON (schema "kestrel.plan/1", documented in docs/PERFORMANCE.md)
// and a human table. Byte fields are bytes, rates are per second, times are seconds.
#pragma once

#include <string>

#include "plan/planner.h"

namespace kestrel::plan {

std::string plan_json(const Plan& p);
std::string plan_table(const Plan& p);

}  // namespace kestrel::plan
