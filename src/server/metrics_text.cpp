#include "server/metrics_text.h"

#include <cstdio>

namespace kestrel::server {

void metric(std::string& out, const char* name, const char* type, const char* help, double v) {
  char buf[64];
  snprintf(buf, sizeof buf, "%.17g", v);
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + buf + "\n";
}

void histogram(std::string& out, const char* name, const char* help, const std::vector<double>& bounds,
               const std::vector<int64_t>& counts, double sum, int64_t n) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
  char buf[96];
  for (size_t i = 0; i < bounds.size() && i < counts.size(); ++i) {
    snprintf(buf, sizeof buf, "%.6g", bounds[i]);
    out += std::string(name) + "_bucket{le=\"" + buf + "\"} " + std::to_string(counts[i]) + "\n";
  }
  out += std::string(name) + "_bucket{le=\"+Inf\"} " + std::to_string(n) + "\n";
  snprintf(buf, sizeof buf, "%.17g", sum);
  out += std::string(name) + "_sum " + buf + "\n" + name + "_count " + std::to_string(n) + "\n";
}

namespace {

// kestrel_prefix_cache_<tier>_*: one lower tier of the prefix cache (host memory L2, disk L3, Redis L4).
void tier_metrics(std::string& o, const std::string& tier, const TierCounters& t) {
  const std::string base = "kestrel_prefix_cache_" + tier + "_";
  auto m = [&](const char* name, const char* type, const std::string& help, double v) {
    metric(o, (base + name).c_str(), type, help.c_str(), v);
  };
  const std::string the = "the " + tier + " tier";
  m("queries_total", "counter", "Admissions that looked on " + the + " for a deeper prefix than the live hit.",
    double(t.queries));
  m("hits_total", "counter", "Admissions restored from " + the + ".", double(t.hits));
  m("hit_tokens_total", "counter", "Prompt tokens restored from " + the + " (included in the hit tokens).",
    double(t.hit_tokens));
  m("objects_submitted_total", "counter", "Objects queued for writing to " + the + ".", double(t.submitted));
  m("objects_written_total", "counter", "Objects written to " + the + ".", double(t.written));
  m("objects_dropped_total", "counter", "Objects dropped before writing (writer queue full, shutdown).",
    double(t.dropped));
  m("write_errors_total", "counter", "Failed writes to " + the + ".", double(t.write_errors));
  m("read_errors_total", "counter", "Errors reading " + the + " (I/O, connection, timeout): no hit from it.",
    double(t.read_errors));
  m("skipped_total", "counter", "Lookups not made: " + the + " was backing off after a read error.",
    double(t.skipped));
  m("corrupt_total", "counter", "Objects of " + the + " that failed verification (checksum, identity, shape) and were erased.",
    double(t.corrupt));
  m("incomplete_total", "counter", "Boundaries of " + the + " found with one of their two objects missing (no hit).",
    double(t.incomplete));
  m("no_room_total", "counter", "Verified hits of " + the + " skipped for want of free cache blocks.", double(t.no_room));
  m("read_bytes_total", "counter", "Object bytes read from " + the + ".", double(t.read_bytes));
  m("write_bytes_total", "counter", "Object bytes written to " + the + ".", double(t.write_bytes));
  m("read_seconds_total", "counter", "Wall time of reads from " + the + ", summed.", double(t.read_ns) * 1e-9);
  m("write_seconds_total", "counter", "Wall time of writes to " + the + ", summed.", double(t.write_ns) * 1e-9);
  m("lookup_seconds_total", "counter", "Time admissions waited on " + the + " (lookups and reads), summed.",
    double(t.lookup_ns) * 1e-9);
  if (t.objects >= 0) {  // a shared store (Redis) cannot know what it holds for this server
    m("objects", "gauge", "Objects held by " + the + ".", double(t.objects));
    m("bytes", "gauge", "Bytes held by " + the + ".", double(t.bytes));
    m("evictions_total", "counter", "Objects " + the + " removed for its budget.", double(t.evictions));
  }
}

}  // namespace

std::string prometheus_text(const ServiceStats& s, bool ready) {
  std::string o;
  metric(o, "kestrel_ready", "gauge", "1 when the model is loaded and the loop runs.", ready ? 1 : 0);
  metric(o, "kestrel_requests_waiting", "gauge", "Requests queued, not yet admitted.", double(s.waiting));
  metric(o, "kestrel_requests_running", "gauge", "Admitted sequences.", double(s.running));
  metric(o, "kestrel_kv_blocks_used", "gauge", "KV cache pages allocated (running sequences and the prefix cache).", double(s.kv_blocks_used));
  metric(o, "kestrel_kv_blocks_total", "gauge", "KV cache pages in total.", double(s.kv_blocks_total));
  metric(o, "kestrel_state_slots_used", "gauge", "Recurrent-state slots in use.", double(s.state_slots_used));
  metric(o, "kestrel_state_slots_total", "gauge", "Recurrent-state slots in total.", double(s.state_slots_total));
  if (!s.rank_sequences.empty()) {  // a cell with data-parallel attention: each rank's own pools
    metric(o, "kestrel_cell_rank_cache_bytes", "gauge", "Cache pool bytes (KDA slots, MLA and indexer pages) on each rank.",
           double(s.rank_cache_bytes));
    auto per_rank = [&](const char* name, const char* help, const std::vector<int64_t>& v) {
      o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " gauge\n";
      for (size_t r = 0; r < v.size(); ++r)
        o += std::string(name) + "{rank=\"" + std::to_string(r) + "\"} " + std::to_string(v[r]) + "\n";
    };
    per_rank("kestrel_cell_rank_sequences", "Sequences held by each rank of the cell.", s.rank_sequences);
    per_rank("kestrel_cell_rank_kv_blocks_used", "KV cache pages in use on each rank of the cell.", s.rank_kv_blocks_used);
  }
  metric(o, "kestrel_prompt_tokens_total", "counter", "Prompt tokens processed.", double(s.prompt_tokens_total));
  metric(o, "kestrel_generation_tokens_total", "counter", "Tokens generated.", double(s.generation_tokens_total));
  metric(o, "kestrel_preemptions_total", "counter", "Sequences preempted.", double(s.preemptions_total));
  metric(o, "kestrel_requests_cancelled_total", "counter", "Requests cancelled.", double(s.cancelled_total));
  metric(o, "kestrel_requests_finished_total", "counter", "Requests finished.", double(s.requests_finished_total));
  if (s.prefix_cache) {
    const PrefixCacheStats& p = s.prefix;
    metric(o, "kestrel_prefix_cache_queries_total", "counter", "Prefix-cache lookups (one per admission).", double(p.queries));
    metric(o, "kestrel_prefix_cache_query_tokens_total", "counter", "Prompt tokens looked up.", double(p.query_tokens));
    metric(o, "kestrel_prefix_cache_hit_tokens_total", "counter", "Prompt tokens reused (live pools and lower tiers).",
           double(p.hit_tokens));
    metric(o, "kestrel_prefix_cache_blocks", "gauge", "Blocks the prefix cache holds.", double(p.cached_blocks));
    metric(o, "kestrel_prefix_cache_snapshots", "gauge", "KDA state snapshots the prefix cache holds.", double(p.snapshots));
    metric(o, "kestrel_prefix_cache_snapshot_bytes", "gauge", "Bytes of those snapshots.", double(p.snapshot_bytes));
    metric(o, "kestrel_prefix_cache_snapshot_capacity", "gauge", "Snapshots the pool can hold.", double(p.snapshot_capacity));
    metric(o, "kestrel_prefix_cache_evicted_blocks_total", "counter", "Blocks evicted for pool pressure.",
           double(p.evicted_blocks));
    metric(o, "kestrel_prefix_cache_evicted_snapshots_total", "counter", "Snapshots evicted (pool pressure or with their block).",
           double(p.evicted_snapshots));
    metric(o, "kestrel_prefix_cache_flushes_total", "counter", "Admin flushes.", double(p.flushes));
    if (p.host.on) tier_metrics(o, "host", p.host);
    if (p.disk.on) tier_metrics(o, "disk", p.disk);
    if (p.redis.on) tier_metrics(o, "redis", p.redis);
  }
  histogram(o, "kestrel_time_to_first_token_seconds", "Time to first token.", s.buckets, s.ttft_counts, s.ttft_sum,
            s.ttft_n);
  histogram(o, "kestrel_time_per_output_token_seconds", "Time per output token after the first.", s.buckets,
            s.tpot_counts, s.tpot_sum, s.tpot_n);
  histogram(o, "kestrel_step_sequences", "Sequences per batched forward (decodes and prefill chunks).",
            s.step_sequences_buckets, s.step_sequences_counts, s.step_sequences_sum, s.steps_total);
  metric(o, "kestrel_step_sequences_max", "gauge", "Most sequences in one batched forward so far.",
         double(s.step_sequences_max));
  return o;
}

std::string prometheus_image_text(const ImageMetrics& m, const ImageQueueMetrics& q) {
  std::string o;
  metric(o, "kestrel_images_total", "counter", "Images encoded by the vision tower.", double(m.images_total));
  metric(o, "kestrel_image_tokens_total", "counter", "Image tokens (<|media_pad|> positions) of the encoded images.",
         double(m.image_tokens_total));
  metric(o, "kestrel_images_rejected_total", "counter", "Requests refused for an image (format, limits, URL).",
         double(m.rejected_total));
  metric(o, "kestrel_image_encodes_total", "counter", "Vision tower batches run (one per request with images).",
         double(m.encodes_total));
  metric(o, "kestrel_image_encode_seconds_total", "counter", "Wall time of the vision tower + projector batches.",
         m.encode_seconds_sum);
  metric(o, "kestrel_image_requests_waiting", "gauge", "Requests with images waiting for an image worker.",
         double(q.waiting));
  metric(o, "kestrel_image_requests_running", "gauge", "Requests with images being decoded and encoded now.",
         double(q.running));
  metric(o, "kestrel_image_requests_refused_total", "counter", "Requests with images refused: image queue full (429).",
         double(q.refused_total));
  metric(o, "kestrel_image_requests_cancelled_total", "counter",
         "Requests whose client went away before their images were ready.", double(q.cancelled_total));
  metric(o, "kestrel_image_requests_timed_out_total", "counter",
         "Requests whose deadline passed before their images were ready (503).", double(q.timed_out_total));
  return o;
}

}  // namespace kestrel::server
