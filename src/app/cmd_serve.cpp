// `kestrel serve`: load the model, start the scheduler and the OpenAI-compatible HTTP server, then
// wait for SIGTERM/SIGINT: stop accepting, drain in-flight requests within --drain-seconds, exit 0.
// As a cell (`mpirun -np E kestrel serve --ep E`, docs/cell.md) rank 0 does all of that and every scheduler step
// runs on all ranks; the other ranks load their experts and follow until rank 0 stops. A failed cell step (a lost
// rank) fails the requests in flight, /health reports it, and rank 0 exits 1. Every rank also beats on the cell's
// liveness connections (dist/liveness.h): a rank gone or silent past --cell-liveness-ms makes /health answer 503
// while its collectives still wait, and one silent past --cell-deadline-ms ends the cell.
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <nlohmann/json.hpp>
#include <optional>

#include "app/args.h"
#include "app/cell_launch.h"
#include "app/cache_fingerprint.h"
#include "app/commands.h"
#include "app/host_port.h"
#include "app/image_service.h"
#include "app/k3_chat_format.h"
#include "cache/redis_store.h"
#include "chat/model_tokenizer.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/w4a8_gemm.h"
#include "scheduler/scheduler.h"
#include "pd/decode_arenas.h"
#include "pd/pd_service.h"
#include "server/api_handlers.h"
#include "server/http_server.h"

namespace kestrel::app {

namespace {
// Once listening: the chat page's URL and a curl line that pastes as is (wildcard addresses shown as loopback).
void print_ready(const std::string& address, uint16_t port, const std::string& model, bool with_key) {
  std::string host = address == "0.0.0.0" ? "127.0.0.1" : address == "::" ? "::1" : address;
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  const std::string base = "http://" + host + ":" + std::to_string(port);
  const nlohmann::json body = {{"model", model},
                               {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                               {"max_tokens", 16}};
  std::string quoted = body.dump();
  for (size_t i = 0; (i = quoted.find('\'', i)) != std::string::npos; i += 4) quoted.replace(i, 1, "'\\''");
  std::fprintf(stderr, "kestrel serve: ready. Chat page: %s/%s\n", base.c_str(),
               with_key ? " (paste the API key into its key field)" : "");
  std::fprintf(stderr, "kestrel serve: from a shell%s:\n", with_key ? " (with the key in $KESTREL_API_KEY)" : "");
  std::fprintf(stderr, "curl -s %s/v1/chat/completions -H 'Content-Type: application/json'%s -d '%s'\n", base.c_str(),
               with_key ? " -H \"Authorization: Bearer $KESTREL_API_KEY\"" : "", quoted.c_str());
  std::fflush(stderr);
}

// The Redis tier is optional at run time: a server that does not answer now is reported in one line, and serving
// goes on (lookups and writes count their errors and recompute until it answers).
void report_redis(const PrefixCacheConfig& c) {
  RedisStoreOptions o;
  o.host = c.redis_host;
  o.port = c.redis_port;
  o.connect_timeout_ms = c.redis_timeout_ms;
  o.command_timeout_ms = c.redis_timeout_ms;
  auto store = RedisStore::create(o);
  const Status st = store ? (*store)->ping() : store.error();
  if (!st.is_ok())
    std::fprintf(stderr, "kestrel serve: the prefix cache's Redis tier does not answer (%s); serving without it until it does\n",
                 st.message().c_str());
}
// A rank other than 0: loads its experts, owns cache pools like rank 0's (rank 0's scheduler places sequences
// in them), runs rank 0's steps until rank 0 stops, exits 0.
int serve_follower(CellLaunch& c, const Args& a, const CachePoolConfig& pc, dist::Liveness& liveness) {
  if (Status s = c.comm->barrier(); !s.is_ok()) cell_exit(c, s);  // rank 0 resolved (maybe generated) the model
  int rc = 0;
  const std::string dir = resolve_model_or_default(a.str("model"), false, rc, a.str("preset"));
  if (rc) cell_exit(c, invalid_argument("no model"));
  auto eng = Engine::load(dir, &c.shard);
  if (!eng) cell_exit(c, eng.error());
  auto pools = CachePools::create((*eng)->model().cache_geometry(), pc);
  if (!pools) cell_exit(c, pools.error());
  std::fprintf(stderr, "kestrel serve: rank %d of %d: cache pools %lld bytes (%d KDA slots, %lld pages of %lld tokens)\n",
               c.shard.rank, c.shard.size, static_cast<long long>((*pools)->arena_bytes()), (*pools)->num_slots(),
               static_cast<long long>((*pools)->num_blocks()), static_cast<long long>((*pools)->page_tokens()));
  Cell cell((*eng)->model(), *c.comm, {}, pc.kv_dtype);
  cell.hold_in(**pools);
  if (Status s = cell.follow(); !s.is_ok()) cell_exit(c, s);
  liveness.expect_exit();  // rank 0 is stopping too: its connection closes any moment now
  std::fprintf(stderr, "kestrel serve: rank %d of %d: stopped\n", c.shard.rank, c.shard.size);
  return 0;
}
}  // namespace

int cmd_serve(const std::vector<std::string>& argv) {
  int exit_code = 0;
  auto a = Args::parse("serve", argv, exit_code);
  if (!a) return exit_code;
  // Block the shutdown signals before any thread starts; the main thread waits for them below.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  long long port = 0, cache_mib = 0, max_running = 0, max_waiting = 0, batch = 0, chunk = 0, ctx = 0, page = 0,
            timeout = 0, drain = 0, http_threads = 0, body_mib = 0, snapshot_mib = 0, host_mib = 0,
            disk_mib = 0, redis_timeout_ms = 0, max_images = 0, image_mib = 0, image_pixels = 0, image_tokens = 0,
            image_workers = 0, image_queue = 0, url_timeout_ms = 0, url_redirects = 0;
  for (auto [flag, dst, lo, hi] : std::initializer_list<std::tuple<const char*, long long*, long long, long long>>{
           {"port", &port, 0, 65535}, {"cache-mib", &cache_mib, 16, 1 << 22},
           {"max-running", &max_running, 1, 4096}, {"max-waiting", &max_waiting, 0, 1 << 20},
           {"max-batch-tokens", &batch, 1, 1 << 20}, {"prefill-chunk", &chunk, 1, 1 << 20},
           {"max-context", &ctx, 16, 1 << 24}, {"page-tokens", &page, 1, 1 << 16},
           {"timeout-seconds", &timeout, 1, 1 << 24}, {"drain-seconds", &drain, 0, 3600},
           {"http-threads", &http_threads, 1, 256}, {"max-body-mib", &body_mib, 1, 1024},
           {"prefix-cache-snapshot-mib", &snapshot_mib, 0, 1 << 22}, {"prefix-cache-host-mib", &host_mib, 0, 1 << 24},
           {"prefix-cache-disk-mib", &disk_mib, 1, 1 << 26},
           {"prefix-cache-redis-timeout-ms", &redis_timeout_ms, 1, 60000}, {"max-images", &max_images, 0, 256},
           {"max-image-mib", &image_mib, 1, 1024}, {"max-image-pixels", &image_pixels, 1, 1LL << 32},
           {"max-image-tokens", &image_tokens, 1, 1 << 24}, {"image-workers", &image_workers, 1, 64},
           {"image-queue", &image_queue, 0, 4096}, {"image-url-timeout-ms", &url_timeout_ms, 100, 600000},
           {"image-url-max-redirects", &url_redirects, 0, 10}}) {
    auto v = a->integer(flag);
    if (!v) return usage_error("serve", v.error());
    if (*v < lo || *v > hi)
      return usage_error("serve", invalid_argument(std::string("--") + flag + " must be in " + std::to_string(lo) +
                                                   ".." + std::to_string(hi)));
    *dst = *v;
  }
  // Remote image URLs: off unless --image-url-domains names the hosts (docs/vision.md §3.3).
  std::optional<media::UrlFetcher> fetcher;
  if (a->has("image-url-domains")) {
    auto hosts = media::HostAllowList::parse(a->str("image-url-domains"));
    if (!hosts) return usage_error("serve", invalid_argument("--image-url-domains: " + hosts.error().message()));
    media::UrlFetchOptions fo;
    fo.hosts = std::move(*hosts);
    fo.max_bytes = static_cast<size_t>(image_mib) << 20;
    fo.max_redirects = static_cast<int>(url_redirects);
    fo.timeout = std::chrono::milliseconds(url_timeout_ms);
    fo.connect_timeout = std::min(fo.timeout, std::chrono::milliseconds(5000));
    if (a->has("image-url-test-exempt-cidr")) {
      auto cidr = media::parse_test_exempt_cidr(a->str("image-url-test-exempt-cidr"));
      if (!cidr) return usage_error("serve", invalid_argument("--image-url-test-exempt-cidr: " + cidr.error().message()));
      fo.addresses.test_exempt = *cidr;
      std::fprintf(stderr, "kestrel serve: TEST ONLY: image URLs may reach %s (--image-url-test-exempt-cidr)\n",
                   a->str("image-url-test-exempt-cidr").c_str());
    }
    fetcher.emplace(std::move(fo));
  } else if (a->has("image-url-test-exempt-cidr")) {
    return usage_error("serve", invalid_argument("--image-url-test-exempt-cidr needs --image-url-domains"));
  }
  auto kv = kv_cache_dtype_flag(*a);
  if (!kv) return usage_error("serve", kv.error());
  auto ep = a->integer("ep");
  if (!ep) return usage_error("serve", ep.error());
  HostPort redis;
  if (a->has("prefix-cache-redis")) {
    auto hp = parse_host_port(a->str("prefix-cache-redis"));
    if (!hp) return usage_error("serve", invalid_argument("--prefix-cache-redis: " + hp.error().message()));
    redis = *hp;
  }
  if (!a->has("no-prefix-cache") && std::min(chunk, batch) % page != 0)
    return usage_error("serve", invalid_argument("the prefix cache needs --prefill-chunk (" +
                                                 std::to_string(std::min(chunk, batch)) +
                                                 ") to be a multiple of --page-tokens (" + std::to_string(page) +
                                                 "), or --no-prefix-cache"));
  auto lo = liveness_flags(*a);
  if (!lo) return usage_error("serve", lo.error());
  auto tp = a->integer("tp");
  if (!tp) return usage_error("serve", tp.error());
  auto launch = open_cell(*ep, *tp);
  if (!launch) return usage_error("serve", launch.error());
  CellLaunch* cl = launch->get();
  if (Status s = apply_numa(*a, cl, a->has("quiet")); !s.is_ok()) {  // before any thread pool or weight page
    if (cl != nullptr) cell_exit(*cl, s);
    return usage_error("serve", s);
  }
  std::unique_ptr<dist::Liveness> liveness;
  if (cl != nullptr) liveness = open_liveness(*cl, *lo, /*report_health=*/true);
  SchedulerConfig sc;  // the cache pools' part first: a cell's other ranks build the same pools
  sc.max_context = static_cast<int>(ctx);
  sc.cache.budget_bytes = cache_mib << 20;
  sc.cache.max_slots = static_cast<int>(max_running);
  sc.cache.page_tokens = page;
  sc.cache.kv_dtype = *kv;
  if (cl != nullptr && cl->shard.rank != 0) return serve_follower(*cl, *a, Scheduler::pool_config(sc), *liveness);
  // From here on an error on rank 0 of a cell ends the cell.
  auto fail = [&](const Status& s) {
    if (cl != nullptr) cell_exit(*cl, s);
    std::fprintf(stderr, "kestrel serve: %s\n", s.message().c_str());
    return 1;
  };
  int rc = 0;
  const std::string dir = resolve_model_or_default(a->str("model"), !a->has("quiet"), rc, a->str("preset"));
  if (rc) return cl != nullptr ? fail(invalid_argument("no model")) : rc;
  if (cl != nullptr)
    if (Status s = cl->comm->barrier(); !s.is_ok()) fail(s);
  auto tok = chat::load_model_tokenizer(dir);
  if (!tok) return fail(tok.error());
  auto eng = Engine::load(dir, cl != nullptr ? &cl->shard : nullptr);
  if (!eng) return fail(eng.error());
  print_load_notes(**eng, dir, !a->has("quiet"));
  sc.max_waiting = static_cast<int>(max_waiting);
  sc.max_batch_tokens = batch;
  sc.prefill_chunk = std::min(chunk, batch);
  sc.prefix_cache = !a->has("no-prefix-cache");
  sc.prefix.snapshot_budget_bytes = snapshot_mib << 20;
  sc.prefix.generation_snapshots = a->has("prefix-cache-generation-snapshots");
  sc.prefix.host_budget_bytes = host_mib << 20;
  sc.prefix.disk_dir = a->str("prefix-cache-disk");
  sc.prefix.disk_budget_bytes = disk_mib << 20;
  sc.prefix.redis_host = redis.host;
  sc.prefix.redis_port = redis.port;
  sc.prefix.redis_timeout_ms = static_cast<int>(redis_timeout_ms);
  {
    const bool shared_tiers = sc.prefix_cache && (!sc.prefix.disk_dir.empty() || !redis.host.empty());
    auto fp = cache_fingerprint(dir, kernels::bf16_acts_opt_in() || kernels::mxfp4_int8_enabled(), shared_tiers,
                                !a->has("quiet"));
    if (!fp) return fail(fp.error());
    sc.cache_fingerprint = *fp;
  }
  if (sc.prefix_cache && !redis.host.empty()) report_redis(sc.prefix);
  // In a cell every scheduler step is a cell step: each request's caches live on the rank it is placed on (rank 0's
  // prefix cache serves rank 0's requests), the experts everywhere.
  std::optional<Cell> cell;
  if (cl != nullptr) cell.emplace((*eng)->model(), *cl->comm, ForwardOptions{}, *kv);
  const std::string role = a->str("role");
  if (role != "both" && role != "prefill" && role != "decode")
    return usage_error("serve", invalid_argument("--role must be both, prefill or decode"));
  // A decode instance's pools are allocated through UCX, so that a prefill on the same host puts into them directly
  // (pd/decode_arenas.h).
  std::shared_ptr<pd::DecodeArenas> decode_arenas;
  if (role == "decode") {
    auto da = pd::DecodeArenas::create();
    if (!da) return fail(da.error());
    decode_arenas = std::move(*da);
    sc.cache.arenas = decode_arenas;
  }
  auto sched = Scheduler::create(**eng, sc, cell ? &*cell : nullptr);
  if (!sched) return fail(sched.error());
  if (cl != nullptr) {  // printed even with --quiet: the cell's memory layout
    const ServiceStats st = (*sched)->stats();
    std::fprintf(stderr, "kestrel serve: cell of %d ranks, data-parallel attention: each rank's cache pools %lld bytes "
                 "(%lld KDA slots, %lld pages each); the prefix cache serves rank 0's requests\n", cl->shard.size,
                 static_cast<long long>(st.rank_cache_bytes), static_cast<long long>(st.state_slots_total / cl->shard.size),
                 static_cast<long long>(st.kv_blocks_total / cl->shard.size));
  }
  // Prefill / decode roles: the hand-off service in front of the scheduler (destroyed before it).
  std::unique_ptr<pd::PdService> pd_service;
  const std::string on_failure = a->str("handoff-failure");
  if (on_failure != "fail" && on_failure != "recompute")
    return usage_error("serve", invalid_argument("--handoff-failure must be fail or recompute"));
  if (on_failure == "recompute" && role != "decode")
    return usage_error("serve", invalid_argument("--handoff-failure recompute applies to the decode role"));
  if (role != "both") {
    auto handoff_ms = a->integer("handoff-timeout-ms");
    if (!handoff_ms || *handoff_ms < 100 || *handoff_ms > 3'600'000)
      return usage_error("serve", invalid_argument("--handoff-timeout-ms must be in 100..3600000"));
    pd::PdServiceOptions po;
    po.role = role == "prefill" ? pd::Role::kPrefill : pd::Role::kDecode;
    po.handoff_failure = on_failure == "recompute" ? pd::HandoffFailure::kRecompute : pd::HandoffFailure::kFail;
    // The model's identity by content (the two instances may load it from different paths or hosts).
    auto fp = cache_fingerprint(dir, kernels::bf16_acts_opt_in() || kernels::mxfp4_int8_enabled(), /*shared_tiers=*/true,
                                !a->has("quiet"));
    if (!fp) return fail(fp.error());
    po.model_fingerprint = *fp;
    po.prefill.destinations_timeout = po.prefill.transfer_timeout = po.decode.transfer_timeout =
        std::chrono::milliseconds(*handoff_ms);
    // A request queued on the prefill renews the decode's deadline several times within it.
    po.prefill.queued_interval = std::chrono::milliseconds(std::min<long long>(1000, *handoff_ms / 4));
    po.decode.arenas = decode_arenas;
    // The prefill's UCX listener (used over tcp) binds where the HTTP server does; a host name: every interface.
    {
      in_addr probe{};
      const std::string host = a->str("host");
      po.prefill.listen_host = inet_pton(AF_INET, host.c_str(), &probe) == 1 ? host : "0.0.0.0";
    }
    auto ps = pd::PdService::create(**sched, po);
    if (!ps) return fail(ps.error());
    pd_service = std::move(*ps);
    std::fprintf(stderr, "kestrel serve: role %s, UCX transports %s, fingerprint %s\n", role.c_str(),
                 std::getenv("UCX_TLS") ? std::getenv("UCX_TLS") : "(UCX default)", pd_service->fingerprint().c_str());
  }
  EngineService& service = pd_service ? static_cast<EngineService&>(*pd_service) : static_cast<EngineService&>(**sched);
  K3ChatFormat format(*tok);
  server::ApiConfig ac;
  ac.model_id = a->str("served-model-name");
  ac.model_root = dir;
  ac.random_weights = !a->has("model");
  const char* env_key = std::getenv("KESTREL_API_KEY");
  ac.api_key = a->has("api-key") ? a->str("api-key") : env_key ? env_key : "";
  ac.request_timeout = std::chrono::seconds(timeout);
  ac.role = role == "prefill" ? "prefill" : role == "decode" ? "decode" : "both";
  if (liveness) ac.liveness = [l = liveness.get()] { return l->unhealthy(); };
  ImageRequestLimits il;
  il.max_images = static_cast<size_t>(max_images);
  il.per_image.max_file_bytes = static_cast<size_t>(image_mib) << 20;
  il.per_image.max_pixels = static_cast<uint64_t>(image_pixels);
  il.max_tokens = image_tokens;
  EngineImageService images(**eng, il, fetcher ? &*fetcher : nullptr);
  std::optional<server::ImageQueue> image_pool;
  if ((*eng)->has_vision() && max_images > 0) {
    image_pool.emplace(images, server::ImageQueueOptions{static_cast<int>(image_workers), static_cast<int>(image_queue)});
    ac.images = &*image_pool;
  }
  server::ApiServer api(ac, service, *tok, format);
  server::HttpServerOptions ho;
  ho.address = a->str("host");
  ho.port = static_cast<uint16_t>(port);
  ho.threads = static_cast<int>(http_threads);
  ho.max_body_bytes = static_cast<size_t>(body_mib) << 20;
  ho.shutdown_grace = std::chrono::seconds(drain);
  auto routes = api.make_router();
  // The prefill's bootstrap handshake: on the API port, or on its own port (--bootstrap-port).
  std::unique_ptr<server::HttpServer> bootstrap_http;
  if (pd_service && pd_service->role() == pd::Role::kPrefill) {
    auto bport = a->has("bootstrap-port") ? a->integer("bootstrap-port") : Result<long long>(port);
    if (!bport || *bport < 0 || *bport > 65535)
      return usage_error("serve", invalid_argument("--bootstrap-port must be in 0..65535"));
    if (a->has("bootstrap-port") && *bport != port) {
      auto br = std::make_shared<server::Router>();
      pd_service->add_routes(*br);
      server::HttpServerOptions bo = ho;
      bo.port = static_cast<uint16_t>(*bport);
      bootstrap_http = std::make_unique<server::HttpServer>(bo, br);
      Status bs = bootstrap_http->start();
      if (!bs.is_ok()) return fail(bs);
      std::fprintf(stderr, "kestrel serve: prefill bootstrap on %s:%u\n", bo.address.c_str(),
                   static_cast<unsigned>(bootstrap_http->port()));
    } else {
      pd_service->add_routes(*routes);
    }
  }
  server::HttpServer http(ho, routes);
  Status st = http.start();
  if (!st.is_ok()) return fail(st);
  const bool fast = kernels::bf16_acts_opt_in() || kernels::mxfp4_int8_enabled();
  std::fprintf(stderr, "kestrel serve: model %s (%s) on http://%s:%u%s, %s kernels\n", ac.model_id.c_str(), dir.c_str(),
               ho.address.c_str(), static_cast<unsigned>(http.port()), ac.api_key.empty() ? "" : " (API key required)",
               fast ? "fast (approximate)" : "exact");
  if (!a->has("quiet"))
    std::fprintf(stderr, "kestrel serve: prefix cache %s\n",
                 sc.prefix_cache ? ("on (grid " + std::to_string(sc.prefill_chunk) + " tokens, snapshots " +
                                    std::to_string(snapshot_mib) + " MiB" +
                                    (host_mib == 0 ? std::string() : ", host " + std::to_string(host_mib) + " MiB") +
                                    (sc.prefix.disk_dir.empty() ? std::string()
                                                                : ", disk " + sc.prefix.disk_dir + " " +
                                                                      std::to_string(disk_mib) + " MiB") +
                                    (redis.host.empty() ? std::string()
                                                        : ", redis " + a->str("prefix-cache-redis")) +
                                    ")").c_str()
                                 : "off");
  print_ready(ho.address, http.port(), ac.model_id, !ac.api_key.empty());
  int sig = 0;
  if (cl == nullptr) {
    sigwait(&sigs, &sig);
  } else {
    // A cell also watches its scheduler: a failed step (a lost rank) ends rank 0, and mpirun ends the rest.
    for (;;) {
      const timespec poll{0, 100'000'000};
      if ((sig = sigtimedwait(&sigs, nullptr, &poll)) > 0) {
        liveness->expect_exit();  // the followers stop after the drain; their connections close then
        break;
      }
      if (const std::string why = (*sched)->failure(); !why.empty()) {
        http.stop();  // the requests in flight have their error; let the connections deliver it
        fail(unavailable(why));
      }
    }
  }
  std::fprintf(stderr, "kestrel serve: %s received, draining (up to %llds)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT", drain);
  (*sched)->drain(std::chrono::seconds(drain));
  // A decode instance tells its prefills of the hand-offs it gives up, before its connections close.
  if (pd_service) pd_service->abandon();
  http.stop();
  if (cl != nullptr)
    if (const std::string why = (*sched)->failure(); !why.empty()) fail(unavailable(why));
  if (bootstrap_http) bootstrap_http->stop();
  pd_service.reset();
  std::fprintf(stderr, "kestrel serve: stopped\n");
  return 0;
}

}  // namespace kestrel::app
