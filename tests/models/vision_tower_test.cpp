// The K3 vision tower + projector (layers/vision_tower, layers/vision_projector) against an independent
// implementation: goldens written by tools/gen_vision_tower_goldens.py from sglang 0.5.23's kimi_k3_vl.py
// (KimiK3VisionTower, KimiK3MultiModalProjector) run in PyTorch fp32 on the same generated checkpoint (the
// make-model flags are in each golden's metadata) and the same pixels (an integer hash, re-computed here):
//   tower_tiny.safetensors         k3-tiny with a 3-head, 96-wide q/k/v tower (q/k/v width != tower width as in
//                                  K3); three images in one batch: 8x8 (the position grid's own size) and 2x4, 6x2
//                                  (bilinear interpolation).
//   tower_real_widths.safetensors  K3's tower widths (1024, q/k/v 12 x 128, MLP 4096, 64x64 position grid) with 2
//                                  of the 27 blocks; images 4x4 and 2x6 interpolated from 64x64.
//   tower_real_27_blocks.safetensors  the same widths with all 27 blocks (a 0.8 GB checkpoint generated in a temp
//                                  dir); one 4x4 image; tower output and projector only (the embedding stage is
//                                  the RealWidths one).
//   tower_projector_7168.safetensors  RealWidths with K3's text width 7168 (make-model --hidden 7168): the projector
//                                  output at the released width for one 2x4 image (projector output only).
// Each golden also holds `projected_transcription`: the projector output of tools/vision_tower_torch_ref.py, a second,
// minimal plain-torch transcription of the tower written from docs/vision.md (no sglang code), which the generator
// required to agree with sglang at every stage within the bound below (per-stage numbers in the metadata).
//
// Tolerances: both sides run fp32 on the same bf16 weights; differences come from summation order (OpenBLAS's
// blocked GEMMs vs PyTorch's, SDPA's flash kernel vs one softmax pass), libm/libmvec vs SLEEF cos/sin/exp/tanh/erf,
// and the norm's mean of squares (double here). Per stage the bound is max |Δ| ≤ 1e-5 · max |reference| and
// cosine ≥ 1 − 1e-10. Measured (max |Δ| / max |ref|), tiny: embed 9.5e-7 / 2.06, tower 1.8e-6 / 3.26, projector
// 2.6e-6 / 3.75; real widths: 1.2e-6 / 1.96, 2.9e-6 / 4.14, 3.5e-6 / 3.18; i.e. ≤ 1.1e-6 relative. Checked to fail: encoder norm eps 1e-5 instead of 2^-23 (tower 8.3e-5 / 3.26), RoPE row/column
// swapped (0.30), bilinear source positions off by 0.1 % (embed 1.2e-2).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "layers/binder.h"
#include "layers/vision_projector.h"
#include "layers/vision_tower.h"
#include "loader/checkpoint.h"
#include "loader/model_config.h"
#include "loader/safetensors.h"
#include "loader/vision_config.h"
#include "vision_test_inputs.h"

namespace kestrel {
namespace {

struct Golden {
  std::vector<std::array<int64_t, 3>> grids;
  std::vector<float> embed, merged, projected, projected_transcription;
  std::vector<std::string> make_model_flags;
};

Golden read_golden(const std::string& name) {
  auto f = SafetensorsFile::open(std::string(KESTREL_TEST_DATA) + "/vision/" + name);
  if (!f) throw std::runtime_error(f.error().message());
  Golden g;
  g.make_model_flags = nlohmann::json::parse(f->header().metadata.at("make_model_flags")).get<std::vector<std::string>>();
  for (const auto& e : f->header().entries) {
    const TensorView t = f->view(e);
    if (e.name == "grids") {
      const int32_t* p = static_cast<const int32_t*>(t.data);
      for (int64_t i = 0; i < e.shape[0]; ++i) g.grids.push_back({p[3 * i], p[3 * i + 1], p[3 * i + 2]});
      continue;
    }
    const float* p = static_cast<const float*>(t.data);
    std::vector<float> v(p, p + t.numel());
    if (e.name == "embed") g.embed = v;
    else if (e.name == "merged") g.merged = v;
    else if (e.name == "projected") g.projected = v;
    else if (e.name == "projected_transcription") g.projected_transcription = v;
  }
  return g;
}

void expect_close(const char* stage, const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size()) << stage;
  double max_ref = 0, max_diff = 0, dot = 0, ng = 0, nw = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    dot += static_cast<double>(got[i]) * want[i];
    ng += static_cast<double>(got[i]) * got[i];
    nw += static_cast<double>(want[i]) * want[i];
  }
  const double cosine = dot / std::sqrt(ng * nw);
  EXPECT_LE(max_diff, 1e-5 * max_ref) << stage << ": max |diff| " << max_diff << ", max |ref| " << max_ref;
  EXPECT_GE(cosine, 1.0 - 1e-10) << stage << ": cosine " << cosine;
  std::printf("[ %s ] max |diff| %.3g (max |ref| %.3g), 1 - cosine %.3g\n", stage, max_diff, max_ref, 1.0 - cosine);
}

class VisionTowerTest : public ::testing::TestWithParam<std::string> {
 protected:
  // One generated checkpoint per golden, shared by the tests of that golden.
  static std::map<std::string, std::unique_ptr<testing::TempDir>>& dirs() {
    static std::map<std::string, std::unique_ptr<testing::TempDir>> d;
    return d;
  }
  static void TearDownTestSuite() { dirs().clear(); }

  void SetUp() override {
    golden_ = read_golden(GetParam());
    auto& dir = dirs()[GetParam()];
    if (!dir) {
      dir = std::make_unique<testing::TempDir>();
      testing::make_checkpoint("k3-tiny", dir->path(), [&](GenSpec& s) { testing::apply_make_model_flags(golden_.make_model_flags, s); });
    }
    auto ck = Checkpoint::open(dir->path());
    ASSERT_TRUE(ck) << ck.error().message();
    ck_ = std::make_unique<Checkpoint>(std::move(*ck));
    auto cfg = load_model_config(dir->path());
    ASSERT_TRUE(cfg) << cfg.error().message();
    auto v = parse_vision_config(cfg->vision_config_json, "config.json");
    ASSERT_TRUE(v) << v.error().message();
    vcfg_ = *v;
    Binder b(*ck_);
    ASSERT_TRUE(tower_.bind(b, vcfg_).is_ok()) << b.status().message();
    ASSERT_TRUE(projector_.bind(b, vcfg_).is_ok()) << b.status().message();
    const int64_t per_patch = 3 * int64_t{vcfg_.patch_size} * vcfg_.patch_size;
    for (size_t i = 0; i < golden_.grids.size(); ++i) {
      const auto& g = golden_.grids[i];
      pixels_.push_back(testing::hashed_pixels(i, g[0] * g[1] * g[2] * per_patch));
    }
    for (size_t i = 0; i < golden_.grids.size(); ++i) images_.push_back({pixels_[i].data(), golden_.grids[i]});
  }

  // Kestrel's embed (when the golden has it), tower and projector against sglang's, the projector also against the
  // torch transcription's.
  void check_every_stage();

  std::unique_ptr<Checkpoint> ck_;
  VisionConfig vcfg_;
  VisionTower tower_;
  VisionProjector projector_;
  Golden golden_;
  std::vector<std::vector<float>> pixels_;
  std::vector<VisionImage> images_;
};
INSTANTIATE_TEST_SUITE_P(Goldens, VisionTowerTest,
                         ::testing::Values("tower_tiny.safetensors", "tower_real_widths.safetensors"),
                         [](const auto& info) { return info.param == "tower_tiny.safetensors" ? "Tiny" : "RealWidths"; });

void VisionTowerTest::check_every_stage() {
  std::vector<float> x, merged, projected;
  tower_.embed(images_, x);
  if (!golden_.embed.empty()) expect_close("patch embed + position grid", x, golden_.embed);
  tower_.encode(images_, x);
  tower_.merge(images_, x, merged);
  if (!golden_.merged.empty()) expect_close("tower (blocks, final norm, tpool merge)", merged, golden_.merged);
  projector_.forward(merged.data(), static_cast<int64_t>(merged.size()) / projector_.in_width(), projected);
  expect_close("projector", projected, golden_.projected);
  expect_close("projector vs the torch transcription", projected, golden_.projected_transcription);
  auto whole = tower_.forward(images_);
  ASSERT_TRUE(whole) << whole.error().message();
  EXPECT_EQ(*whole, merged);
}
TEST_P(VisionTowerTest, EveryStageMatchesSglangReference) { check_every_stage(); }

// The released shapes the goldens above cut short, one test per golden (one large checkpoint per process), both
// references: all 27 blocks at K3's tower widths (a 0.8 GB checkpoint) and the projector out to K3's text width
// 7168 (`--hidden 7168`, 0.4 GB).
class VisionTowerReleasedShapeTest : public VisionTowerTest {};
INSTANTIATE_TEST_SUITE_P(Goldens, VisionTowerReleasedShapeTest,
                         ::testing::Values("tower_real_27_blocks.safetensors", "tower_projector_7168.safetensors"),
                         [](const auto& info) {
                           return info.param == "tower_real_27_blocks.safetensors" ? "Real27Blocks" : "Projector7168";
                         });
TEST_P(VisionTowerReleasedShapeTest, EveryStoredStageMatchesBothReferences) {
  EXPECT_TRUE(vcfg_.num_layers == 27 || vcfg_.text_hidden == 7168);
  EXPECT_EQ(vcfg_.hidden, 1024);
  check_every_stage();
  expect_close("transcription vs sglang", golden_.projected_transcription, golden_.projected);
}

// The two independent references (sglang's port and the minimal transcription) agree with each other.
TEST_P(VisionTowerTest, TorchTranscriptionAgreesWithSglang) {
  ASSERT_FALSE(golden_.projected_transcription.empty());
  expect_close("transcription vs sglang", golden_.projected_transcription, golden_.projected);
}

// Batching is exact: every image alone gives the same bits as in the batch (matrix products are batch-invariant,
// attention never crosses images).
TEST_P(VisionTowerTest, ImageAloneEqualsItsRowsInTheBatch) {
  auto batch = tower_.forward(images_);
  ASSERT_TRUE(batch) << batch.error().message();
  size_t row = 0;
  for (const VisionImage& im : images_) {
    auto alone = tower_.forward(std::span<const VisionImage>(&im, 1));
    ASSERT_TRUE(alone) << alone.error().message();
    const std::vector<float> slice(batch->begin() + static_cast<long>(row), batch->begin() + static_cast<long>(row + alone->size()));
    EXPECT_EQ(*alone, slice);
    row += alone->size();
  }
  EXPECT_EQ(row, batch->size());
}

// The same at sizes where the products are large (1,024 + 384 patches: OpenBLAS's blocked path, M cut differently
// into tiles in each batch): image A alone, then after B, then before B, then again —
// A's rows are the same bits every time (kernels/cpu/blas_gemm.h).
TEST_P(VisionTowerTest, LargerImageAloneEqualsItsRowsInAnyBatch) {
  const int64_t per_patch = 3 * int64_t{vcfg_.patch_size} * vcfg_.patch_size;
  const std::vector<float> pa = testing::hashed_pixels(11, 32 * 32 * per_patch), pb = testing::hashed_pixels(12, 16 * 24 * per_patch);
  const VisionImage a{pa.data(), {1, 32, 32}}, b{pb.data(), {1, 16, 24}};
  auto alone = tower_.forward(std::span<const VisionImage>(&a, 1));
  ASSERT_TRUE(alone) << alone.error().message();
  const std::vector<VisionImage> b_then_a = {b, a}, a_then_b = {a, b};
  auto after = tower_.forward(b_then_a);
  auto before = tower_.forward(a_then_b);
  auto again = tower_.forward(std::span<const VisionImage>(&a, 1));
  ASSERT_TRUE(after && before && again);
  const size_t rows = alone->size(), b_rows = after->size() - rows;
  EXPECT_TRUE(std::equal(alone->begin(), alone->end(), after->begin() + static_cast<long>(b_rows))) << "A after B";
  EXPECT_TRUE(std::equal(alone->begin(), alone->end(), before->begin())) << "A before B";
  EXPECT_EQ(*alone, *again) << "run to run";
  std::vector<float> projected_alone, projected_batch;
  const int64_t tokens = static_cast<int64_t>(rows) / projector_.in_width();
  projector_.forward(alone->data(), tokens, projected_alone);
  projector_.forward(before->data(), static_cast<int64_t>(before->size()) / projector_.in_width(), projected_batch);
  EXPECT_TRUE(std::equal(projected_alone.begin(), projected_alone.end(), projected_batch.begin())) << "projector";
}

// The encoder's bits do not depend on the thread count: the dense products run as fixed tiles, each on one
// single-threaded OpenBLAS call (kernels/cpu/blas_gemm.h), and attention's work items are fixed (flash_attention.h).
// A 32 x 32 image (1,024 patches: several row blocks and column chunks per product) and the golden batch.
TEST_P(VisionTowerTest, SameBitsOnOneTwoAndThreeThreads) {
  const int64_t per_patch = 3 * int64_t{vcfg_.patch_size} * vcfg_.patch_size;
  const std::vector<float> pa = testing::hashed_pixels(13, 32 * 32 * per_patch);
  const VisionImage a{pa.data(), {1, 32, 32}};
  const int saved = omp_get_max_threads();
  std::vector<std::vector<float>> big, batch;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    auto r = tower_.forward(std::span<const VisionImage>(&a, 1));
    auto g = tower_.forward(images_);
    ASSERT_TRUE(r && g);
    big.push_back(std::move(*r));
    batch.push_back(std::move(*g));
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(big[0], big[1]) << "1 vs 2 threads";
  EXPECT_EQ(big[0], big[2]) << "1 vs 3 threads";
  EXPECT_EQ(batch[0], batch[1]) << "golden batch, 1 vs 2 threads";
  EXPECT_EQ(batch[0], batch[2]) << "golden batch, 1 vs 3 threads";
}

// The block buffers kept from one encoding for the next (VisionTower::take_buffers / keep_buffers) change no bits:
// the golden batch on fresh buffers, then a larger image (the buffers grow), then each again on the kept, stale
// buffers; and two encodings at once (one takes the kept set, the other allocates its own) give the same bits too.
TEST_P(VisionTowerTest, KeptBuffersChangeNoBits) {
  const int64_t per_patch = 3 * int64_t{vcfg_.patch_size} * vcfg_.patch_size;
  const std::vector<float> pa = testing::hashed_pixels(14, 32 * 32 * per_patch);
  const VisionImage a{pa.data(), {1, 32, 32}};
  const std::span<const VisionImage> big(&a, 1);
  auto small_fresh = tower_.forward(images_);
  auto big_first = tower_.forward(big);
  auto small_kept = tower_.forward(images_);
  auto big_kept = tower_.forward(big);
  ASSERT_TRUE(small_fresh && big_first && small_kept && big_kept);
  EXPECT_EQ(*small_fresh, *small_kept);
  EXPECT_EQ(*big_first, *big_kept);
  Result<std::vector<float>> r0 = std::vector<float>{}, r1 = std::vector<float>{};
  std::thread t0([&] { r0 = tower_.forward(big); });
  std::thread t1([&] { r1 = tower_.forward(images_); });
  t0.join();
  t1.join();
  ASSERT_TRUE(r0 && r1);
  EXPECT_EQ(*r0, *big_first);
  EXPECT_EQ(*r1, *small_fresh);
}

// The stage profile (VisionStageTimes) changes nothing and times every tower stage.
TEST_P(VisionTowerTest, ProfiledForwardEqualsPlainAndTimesEveryStage) {
  VisionStageTimes t;
  auto profiled = tower_.forward(images_, {}, &t);
  auto plain = tower_.forward(images_);
  ASSERT_TRUE(profiled && plain);
  EXPECT_EQ(*profiled, *plain);
  for (double s : {t.embed, t.buffers, t.norms, t.qkv, t.rope, t.attention, t.out_proj, t.fc0_gelu, t.fc1, t.residual, t.merger})
    EXPECT_GT(s, 0.0);
  EXPECT_EQ(t.projector, 0.0);  // the model's part
}

TEST_P(VisionTowerTest, RefusesGridsItCannotRun) {
  auto msg = [&](std::array<int64_t, 3> g) { return tower_.check_grid(g).message(); };
  EXPECT_TRUE(tower_.check_grid({1, 2, 512}).is_ok());
  EXPECT_NE(msg({2, 4, 4}).find("video input is not supported"), std::string::npos);
  EXPECT_NE(msg({1, 3, 4}).find("not a multiple of the merge kernel 2x2"), std::string::npos);
  EXPECT_NE(msg({1, 2, 514}).find("outside 1..512"), std::string::npos);
  EXPECT_NE(msg({1, 0, 2}).find("outside 1..512"), std::string::npos);
  std::vector<float> px(3 * 14 * 14 * 6);
  const VisionImage odd{px.data(), {1, 3, 2}};
  EXPECT_FALSE(tower_.forward(std::span<const VisionImage>(&odd, 1)));
}

// Strict binding: a tensor of the released layout with the wrong shape is refused by name.
TEST_P(VisionTowerTest, BindingIsByReleasedNameAndShape) {
  VisionConfig wrong = vcfg_;
  wrong.intermediate *= 2;
  Binder b(*ck_);
  VisionTower t;
  const Status s = t.bind(b, wrong);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("vision_tower.encoder.blocks.0.mlp.fc0.weight"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kestrel
