// `kestrel plan` end to end through the binary: --json output parses and echoes the overrides;
// bad input is one stderr line and a non-zero exit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

namespace {

struct CliRun {
  int rc;
  std::string out;
};

CliRun run(const std::string& args, bool stderr_only = false) {
  const std::string cmd = std::string(KESTREL_BINARY) + " plan " + args + (stderr_only ? " 2>&1 >/dev/null" : " 2>/dev/null");
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {-1, ""};
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  return {::pclose(p), out};
}

const std::string kK3 = std::string(KESTREL_SOURCE_DIR) + "/docs/configs/kimi-k3";

TEST(PlanCli, JsonWithOverrides) {
  const CliRun r = run("--model " + kK3 + "/config.json --cluster b300 --prefill-nodes 1 --decode-nodes 2 --tp 8 "
                    "--decode-dcp 8 --context 131072 --kv-cache-dtype fp8 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("cluster").at("context"), 131072);
  EXPECT_EQ(j.at("roles").at("prefill").at("nodes"), 1);
  EXPECT_EQ(j.at("roles").at("decode").at("dcp"), 8);
  EXPECT_EQ(j.at("roles").at("prefill").at("dcp"), 1);
  EXPECT_EQ(j.at("model").at("cache").at("bytes_per_token"), 24 * 656);  // Kestrel's fp8 row: 512 e4m3 + 4 scales + 64 bf16
  EXPECT_TRUE(j.at("roles").at("decode").at("fits").get<bool>());
}

// --transfer-gbps: the measured hand-off throughput per link gives the transfer time (K3, 4P+4D B300).
TEST(PlanCli, TransferGbpsSetsTheHandoffTime) {
  const CliRun a = run("--model " + kK3 + " --cluster b300 --tp 8 --transfer-gbps 2 --json");
  const CliRun b = run("--model " + kK3 + " --cluster b300 --tp 8 --transfer-gbps 4 --json");
  ASSERT_EQ(a.rc, 0) << a.out;
  ASSERT_EQ(b.rc, 0) << b.out;
  const auto ja = nlohmann::json::parse(a.out).at("transfer"), jb = nlohmann::json::parse(b.out).at("transfer");
  EXPECT_EQ(ja.at("source"), "measured");
  EXPECT_DOUBLE_EQ(ja.at("link_bytes_per_s").get<double>(), 2e9);
  EXPECT_DOUBLE_EQ(ja.at("seconds_per_request").get<double>(),
                   ja.at("bytes_per_request").get<double>() / (ja.at("links").get<double>() * 2e9));
  EXPECT_DOUBLE_EQ(ja.at("seconds_per_request").get<double>(), 2 * jb.at("seconds_per_request").get<double>());
  EXPECT_NE(run("--model " + kK3 + " --transfer-gbps -1", true).rc, 0);
}

// --kv-cache-dtype sizes the cache with that dtype's row: bytes per token and the capacity follow.
TEST(PlanCli, KvCacheDtypeSizesTheCache) {
  std::map<std::string, nlohmann::json> by;
  for (const char* d : {"fp32", "bf16", "fp8"}) {
    const CliRun r = run("--model " + kK3 + " --cluster b300 --tp 8 --kv-cache-dtype " + d + " --json");
    ASSERT_EQ(r.rc, 0) << r.out;
    by[d] = nlohmann::json::parse(r.out);
    EXPECT_EQ(by[d].at("cluster").at("assumptions").at("kv_cache_dtype"), d);
  }
  // K3: 24 MLA layers of 512 latent + 64 rope elements.
  EXPECT_EQ(by["fp32"].at("model").at("cache").at("bytes_per_token"), 24 * 576 * 4);
  EXPECT_EQ(by["bf16"].at("model").at("cache").at("bytes_per_token"), 24 * 576 * 2);
  EXPECT_EQ(by["fp8"].at("model").at("cache").at("bytes_per_token"), 24 * (512 + 4 * 4 + 64 * 2));
  const auto tokens = [&](const char* d) { return by[d].at("roles").at("decode").at("capacity").at("tokens_per_device").get<double>(); };
  EXPECT_LT(tokens("fp32"), tokens("bf16"));
  EXPECT_LT(tokens("bf16"), tokens("fp8"));
}

TEST(PlanCli, ClusterFileAndTable) {
  const CliRun r = run("--model " + kK3 + " --cluster " + std::string(KESTREL_SOURCE_DIR) +
                    "/docs/configs/cluster-h200-4p4d.json");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("decode: 4 nodes = 32 GPUs; instance 16 GPUs (TP 16, EP 16, DCP 16"), std::string::npos) << r.out;
}

TEST(PlanCli, BadInputIsOneLine) {
  for (const std::string& args : std::vector<std::string>{"--cluster h200", "--model /nonexistent", "--model " + kK3 + " --cluster tpu9",
                                  "--model " + kK3 + " --tp 5", "--model " + kK3 + " --context -1",
                                  "--model " + kK3 + " --kv-cache-dtype int4", "--model " + kK3 + " --bogus 1"}) {
    const CliRun r = run(args, /*stderr_only=*/true);
    EXPECT_NE(r.rc, 0) << args;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << ": " << r.out;
    EXPECT_EQ(r.out.rfind("kestrel plan: ", 0), 0u) << r.out;
  }
}

}  // namespace
