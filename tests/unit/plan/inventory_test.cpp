// The planner's tensor inventory against an independent source: the safetensors headers of
// checkpoints written by the models library's generator (the same files our binder loads). Every
// tensor name, dtype and shape must match, so every byte and parameter count built on the inventory
// is the checkpoint's own.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "common/test_util.h"
#include "loader/model_config.h"
#include "loader/safetensors.h"
#include "plan/inventory.h"
#include "plan/model_costs.h"

namespace kestrel::plan {
namespace {

namespace fs = std::filesystem;
using kestrel::testing::TempDir;

struct Stored {
  DType dtype;
  std::vector<int64_t> shape;
  int64_t bytes;
};

std::map<std::string, Stored> read_headers(const std::string& dir) {
  std::map<std::string, Stored> out;
  for (const auto& f : fs::directory_iterator(dir)) {
    if (f.path().extension() != ".safetensors") continue;
    auto st = SafetensorsFile::open(f.path().string());
    EXPECT_TRUE(st.has_value()) << st.error().message();
    if (!st) continue;
    for (const auto& e : st->header().entries)
      out[e.name] = {e.dtype, e.shape, static_cast<int64_t>(e.end - e.begin)};
  }
  return out;
}

std::map<std::string, const TensorEntry*> expand(const Inventory& inv, std::vector<std::string>& names) {
  std::map<std::string, const TensorEntry*> out;
  for (const TensorEntry& e : inv.tensors) {
    const size_t at = e.name.find("{e}");
    for (int64_t i = 0; i < e.copies; ++i) {
      std::string n = e.name;
      if (at != std::string::npos) n.replace(at, 3, std::to_string(i));
      names.push_back(n);
      out[n] = &e;
    }
  }
  return out;
}

// Generates `preset` (with edits), then compares inventory ↔ headers tensor by tensor.
void check_preset(const std::string& preset, const std::function<void(GenSpec&)>& edit = nullptr) {
  SCOPED_TRACE(preset);
  TempDir tmp;
  const std::string dir = tmp.sub("ckpt");
  kestrel::testing::make_checkpoint(preset, dir, edit);
  auto cfg = load_model_config(dir);
  ASSERT_TRUE(cfg.has_value()) << cfg.error().message();
  auto inv = build_inventory(*cfg, {});
  ASSERT_TRUE(inv.has_value()) << inv.error().message();
  const auto stored = read_headers(dir);
  std::vector<std::string> names;
  const auto planned = expand(*inv, names);
  EXPECT_EQ(names.size(), planned.size()) << "duplicate names in the inventory";
  EXPECT_EQ(planned.size(), stored.size());
  int64_t stored_bytes = 0;
  for (const auto& [name, s] : stored) {
    stored_bytes += s.bytes;
    auto it = planned.find(name);
    if (it == planned.end()) {
      ADD_FAILURE() << "checkpoint tensor not in the inventory: " << name;
      continue;
    }
    EXPECT_EQ(it->second->dtype, s.dtype) << name;
    EXPECT_EQ(it->second->shape, s.shape) << name;
    EXPECT_EQ(it->second->bytes_per_copy(), s.bytes) << name;
  }
  for (const auto& [name, e] : planned) EXPECT_TRUE(stored.count(name)) << "inventory tensor not in checkpoint: " << name;
  const ModelCosts m = compute_costs(*cfg, *inv, {});
  EXPECT_EQ(m.total_bytes, stored_bytes);
  EXPECT_EQ(m.total_tensors, static_cast<int64_t>(stored.size()));
  // Generated K3 checkpoints carry the vision tower and projector in the released layout (small widths).
  EXPECT_EQ(inv->vision_counted, cfg->arch == Arch::kKimiK3) << inv->vision_note;
}

TEST(PlanInventory, MatchesK3Tiny) { check_preset("k3-tiny"); }
TEST(PlanInventory, MatchesK3TinyBf16Experts) { check_preset("k3-tiny-bf16"); }
TEST(PlanInventory, MatchesKimiLinearTiny) { check_preset("kimi-linear-tiny"); }
// k3-bench's head counts, q_lora and expert widths at a hidden size and vocabulary that keep the
// checkpoint small (~60 MB) in a unit test; the full preset only widens the same tensors.
TEST(PlanInventory, MatchesK3BenchShape) {
  check_preset("k3-bench", [](GenSpec& s) {
    s.hidden = 512, s.intermediate = 1024, s.vocab = 1024, s.layers = 4, s.full_attn_layers = {4};
    s.experts = 16, s.top_k = 4, s.latent = 256, s.moe_inter = 256, s.shards = 2;
  });
}

// The parameter count of a generated checkpoint from its headers: packed MXFP4 bytes hold two
// parameters each, scales none.
TEST(PlanInventory, ParamsFromHeaders) {
  TempDir tmp;
  kestrel::testing::make_checkpoint("k3-tiny", tmp.sub("c"));
  int64_t params = 0;
  for (const auto& [name, s] : read_headers(tmp.sub("c"))) {
    if (name.ends_with(".weight_scale")) continue;
    params += name.ends_with(".weight_packed") ? 2 * s.bytes : s.bytes / dtype_size(s.dtype);
  }
  auto cfg = load_model_config(tmp.sub("c"));
  ASSERT_TRUE(cfg.has_value());
  auto inv = build_inventory(*cfg, {});
  ASSERT_TRUE(inv.has_value());
  EXPECT_EQ(compute_costs(*cfg, *inv, {}).total_params, params);
}

TEST(PlanInventory, ExpertFormatsChangeOnlyExpertBytes) {
  TempDir tmp;
  kestrel::testing::make_checkpoint("k3-tiny", tmp.sub("c"));
  auto cfg = load_model_config(tmp.sub("c"));
  ASSERT_TRUE(cfg.has_value());
  const auto costs = [&](ExpertFormat f, int g = 32) {
    auto inv = build_inventory(*cfg, {f, g});
    EXPECT_TRUE(inv.has_value());
    return compute_costs(*cfg, *inv, {});
  };
  const ModelCosts mx = costs(ExpertFormat::kMxfp4), bf = costs(ExpertFormat::kBf16), w4 = costs(ExpertFormat::kW4a8),
                   w4g128 = costs(ExpertFormat::kW4a8, 64);
  EXPECT_EQ(mx.total_params, bf.total_params);
  EXPECT_EQ(mx.total_params, w4.total_params);
  const int64_t p = mx.expert_params;
  EXPECT_EQ(mx.expert_bytes * 32, p * 17);   // 4.25 bits: 4-bit codes + one 8-bit scale per 32
  EXPECT_EQ(bf.expert_bytes, p * 2);
  EXPECT_EQ(w4.expert_bytes, p / 2 + p / 32 * 2 + 3 * 16);  // int4 + bf16 scale per 32 + 3 weight_shape
  EXPECT_EQ(w4g128.expert_bytes, p / 2 + p / 64 * 2 + 3 * 16);
  EXPECT_EQ(mx.total_bytes - mx.by_component[static_cast<int>(Component::kRoutedExperts)].bytes,
            bf.total_bytes - bf.by_component[static_cast<int>(Component::kRoutedExperts)].bytes);
  auto bad = build_inventory(*cfg, {ExpertFormat::kW4a8, 48});
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message().find("group size 48"), std::string::npos) << bad.error().message();
}

}  // namespace
}  // namespace kestrel::plan
