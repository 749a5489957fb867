// Loader and binder error paths: every corrupt input gives one clear line naming the file and the
// tensor (or key), and never crashes. Runs under ASan+UBSan in CI (debug preset).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "common/test_util.h"
#include "loader/checkpoint.h"
#include "loader/model_config.h"
#include "loader/safetensors.h"
#include "loader/vision_config.h"
#include "runtime/engine.h"

namespace kestrel {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

const char* kEmbed = "language_model.model.embed_tokens.weight";
const char* kQ = "language_model.model.layers.1.self_attn.q_proj.weight";
const char* kPacked = "language_model.model.layers.1.block_sparse_moe.experts.3.w1.weight_packed";
const char* kScale = "language_model.model.layers.1.block_sparse_moe.experts.3.w1.weight_scale";

// Loads a model dir and returns the error message ("" on success).
std::string load_error(const std::string& dir) {
  auto e = Engine::load(dir);
  return e ? std::string() : e.error().message();
}

void expect_one_line_naming(const std::string& msg, const std::vector<std::string>& parts) {
  EXPECT_FALSE(msg.empty());
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::make_checkpoint("k3-tiny", dir()); }
  std::string dir() const { return tmp_.sub("ckpt"); }
  TempDir tmp_;
};

TEST_F(LoaderTest, GoodCheckpointLoads) { EXPECT_EQ(load_error(dir()), ""); }

TEST_F(LoaderTest, TruncatedShard) {
  const std::string shard = testing::shard_of(dir(), kQ);
  fs::resize_file(shard, fs::file_size(shard) / 2);
  expect_one_line_naming(load_error(dir()), {shard, "past the end of the data section"});
}

TEST_F(LoaderTest, HeaderLengthPastEof) {
  const std::string shard = testing::shard_of(dir(), kQ);
  auto b = testing::read_bytes(shard);
  b[5] = 0x7f;  // header length ~ 2^47
  testing::write_bytes(shard, b);
  expect_one_line_naming(load_error(dir()), {shard, "header length"});
  b.resize(4);
  testing::write_bytes(shard, b);
  expect_one_line_naming(load_error(dir()), {shard, "too short"});
}

TEST_F(LoaderTest, HeaderNotJson) {
  const std::string shard = testing::shard_of(dir(), kQ);
  auto b = testing::read_bytes(shard);
  b[8] = '#';
  testing::write_bytes(shard, b);
  expect_one_line_naming(load_error(dir()), {shard, "not valid JSON"});
}

TEST_F(LoaderTest, OffsetsOutOfRange) {
  const std::string shard = testing::shard_of(dir(), kQ);
  testing::edit_header(shard, [](nlohmann::json& j) {
    auto& o = j[kQ]["data_offsets"];
    const uint64_t len = o[1].get<uint64_t>() - o[0].get<uint64_t>();
    o[0] = uint64_t{1} << 40;
    o[1] = (uint64_t{1} << 40) + len;
  });
  expect_one_line_naming(load_error(dir()), {shard, kQ, "past the end"});
}

TEST_F(LoaderTest, OverlappingTensors) {
  const std::string shard = testing::shard_of(dir(), kQ);
  std::string other;
  testing::edit_header(shard, [&](nlohmann::json& j) {
    // Point q_proj at the bytes of another tensor of the same size in the same shard.
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key() != kQ && it.key() != "__metadata__" && it.value()["shape"] == j[kQ]["shape"] &&
          it.value()["dtype"] == j[kQ]["dtype"]) {
        other = it.key();
        auto o = it.value()["data_offsets"];
        j[kQ]["data_offsets"] = o;
        break;
      }
  });
  ASSERT_FALSE(other.empty());
  expect_one_line_naming(load_error(dir()), {shard, "overlaps"});
}

TEST_F(LoaderTest, ShapeTimesDtypeMismatch) {
  const std::string shard = testing::shard_of(dir(), kQ);
  testing::edit_header(shard, [](nlohmann::json& j) { j[kQ]["dtype"] = "F32"; });
  expect_one_line_naming(load_error(dir()), {shard, kQ, "byte span"});
}

TEST_F(LoaderTest, WrongDtypeForBinding) {
  const std::string shard = testing::shard_of(dir(), kQ);
  testing::edit_header(shard, [](nlohmann::json& j) { j[kQ]["dtype"] = "I16"; });  // unknown dtype name
  expect_one_line_naming(load_error(dir()), {shard, kQ, "unknown dtype"});
  testing::make_checkpoint("k3-tiny", dir());
  testing::edit_header(shard, [](nlohmann::json& j) {
    j[kQ]["dtype"] = "U8";  // valid dtype, wrong for a linear weight; keep byte span consistent
    j[kQ]["shape"] = {j[kQ]["shape"][0], j[kQ]["shape"][1].get<int64_t>() * 2};
  });
  expect_one_line_naming(load_error(dir()), {shard, kQ, "dtype U8"});
}

TEST_F(LoaderTest, WrongShapeForBinding) {
  const std::string shard = testing::shard_of(dir(), kQ);
  testing::edit_header(shard, [](nlohmann::json& j) {
    j[kQ]["shape"] = {j[kQ]["shape"][0].get<int64_t>() / 2, j[kQ]["shape"][1].get<int64_t>() * 2};  // same bytes
  });
  expect_one_line_naming(load_error(dir()), {shard, kQ, "expected [256, 256]"});
}

TEST_F(LoaderTest, MissingTensor) {
  const std::string shard = testing::shard_of(dir(), kQ);
  testing::edit_header(shard, [](nlohmann::json& j) { j.erase(kQ); });
  // The index still lists it: the loader names the shard and the tensor.
  expect_one_line_naming(load_error(dir()), {kQ, "missing"});
  // Also remove it from the index: the binder reports it missing.
  auto idx = testing::read_json(dir() + "/model.safetensors.index.json");
  idx["weight_map"].erase(kQ);
  testing::write_json(dir() + "/model.safetensors.index.json", idx);
  expect_one_line_naming(load_error(dir()), {kQ, "missing tensor"});
}

TEST_F(LoaderTest, UnexpectedTensor) {
  const std::string shard = testing::shard_of(dir(), kEmbed);
  const std::string extra = "language_model.model.layers.0.self_attn.surprise.weight";
  testing::edit_header(shard, [&](nlohmann::json& j) {
    j[extra] = j[kEmbed];  // aliasing bytes of embed → also tests overlap detection first
  });
  expect_one_line_naming(load_error(dir()), {shard, "overlaps"});
  testing::make_checkpoint("k3-tiny", dir());
  testing::edit_header(shard, [&](nlohmann::json& j) {
    j[extra] = {{"dtype", "BF16"}, {"shape", {0}}, {"data_offsets", {0, 0}}};  // empty tensor, no overlap
  });
  auto idx = testing::read_json(dir() + "/model.safetensors.index.json");
  idx["weight_map"][extra] = fs::path(shard).filename().string();
  testing::write_json(dir() + "/model.safetensors.index.json", idx);
  expect_one_line_naming(load_error(dir()), {shard, extra, "unexpected tensor"});
}

TEST_F(LoaderTest, TensorNotInIndex) {
  auto idx = testing::read_json(dir() + "/model.safetensors.index.json");
  idx["weight_map"].erase(kQ);
  testing::write_json(dir() + "/model.safetensors.index.json", idx);
  expect_one_line_naming(load_error(dir()), {kQ, "not listed in the index"});
}

TEST_F(LoaderTest, IndexPathEscape) {
  auto idx = testing::read_json(dir() + "/model.safetensors.index.json");
  idx["weight_map"][kQ] = "../../etc/passwd";
  testing::write_json(dir() + "/model.safetensors.index.json", idx);
  expect_one_line_naming(load_error(dir()), {kQ, "outside the checkpoint"});
}

TEST_F(LoaderTest, UnknownModelType) {
  auto cfg = testing::read_json(dir() + "/config.json");
  cfg["model_type"] = "llama";
  testing::write_json(dir() + "/config.json", cfg);
  expect_one_line_naming(load_error(dir()), {"config.json", "unknown model_type 'llama'"});
}

TEST_F(LoaderTest, MissingConfigKey) {
  for (const char* key : {"kv_lora_rank", "hidden_size", "num_experts", "linear_attn_config"}) {
    testing::make_checkpoint("k3-tiny", dir());
    auto cfg = testing::read_json(dir() + "/config.json");
    cfg["text_config"].erase(key);
    testing::write_json(dir() + "/config.json", cfg);
    expect_one_line_naming(load_error(dir()), {"config.json", std::string("'") + key + "'", "missing required key"});
  }
}

TEST_F(LoaderTest, OutOfRangeConfigValues) {
  // Found by fuzz_model_config: moe_layer_freq 0 used to divide by zero.
  for (auto [key, value] : std::initializer_list<std::pair<const char*, int>>{
           {"moe_layer_freq", 0}, {"hidden_size", -4}, {"num_hidden_layers", 100000}, {"kv_lora_rank", 0}}) {
    testing::make_checkpoint("k3-tiny", dir());
    auto cfg = testing::read_json(dir() + "/config.json");
    cfg["text_config"][key] = value;
    testing::write_json(dir() + "/config.json", cfg);
    expect_one_line_naming(load_error(dir()), {"config.json", std::string("'") + key + "'"});
  }
}

TEST_F(LoaderTest, WrongTypesInConfigAreErrorsNotExceptions) {
  // Found by fuzz_model_config: a non-string quantization format threw out of the parser.
  auto cfg = testing::read_json(dir() + "/config.json");
  cfg["text_config"]["quantization_config"]["format"] = 5;
  testing::write_json(dir() + "/config.json", cfg);
  expect_one_line_naming(load_error(dir()), {"config.json", "format"});
  testing::make_checkpoint("k3-tiny", dir());
  cfg = testing::read_json(dir() + "/config.json");
  cfg["text_config"]["hidden_size"] = int64_t{1} << 40;  // would wrap to a small int if narrowed
  testing::write_json(dir() + "/config.json", cfg);
  expect_one_line_naming(load_error(dir()), {"config.json", "'hidden_size'", "out of range"});
}

// DSA keys (ours): sparse layers must be full-attention layers; index_* required and range-checked;
// a sparse layer without its indexer tensors names the missing tensor.
TEST_F(LoaderTest, DsaConfigErrors) {
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases = {
      {[](nlohmann::json& t) { t["sparse_attn_layers"] = {1}; }, {"'sparse_attn_layers'", "layer 1 is not a full-attention layer"}},
      {[](nlohmann::json& t) { t["sparse_attn_layers"] = {4, 4}; }, {"'sparse_attn_layers'", "listed twice"}},
      {[](nlohmann::json& t) { t["sparse_attn_layers"] = {10}; }, {"'sparse_attn_layers'", "1..9"}},
      {[](nlohmann::json& t) { t.erase("index_topk"); }, {"'index_topk'", "missing required key"}},
      {[](nlohmann::json& t) { t["index_topk"] = 0; }, {"'index_topk'", "outside"}},
      {[](nlohmann::json& t) { t["index_head_dim"] = 64; }, {"'index_head_dim'", "only 128"}},
      {[](nlohmann::json& t) { t["index_n_heads"] = "4"; }, {"'index_n_heads'", "must be an integer"}},
      {[](nlohmann::json& t) { t["index_rope_head_dim"] = 63; }, {"'index_rope_head_dim'"}},
  };
  for (const Case& c : cases) {
    testing::make_checkpoint("k3-tiny-dsa", dir());
    auto cfg = testing::read_json(dir() + "/config.json");
    c.edit(cfg["text_config"]);
    testing::write_json(dir() + "/config.json", cfg);
    auto want = c.want;
    want.insert(want.begin(), "config.json");
    expect_one_line_naming(load_error(dir()), want);
  }
  // Declared sparse but the checkpoint has no indexer for layer 9 → the missing tensor is named.
  testing::make_checkpoint("k3-tiny-dsa", dir());
  auto cfg = testing::read_json(dir() + "/config.json");
  cfg["text_config"]["sparse_attn_layers"] = {4, 8, 9};
  testing::write_json(dir() + "/config.json", cfg);
  expect_one_line_naming(load_error(dir()), {"layers.8.self_attn.indexer.wq_b"});
}

TEST_F(LoaderTest, WrongMxfp4ScaleShape) {
  const std::string shard = testing::shard_of(dir(), kScale);
  testing::edit_header(shard, [](nlohmann::json& j) {
    auto s = j[kScale]["shape"];  // [out, in/32] → [out*2, in/64] keeps the byte span
    j[kScale]["shape"] = {s[0].get<int64_t>() * 2, s[1].get<int64_t>() / 2};
  });
  expect_one_line_naming(load_error(dir()), {shard, kScale, "expected"});
  (void)kPacked;
}

TEST_F(LoaderTest, CliReportsOneLineAndNonZeroExit) {
  const std::string shard = testing::shard_of(dir(), kQ);
  testing::edit_header(shard, [](nlohmann::json& j) { j[kQ]["dtype"] = "F32"; });
  const std::string cmd = std::string(KESTREL_BINARY) + " generate --quiet --model " + dir() +
                          " --prompt-ids 1,2 --max-tokens 1 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int rc = ::pclose(p);
  EXPECT_NE(rc, 0);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find(kQ), std::string::npos) << out;
  EXPECT_NE(out.find(shard), std::string::npos) << out;
}

// ---- The vision tower and projector of the released K3 layout (docs/model-math.md §1.3) ----------------

const char* kVisWqkv = "vision_tower.encoder.blocks.1.wqkv.weight";
const char* kVisPost = "mm_projector.post_norm.weight";

TEST(VisionLayout, PublishedConfigGivesTheReleasedTensorTable) {
  // docs/configs/kimi-k3/config.json is the released config; the shapes below are the released checkpoint's
  // tensor table (27 blocks; all bf16, no biases), typed here from it, not computed.
  std::ifstream in(std::string(KESTREL_DOCS_CONFIGS) + "/kimi-k3/config.json");
  ASSERT_TRUE(in);
  const auto cfg = nlohmann::json::parse(in);
  auto v = parse_vision_config(cfg["vision_config"].dump(), "kimi-k3/config.json");
  ASSERT_TRUE(v.has_value()) << v.error().message();
  const auto t = vision_tensors(*v);
  EXPECT_EQ(t.size(), 27u * 6 + 6);
  std::map<std::string, std::vector<int64_t>> shape;
  int64_t params = 0;
  for (const auto& x : t) {
    EXPECT_EQ(x.dtype, DType::kBF16) << x.name;
    EXPECT_TRUE(shape.emplace(x.name, x.shape).second) << "duplicate " << x.name;
    int64_t n = 1;
    for (int64_t d : x.shape) n *= d;
    params += n;
  }
  const std::map<std::string, std::vector<int64_t>> released = {
      {"vision_tower.patch_embed.proj.weight", {1024, 3, 14, 14}},
      {"vision_tower.patch_embed.pos_emb.weight", {64, 64, 1024}},
      {"vision_tower.encoder.blocks.0.norm0.weight", {1024}},
      {"vision_tower.encoder.blocks.26.norm1.weight", {1024}},
      {"vision_tower.encoder.blocks.13.wqkv.weight", {4608, 1024}},
      {"vision_tower.encoder.blocks.13.wo.weight", {1024, 1536}},
      {"vision_tower.encoder.blocks.26.mlp.fc0.weight", {4096, 1024}},
      {"vision_tower.encoder.blocks.26.mlp.fc1.weight", {1024, 4096}},
      {"vision_tower.encoder.final_layernorm.weight", {1024}},
      {"mm_projector.proj.0.weight", {4096, 4096}},
      {"mm_projector.proj.2.weight", {7168, 4096}},
      {"mm_projector.post_norm.weight", {7168}}};
  for (const auto& [name, s] : released) {
    ASSERT_TRUE(shape.count(name)) << name;
    EXPECT_EQ(shape[name], s) << name;
  }
  EXPECT_FALSE(shape.count("vision_tower.encoder.blocks.27.wo.weight"));
  EXPECT_EQ(params, 447358976);  // ≈ 0.447 B, the vision share of the published parameter count
}

TEST(VisionLayout, ConfigErrorsNameTheKey) {
  auto bad = [](const std::string& text, const std::string& want) {
    auto v = parse_vision_config(text, "config.json");
    ASSERT_FALSE(v.has_value()) << text;
    expect_one_line_naming(v.error().message(), {"config.json vision_config", want});
  };
  const nlohmann::json good = {{"vt_num_hidden_layers", 2}, {"vt_hidden_size", 64}, {"vt_intermediate_size", 128},
                               {"vt_num_attention_heads", 2}, {"qkv_hidden_size", 64}, {"patch_size", 14},
                               {"init_pos_emb_height", 8}, {"init_pos_emb_width", 8}, {"merge_kernel_size", {2, 2}},
                               {"text_hidden_size", 256}};
  ASSERT_TRUE(parse_vision_config(good.dump(), "config.json").has_value());
  auto with = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json j = good;
    if (value.is_null()) j.erase(key);
    else j[key] = value;
    return j.dump();
  };
  bad("[1, 2]", "must be an object");
  bad(with("vt_hidden_size", nullptr), "'vt_hidden_size': missing required key");
  bad(with("qkv_hidden_size", "64"), "'qkv_hidden_size': must be an integer");
  bad(with("vt_num_hidden_layers", 0), "'vt_num_hidden_layers': 0 is outside");
  bad(with("merge_kernel_size", {2}), "'merge_kernel_size'");
  bad(with("qkv_hidden_size", 63), "not a multiple of vt_num_attention_heads");
}

TEST_F(LoaderTest, ReleasedK3LayoutWithVisionTowerLoadsAndGenerates) {
  // Every generated K3 checkpoint carries the tower + projector, as the release does (here 2 blocks).
  auto ck = Checkpoint::open(dir());
  ASSERT_TRUE(ck.has_value()) << ck.error().message();
  int vision = 0;
  for (const auto& n : ck->names()) vision += is_vision_tensor_name(n);
  EXPECT_EQ(vision, 2 * 6 + 6);
  auto e = Engine::load(dir());
  ASSERT_TRUE(e.has_value()) << e.error().message();
  ASSERT_EQ((*e)->load_notes().size(), 1u);
  EXPECT_NE((*e)->load_notes()[0].find("18 tensors"), std::string::npos) << (*e)->load_notes()[0];
  auto seq = (*e)->new_sequence();
  const std::vector<int32_t> ids = {1, 2, 3, 4};
  auto logits = (*e)->prefill(seq, ids);
  ASSERT_TRUE(logits.has_value()) << logits.error().message();
  auto next = (*e)->decode(seq, 5);
  ASSERT_TRUE(next.has_value()) << next.error().message();
  for (float x : *next) ASSERT_TRUE(std::isfinite(x));
}

TEST_F(LoaderTest, TextOnlyK3CheckpointLoadsWithoutNote) {
  // A checkpoint stripped of the tower is still a valid text model (no note, no error).
  auto idx = testing::read_json(dir() + "/model.safetensors.index.json");
  std::map<std::string, std::vector<std::string>> by_shard;
  for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it)
    if (is_vision_tensor_name(it.key())) by_shard[it.value().get<std::string>()].push_back(it.key());
  ASSERT_FALSE(by_shard.empty());
  for (const auto& [shard, shard_names] : by_shard) {
    const std::vector<std::string>& names = shard_names;  // clang 14 cannot capture a structured binding
    testing::edit_header(dir() + "/" + shard, [&](nlohmann::json& j) {
      for (const auto& n : names) j.erase(n);
    });
    for (const auto& n : names) idx["weight_map"].erase(n);
  }
  testing::write_json(dir() + "/model.safetensors.index.json", idx);
  auto e = Engine::load(dir());
  ASSERT_TRUE(e.has_value()) << e.error().message();
  EXPECT_TRUE((*e)->load_notes().empty());
}

TEST_F(LoaderTest, VisionTensorWithWrongShapeIsOneLine) {
  const std::string shard = testing::shard_of(dir(), kVisWqkv);
  testing::edit_header(shard, [](nlohmann::json& j) {
    j[kVisWqkv]["shape"] = {j[kVisWqkv]["shape"][1], j[kVisWqkv]["shape"][0]};  // transposed: same bytes
  });
  expect_one_line_naming(load_error(dir()), {shard, kVisWqkv, "has shape [64, 192], expected [192, 64]"});
}

TEST_F(LoaderTest, VisionTensorWithWrongDtypeIsOneLine) {
  const std::string shard = testing::shard_of(dir(), kVisPost);
  testing::edit_header(shard, [](nlohmann::json& j) {
    j[kVisPost]["dtype"] = "F16";  // same element size
  });
  expect_one_line_naming(load_error(dir()), {shard, kVisPost, "dtype F16", "expected BF16"});
}

TEST_F(LoaderTest, UnknownVisionTensorIsOneLine) {
  const std::string shard = testing::shard_of(dir(), kVisWqkv);
  const std::string extra = "vision_tower.encoder.blocks.1.wqkv.bias";
  testing::edit_header(shard, [&](nlohmann::json& j) {
    j[extra] = {{"dtype", "BF16"}, {"shape", {0}}, {"data_offsets", {0, 0}}};
  });
  auto idx = testing::read_json(dir() + "/model.safetensors.index.json");
  idx["weight_map"][extra] = fs::path(shard).filename().string();
  testing::write_json(dir() + "/model.safetensors.index.json", idx);
  expect_one_line_naming(load_error(dir()), {shard, extra, "unknown vision tensor"});
  // A block past vision_config's count is unknown too.
  testing::make_checkpoint("k3-tiny", dir());
  const std::string past = "vision_tower.encoder.blocks.2.wo.weight";
  testing::edit_header(shard, [&](nlohmann::json& j) {
    j[past] = {{"dtype", "BF16"}, {"shape", {0}}, {"data_offsets", {0, 0}}};
  });
  idx = testing::read_json(dir() + "/model.safetensors.index.json");
  idx["weight_map"][past] = fs::path(shard).filename().string();
  testing::write_json(dir() + "/model.safetensors.index.json", idx);
  expect_one_line_naming(load_error(dir()), {shard, past, "unknown vision tensor", "2 blocks"});
}

TEST_F(LoaderTest, PartialVisionTowerIsOneLine) {
  const std::string shard = testing::shard_of(dir(), kVisWqkv);
  testing::edit_header(shard, [](nlohmann::json& j) { j.erase(kVisWqkv); });
  auto idx = testing::read_json(dir() + "/model.safetensors.index.json");
  idx["weight_map"].erase(kVisWqkv);
  testing::write_json(dir() + "/model.safetensors.index.json", idx);
  expect_one_line_naming(load_error(dir()), {kVisWqkv, "missing tensor", "17 of the vision tower's 18"});
}

TEST_F(LoaderTest, VisionTensorsNeedAMatchingVisionConfig) {
  auto cfg = testing::read_json(dir() + "/config.json");
  cfg["vision_config"]["text_hidden_size"] = 255;
  testing::write_json(dir() + "/config.json", cfg);
  expect_one_line_naming(load_error(dir()), {"vision_config", "text_hidden_size", "255", "256"});
  cfg.erase("vision_config");
  testing::write_json(dir() + "/config.json", cfg);
  expect_one_line_naming(load_error(dir()), {"has no vision_config", "mm_projector.post_norm.weight"});
}

TEST(Checkpoint, MisalignedTensorsAreCopiedAligned) {
  // safetensors offsets need not be aligned: a 3-byte U8 tensor first puts the F32 one at offset 3.
  TempDir tmp;
  std::vector<uint8_t> f32(8);
  const float vals[2] = {1.5f, -2.25f};
  std::memcpy(f32.data(), vals, 8);
  std::vector<TensorToWrite> ts = {{"a", DType::kU8, {3}, {1, 2, 3}}, {"b", DType::kF32, {2}, f32}};
  ASSERT_TRUE(write_safetensors(tmp.sub("model.safetensors"), ts).is_ok());
  auto ck = Checkpoint::open(tmp.path());
  ASSERT_TRUE(ck) << ck.error().message();
  auto b = ck->get("b", {DType::kF32}, {2});
  ASSERT_TRUE(b);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data) % 4, 0u);
  EXPECT_EQ(to_f32(*b), std::vector<float>(vals, vals + 2));
}

TEST(SafetensorsParse, RejectsGarbageWithoutCrashing) {
  std::vector<uint8_t> b = {16, 0, 0, 0, 0, 0, 0, 0};
  const std::string h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_FALSE(parse_safetensors(b, "x"));  // header length past EOF
  std::vector<uint8_t> ok(8);
  for (int i = 0; i < 8; ++i) ok[static_cast<size_t>(i)] = static_cast<uint8_t>(h.size() >> (8 * i));
  ok.insert(ok.end(), h.begin(), h.end());
  ok.resize(ok.size() + 8);
  auto r = parse_safetensors(ok, "x");
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r->entries.size(), 1u);
  ok.resize(ok.size() - 1);  // one byte short
  EXPECT_FALSE(parse_safetensors(ok, "x"));
}

}  // namespace
}  // namespace kestrel
