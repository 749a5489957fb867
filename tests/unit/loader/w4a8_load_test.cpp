// W4A8 (compressed-tensors pack-quantized int4) checkpoints: `kestrel quantize`'s output loads and
// runs; config and tensor errors are one clear line naming the file and key/tensor.
#include <gtest/gtest.h>

#include <cmath>

#include "common/test_util.h"
#include "models/w4a8_quantizer.h"
#include "runtime/engine.h"

namespace kestrel {
namespace {

using testing::TempDir;

const char* kShape = "language_model.model.layers.1.self_attn.q_a_proj.weight_shape";

std::string load_error(const std::string& dir) {
  auto e = Engine::load(dir);
  return e ? std::string() : e.error().message();
}

void expect_one_line_naming(const std::string& msg, const std::vector<std::string>& parts) {
  EXPECT_FALSE(msg.empty());
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

class W4a8Load : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::make_checkpoint("k3-tiny", tmp_.sub("src"), [](GenSpec& s) { s.layers = 2, s.full_attn_layers = {2}; });
    QuantizeOptions o;
    o.in_dir = tmp_.sub("src"), o.out_dir = dir();
    auto r = quantize_checkpoint(o);
    ASSERT_TRUE(r) << r.error().message();
    ASSERT_GT(r->quantized, 0);
    ASSERT_GT(r->kept_mxfp4, 0);
  }
  std::string dir() const { return tmp_.sub("q"); }
  nlohmann::json& qcfg(nlohmann::json& c) { return c["text_config"]["quantization_config"]; }
  TempDir tmp_;
};

TEST_F(W4a8Load, QuantizedCheckpointRuns) {
  auto e = Engine::load(dir());
  ASSERT_TRUE(e) << e.error().message();
  EXPECT_EQ((*e)->config().text.int4_group_size, 32);
  EXPECT_TRUE((*e)->config().text.experts_mxfp4);
  SequenceState s = (*e)->new_sequence();
  const std::vector<int32_t> ids = {1, 2, 3, 4};
  auto l = (*e)->prefill(s, ids);
  ASSERT_TRUE(l) << l.error().message();
  for (float v : *l) ASSERT_TRUE(std::isfinite(v));
}

TEST_F(W4a8Load, W4A16AndOtherSchemesAreRejected) {
  struct Edit {
    const char* what;
    std::function<void(nlohmann::json&)> f;
    std::vector<std::string> expect;
  };
  const std::vector<Edit> edits = {
      {"no activations", [](nlohmann::json& g) { g["input_activations"] = nullptr; }, {"W4A16"}},
      {"group 48", [](nlohmann::json& g) { g["weights"]["group_size"] = 48; }, {"group_size"}},
      {"asymmetric", [](nlohmann::json& g) { g["weights"]["symmetric"] = false; }, {"symmetric"}},
      {"static acts", [](nlohmann::json& g) { g["input_activations"]["dynamic"] = false; }, {"dynamic"}},
      {"bits as string", [](nlohmann::json& g) { g["weights"]["num_bits"] = "4"; }, {"num_bits"}},
      {"unknown format", [](nlohmann::json& g) { g["format"] = "nvfp4-pack-quantized"; }, {"nvfp4"}},
  };
  const auto orig = testing::read_json(dir() + "/config.json");
  for (const auto& e : edits) {
    SCOPED_TRACE(e.what);
    auto c = orig;
    e.f(qcfg(c)["config_groups"]["group_1"]);
    testing::write_json(dir() + "/config.json", c);
    auto msg = load_error(dir());
    expect_one_line_naming(msg, {"config.json", "group_1"});
    for (const auto& p : e.expect) EXPECT_NE(msg.find(p), std::string::npos) << msg;
  }
}

TEST_F(W4a8Load, Int4TensorsNeedTheConfigAndTheRightShapes) {
  auto c = testing::read_json(dir() + "/config.json");
  const auto orig = c;
  qcfg(c)["format"] = "mxfp4-pack-quantized";  // declares MXFP4 only
  testing::write_json(dir() + "/config.json", c);
  expect_one_line_naming(load_error(dir()), {"weight_packed", "declares no pack-quantized group"});

  c = orig;  // config group 64, file written with 32: the scale shape disagrees
  qcfg(c)["config_groups"]["group_1"]["weights"]["group_size"] = 64;
  testing::write_json(dir() + "/config.json", c);
  expect_one_line_naming(load_error(dir()), {"weight_scale", "expected"});

  testing::write_json(dir() + "/config.json", orig);
  const std::string shard = testing::shard_of(dir(), kShape);
  testing::edit_header(shard, [](nlohmann::json& j) { j[kShape]["dtype"] = "I32", j[kShape]["shape"] = {4}; });
  expect_one_line_naming(load_error(dir()), {shard, kShape, "expected"});
}

TEST(W4a8Quantizer, WhichTensorsAreQuantized) {
  QuantizeOptions o;
  o.group_size = 64;
  EXPECT_TRUE(is_w4a8_target("m.layers.1.self_attn.q_proj.weight", {256, 256}, o));
  EXPECT_TRUE(is_w4a8_target("m.layers.1.block_sparse_moe.experts.3.w2.weight", {128, 64}, o));
  EXPECT_FALSE(is_w4a8_target("m.layers.1.block_sparse_moe.experts.3.w2.weight", {128, 96}, o));  // 96 % 64
  EXPECT_FALSE(is_w4a8_target("m.layers.1.block_sparse_moe.gate.weight", {16, 256}, o));         // router
  EXPECT_FALSE(is_w4a8_target("m.embed_tokens.weight", {512, 256}, o));
  EXPECT_FALSE(is_w4a8_target("m.layers.0.mlp_res_proj.weight", {1, 256}, o));
  EXPECT_FALSE(is_w4a8_target("m.layers.0.input_layernorm.weight", {256}, o));
  EXPECT_FALSE(is_w4a8_target("language_model.lm_head.weight", {512, 256}, o));
  o.quantize_lm_head = true;
  EXPECT_TRUE(is_w4a8_target("language_model.lm_head.weight", {512, 256}, o));
}

}  // namespace
}  // namespace kestrel
