// The prefix cache's lower tiers on /metrics: each configured tier (host memory L2, disk L3, Redis L4) publishes the same counter
// set under its own name; a shared Redis has no object or byte gauges (it cannot know them); an absent tier
// publishes nothing.
#include "server/metrics_text.h"

#include <gtest/gtest.h>

#include <string>

namespace kestrel::server {
namespace {

bool has_line(const std::string& text, const std::string& line) { return text.find("\n" + line + "\n") != std::string::npos; }

TEST(MetricsText, LowerTierCountersPerTier) {
  ServiceStats s;
  s.prefix_cache = true;
  s.prefix.redis.on = true;
  s.prefix.redis.queries = 7;
  s.prefix.redis.hits = 3;
  s.prefix.redis.hit_tokens = 96;
  s.prefix.redis.corrupt = 1;
  s.prefix.redis.incomplete = 2;
  s.prefix.redis.read_errors = 4;
  s.prefix.redis.skipped = 5;
  s.prefix.redis.submitted = 9;
  s.prefix.redis.written = 8;
  s.prefix.redis.write_errors = 1;
  s.prefix.redis.dropped = 6;
  s.prefix.redis.read_bytes = 1000;
  s.prefix.redis.write_bytes = 2000;
  s.prefix.redis.read_ns = 1500000000;
  s.prefix.redis.write_ns = 250000000;
  s.prefix.redis.lookup_ns = 500000000;
  s.prefix.redis.objects = -1;
  s.prefix.redis.bytes = -1;
  std::string t = prometheus_text(s, true);
  for (const char* line :
       {"kestrel_prefix_cache_redis_queries_total 7", "kestrel_prefix_cache_redis_hits_total 3",
        "kestrel_prefix_cache_redis_hit_tokens_total 96", "kestrel_prefix_cache_redis_corrupt_total 1",
        "kestrel_prefix_cache_redis_incomplete_total 2", "kestrel_prefix_cache_redis_read_errors_total 4",
        "kestrel_prefix_cache_redis_skipped_total 5", "kestrel_prefix_cache_redis_objects_submitted_total 9",
        "kestrel_prefix_cache_redis_objects_written_total 8", "kestrel_prefix_cache_redis_write_errors_total 1",
        "kestrel_prefix_cache_redis_objects_dropped_total 6", "kestrel_prefix_cache_redis_read_bytes_total 1000",
        "kestrel_prefix_cache_redis_write_bytes_total 2000", "kestrel_prefix_cache_redis_read_seconds_total 1.5",
        "kestrel_prefix_cache_redis_write_seconds_total 0.25",
        "kestrel_prefix_cache_redis_lookup_seconds_total 0.5", "# TYPE kestrel_prefix_cache_redis_hits_total counter"})
    EXPECT_TRUE(has_line(t, line)) << line;
  EXPECT_EQ(t.find("kestrel_prefix_cache_redis_objects "), std::string::npos) << "a shared store has no object gauge";
  EXPECT_EQ(t.find("kestrel_prefix_cache_redis_bytes "), std::string::npos);
  EXPECT_EQ(t.find("kestrel_prefix_cache_disk_"), std::string::npos) << "no disk tier configured";
  EXPECT_EQ(t.find("kestrel_prefix_cache_host_"), std::string::npos) << "no host tier configured";

  s.prefix.disk.on = true;
  s.prefix.disk.hits = 2;
  s.prefix.disk.objects = 11;
  s.prefix.disk.bytes = 4096;
  s.prefix.disk.evictions = 3;
  t = prometheus_text(s, true);
  for (const char* line : {"kestrel_prefix_cache_disk_hits_total 2", "kestrel_prefix_cache_disk_objects 11",
                           "kestrel_prefix_cache_disk_bytes 4096", "kestrel_prefix_cache_disk_evictions_total 3",
                           "# TYPE kestrel_prefix_cache_disk_objects gauge", "kestrel_prefix_cache_redis_hits_total 3"})
    EXPECT_TRUE(has_line(t, line)) << line;

  s.prefix.host.on = true;
  s.prefix.host.queries = 12;
  s.prefix.host.hits = 10;
  s.prefix.host.hit_tokens = 640;
  s.prefix.host.corrupt = 1;
  s.prefix.host.written = 20;
  s.prefix.host.write_errors = 2;
  s.prefix.host.read_bytes = 5000;
  s.prefix.host.read_ns = 2000000;
  s.prefix.host.objects = 18;
  s.prefix.host.bytes = 1 << 20;
  s.prefix.host.evictions = 4;
  t = prometheus_text(s, true);
  for (const char* line :
       {"kestrel_prefix_cache_host_queries_total 12", "kestrel_prefix_cache_host_hits_total 10",
        "kestrel_prefix_cache_host_hit_tokens_total 640", "kestrel_prefix_cache_host_corrupt_total 1",
        "kestrel_prefix_cache_host_objects_written_total 20", "kestrel_prefix_cache_host_write_errors_total 2",
        "kestrel_prefix_cache_host_read_bytes_total 5000", "kestrel_prefix_cache_host_read_seconds_total 0.002",
        "kestrel_prefix_cache_host_objects 18", "kestrel_prefix_cache_host_bytes 1048576",
        "kestrel_prefix_cache_host_evictions_total 4", "# TYPE kestrel_prefix_cache_host_bytes gauge",
        "kestrel_prefix_cache_disk_hits_total 2", "kestrel_prefix_cache_redis_hits_total 3"})
    EXPECT_TRUE(has_line(t, line)) << line;

  s.prefix_cache = false;
  EXPECT_EQ(prometheus_text(s, true).find("kestrel_prefix_cache_"), std::string::npos);
}

}  // namespace
}  // namespace kestrel::server
