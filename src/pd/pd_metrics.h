// Prometheus text of a disaggregated role's hand-offs (appended to /metrics by PdService): started, completed,
// failed by reason, cancelled, withdrawn, in flight, bytes moved, a latency histogram, and on the decode side the
// memory quarantined after failures.
#pragma once

#include <string>

#include "pd/decode_handoff.h"
#include "pd/prefill_handoff.h"
#include "pd/recompute.h"

namespace kestrel::pd {

std::string prefill_metrics_text(const PrefillCounts& c);
std::string decode_metrics_text(const DecodeCounts& c);
// The decode role under --handoff-failure recompute (pd/recompute.h).
std::string recompute_metrics_text(const RecomputeCounts& c);

}  // namespace kestrel::pd
