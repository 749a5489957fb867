#include "pd/pd_metrics.h"

#include <utility>
#include <vector>

#include "server/metrics_text.h"

namespace kestrel::pd {

namespace {

using server::histogram;
using server::metric;

void role(std::string& o, const char* name) {
  o += "# HELP kestrel_pd_role_info The disaggregation role of this instance.\n# TYPE kestrel_pd_role_info gauge\n";
  o += std::string("kestrel_pd_role_info{role=\"") + name + "\"} 1\n";
}

void failed(std::string& o, const std::vector<std::pair<const char*, uint64_t>>& by_reason) {
  o += "# HELP kestrel_pd_handoffs_failed_total Hand-offs that failed, by reason.\n"
       "# TYPE kestrel_pd_handoffs_failed_total counter\n";
  for (const auto& [reason, n] : by_reason)
    o += std::string("kestrel_pd_handoffs_failed_total{reason=\"") + reason + "\"} " + std::to_string(n) + "\n";
}

void common(std::string& o, uint64_t started, uint64_t completed, uint64_t withdrawn, size_t in_flight,
            uint64_t bytes, const Histogram& h, const char* latency_help) {
  metric(o, "kestrel_pd_handoffs_started_total", "counter", "Hand-offs begun.", double(started));
  metric(o, "kestrel_pd_handoffs_completed_total", "counter", "Hand-offs whose state arrived verified.",
         double(completed));
  metric(o, "kestrel_pd_handoffs_withdrawn_total", "counter",
         "Decode reservations withdrawn because the prefill's request ended first (freed at once).", double(withdrawn));
  metric(o, "kestrel_pd_handoffs_in_flight", "gauge", "Hand-offs begun and not ended.", double(in_flight));
  metric(o, "kestrel_pd_transfer_bytes_total", "counter", "Bytes of state moved by completed hand-offs.",
         double(bytes));
  histogram(o, "kestrel_pd_handoff_seconds", latency_help, h.bounds(), h.counts(), h.sum(), h.n());
}

}  // namespace

std::string prefill_metrics_text(const PrefillCounts& c) {
  std::string o;
  role(o, "prefill");
  common(o, c.started, c.handed_off, c.withdrawn, c.in_flight, c.bytes, c.seconds,
         "Parked after the first token until the completion was sent.");
  failed(o, {{"no_destinations", c.no_destinations}, {"lease", c.lease_expired}, {"transfer", c.transfer_failed}});
  metric(o, "kestrel_pd_handoffs_cancelled_total", "counter",
         "Parked or transferring requests released by a cancel (the client's, or the decode instance's).",
         double(c.cancelled));
  metric(o, "kestrel_pd_cancel_messages_total", "counter", "Cancels received from decode instances.",
         double(c.cancel_messages));
  return o;
}

std::string decode_metrics_text(const DecodeCounts& c) {
  std::string o;
  role(o, "decode");
  common(o, c.started, c.received, c.withdrawn, c.in_flight, c.bytes, c.seconds,
         "Destinations sent until the completion was verified.");
  metric(o, "kestrel_pd_handoffs_advertised_total", "counter",
         "Reservations whose destinations were sent to the prefill instance.", double(c.advertised));
  failed(o, {{"corrupt", c.failed_corrupt}, {"deadline", c.failed_deadline}, {"sender", c.failed_sender},
             {"peer", c.failed_peer}});
  metric(o, "kestrel_pd_handoffs_cancelled_total", "counter",
         "Hand-offs this instance called off (its client cancelled, or its request ended first): the prefill told.",
         double(c.cancelled));
  metric(o, "kestrel_pd_handoffs_cancel_confirmed_total", "counter",
         "Called-off transfers the prefill confirmed stopped (every put flushed): memory freed at once.",
         double(c.cancel_confirmed));
  metric(o, "kestrel_pd_quarantined_handoffs", "gauge",
         "Failed hand-offs whose memory waits until the peer can no longer write.", double(c.quarantined));
  metric(o, "kestrel_pd_quarantined_bytes", "gauge", "Bytes of those quarantined hand-offs.",
         double(c.quarantined_bytes));
  metric(o, "kestrel_pd_registry_held_ranges", "gauge", "Memory ranges advertised to a peer and not yet free.",
         double(c.registry.held_ranges));
  return o;
}

std::string recompute_metrics_text(const RecomputeCounts& c) {
  std::string o;
  metric(o, "kestrel_pd_handoffs_recomputed_total", "counter",
         "Requests run on this decode instance from their prompt after their hand-off failed or could not start.",
         double(c.recomputed));
  metric(o, "kestrel_pd_recompute_refused_total", "counter",
         "Of those, the ones this instance could not run either (the client got both reasons).", double(c.failed));
  return o;
}

}  // namespace kestrel::pd
