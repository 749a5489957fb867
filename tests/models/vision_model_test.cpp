// The whole tiny K3 with a vision tower (tower + projector + text model) against an independent pipeline:
// tests/data/vision/model_two_images.safetensors, written by tools/gen_vision_model_goldens.py: sglang 0.5.23's
// KimiK3VisionTower + KimiK3MultiModalProjector (fp32 PyTorch) encode two images of different sizes (8x8 patches:
// 16 tokens, the position grid's own size; 2x6: 3 tokens, interpolated) as one batch, and llama.cpp's Kimi K3 text
// model (f32 GGUF, f32 KV) runs the prompt as input embeddings: embed_tokens rows at text positions, the projected
// image rows at the <|media_pad|> positions. Same checkpoint (`kestrel make-model --preset k3-tiny-bf16` with the
// golden's --vt-* flags), same hashed pixels (re-computed here). Kestrel runs the same path a request takes:
// Engine::encode_images, then Engine::prefill_media with logits at every position.
//
// Tolerances (fp32 on both sides from the same bf16 weights):
//   image rows: max |Δ| ≤ 1e-5 · max |reference|, cosine ≥ 1 − 1e-10 (vision_tower_test's bound; summation
//   order and libm only).
//   logits, per position: max |Δlogit| ≤ 2e-4 and NMSE ≤ 1e-9, and the same top-1 token. The text model alone
//   meets this bound against the same llama.cpp (golden_test, k3_bf16_vs_llamacpp: summation order, KDA
//   chunking, llama.cpp's q/k L2-norm eps); the image rows add their ~3e-6 fp32 noise, which the reference
//   itself turns into at most 1.9e-5 of logit (its logits with the torch transcription's rows instead of
//   sglang's: the golden's metadata). The images move the logits by up to 5.8, so rows at the wrong pads, a
//   dropped image or a wrong tower are far outside the bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "loader/safetensors.h"
#include "runtime/engine.h"
#include "vision_test_inputs.h"

namespace kestrel {
namespace {

struct Golden {
  std::vector<int32_t> prompt;
  std::vector<std::array<int64_t, 3>> grids;
  std::vector<float> media, logits;
  std::vector<std::string> make_model_flags;
  std::string preset;
};

Golden read_golden() {
  auto f = SafetensorsFile::open(std::string(KESTREL_TEST_DATA) + "/vision/model_two_images.safetensors");
  if (!f) throw std::runtime_error(f.error().message());
  Golden g;
  const auto& meta = f->header().metadata;
  g.make_model_flags = nlohmann::json::parse(meta.at("make_model_flags")).get<std::vector<std::string>>();
  g.preset = meta.at("preset");
  for (const auto& e : f->header().entries) {
    const TensorView t = f->view(e);
    if (e.name == "prompt") {
      const int32_t* p = static_cast<const int32_t*>(t.data);
      g.prompt.assign(p, p + t.numel());
    } else if (e.name == "grids") {
      const int32_t* p = static_cast<const int32_t*>(t.data);
      for (int64_t i = 0; i < e.shape[0]; ++i) g.grids.push_back({p[3 * i], p[3 * i + 1], p[3 * i + 2]});
    } else {
      const float* p = static_cast<const float*>(t.data);
      (e.name == "media" ? g.media : g.logits).assign(p, p + t.numel());
    }
  }
  return g;
}

class VisionModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    golden_ = new Golden(read_golden());
    dir_ = new testing::TempDir();
    testing::make_checkpoint(golden_->preset, dir_->path(),
                             [](GenSpec& s) { testing::apply_make_model_flags(golden_->make_model_flags, s); });
    auto e = Engine::load(dir_->path());
    if (!e) throw std::runtime_error(e.error().message());
    engine_ = e->release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete dir_;
    delete golden_;
  }

  static std::vector<float> media() {
    const int64_t per_patch = 3 * 14 * 14;
    std::vector<std::vector<float>> pixels;
    std::vector<VisionImage> images;
    for (size_t i = 0; i < golden_->grids.size(); ++i) {
      const auto& g = golden_->grids[i];
      pixels.push_back(testing::hashed_pixels(i, g[0] * g[1] * g[2] * per_patch));
    }
    for (size_t i = 0; i < pixels.size(); ++i) images.push_back({pixels[i].data(), golden_->grids[i]});
    auto m = engine_->encode_images(images);
    if (!m) throw std::runtime_error(m.error().message());
    return *m;
  }

  static std::vector<float> logits(const std::vector<float>& rows, int64_t chunk) {
    SequenceState seq = engine_->new_sequence();
    auto l = engine_->prefill_media(seq, golden_->prompt, rows, chunk, /*all_logits=*/true);
    if (!l) throw std::runtime_error(l.error().message());
    return *l;
  }

  static void expect_logits_close(const std::vector<float>& got, const char* what) {
    const auto V = static_cast<size_t>(engine_->config().text.vocab_size);
    ASSERT_EQ(got.size(), golden_->prompt.size() * V) << what;
    ASSERT_EQ(golden_->logits.size(), got.size()) << what;
    double worst_abs = 0, worst_nmse = 0;
    for (size_t r = 0; r < golden_->prompt.size(); ++r) {
      const float* a = got.data() + r * V;
      const float* b = golden_->logits.data() + r * V;
      double num = 0, den = 0;
      for (size_t i = 0; i < V; ++i) {
        const double d = static_cast<double>(a[i]) - b[i];
        worst_abs = std::max(worst_abs, std::fabs(d));
        num += d * d;
        den += static_cast<double>(b[i]) * b[i];
      }
      worst_nmse = std::max(worst_nmse, num / den);
      EXPECT_EQ(std::max_element(a, a + V) - a, std::max_element(b, b + V) - b) << what << ": top-1 at row " << r;
    }
    std::printf("[ %s ] max |dlogit| %.3g, max NMSE %.3g over %zu positions\n", what, worst_abs, worst_nmse,
                golden_->prompt.size());
    EXPECT_LE(worst_abs, 2e-4) << what;
    EXPECT_LE(worst_nmse, 1e-9) << what;
  }

  static Golden* golden_;
  static testing::TempDir* dir_;
  static Engine* engine_;
};
Golden* VisionModelTest::golden_ = nullptr;
testing::TempDir* VisionModelTest::dir_ = nullptr;
Engine* VisionModelTest::engine_ = nullptr;

TEST_F(VisionModelTest, GoldenIsTwoImagesOfDifferentSizes) {
  ASSERT_EQ(golden_->grids.size(), 2u);
  EXPECT_NE(golden_->grids[0], golden_->grids[1]);
  const auto pads = std::count(golden_->prompt.begin(), golden_->prompt.end(), engine_->config().media_pad_id);
  EXPECT_EQ(pads * engine_->config().text.hidden_size, static_cast<int64_t>(golden_->media.size()));
}

TEST_F(VisionModelTest, ImageRowsMatchTheReference) {
  const std::vector<float> got = media();
  ASSERT_EQ(got.size(), golden_->media.size());
  double max_ref = 0, max_diff = 0, dot = 0, ng = 0, nw = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = golden_->media[i];
    max_ref = std::max(max_ref, std::fabs(b));
    max_diff = std::max(max_diff, std::fabs(a - b));
    dot += a * b;
    ng += a * a;
    nw += b * b;
  }
  const double cosine = dot / std::sqrt(ng * nw);
  std::printf("[ image rows ] max |diff| %.3g (max |ref| %.3g), 1 - cosine %.3g\n", max_diff, max_ref, 1 - cosine);
  EXPECT_LE(max_diff, 1e-5 * max_ref);
  EXPECT_GE(cosine, 1.0 - 1e-10);
}

TEST_F(VisionModelTest, LogitsAtEveryPositionMatchTheReference) {
  expect_logits_close(logits(media(), 0), "one prefill");
}

// Chunks of 7: edges fall inside both pad runs, so each chunk takes the right image rows.
TEST_F(VisionModelTest, ChunkedPrefillMatchesTheReference) {
  expect_logits_close(logits(media(), 7), "chunks of 7");
}

// The comparison has teeth: the same rows with the two images swapped (image order at the pads) are far outside it.
TEST_F(VisionModelTest, SwappedImagesAreFarFromTheReference) {
  std::vector<float> rows = media();
  const auto H = static_cast<size_t>(engine_->config().text.hidden_size);
  const auto first = static_cast<size_t>((golden_->grids[0][1] / 2) * (golden_->grids[0][2] / 2));
  std::rotate(rows.begin(), rows.begin() + static_cast<long>(first * H), rows.end());
  const std::vector<float> got = logits(rows, 0);
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - golden_->logits[i]));
  EXPECT_GT(worst, 0.1);
}

}  // namespace
}  // namespace kestrel
