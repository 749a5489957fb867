// Image embeddings in the prompt (Engine::prefill_media, runtime/image_input): the projected rows of a request's
// images replace the token embeddings at the prompt's <|media_pad|> positions, in order. On the generated k3-tiny
// checkpoint (vision tower in the released layout) with the committed fixtures of tests/data/vision: the image
// changes the logits, the same image gives the same bits, two images behind identical token ids give different
// logits, a pad/row count mismatch is a clear error, and a request with images batched with a text-only request
// gives each the bits it gets alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "runtime/engine.h"
#include "runtime/image_input.h"

namespace kestrel {
namespace {

std::vector<uint8_t> fixture(const std::string& name) {
  return testing::read_bytes(std::string(KESTREL_TEST_DATA) + "/vision/" + name);
}

class VisionPromptTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    testing::make_checkpoint("k3-tiny", dir_->path());
    auto e = Engine::load(dir_->path());
    if (!e) throw std::runtime_error(e.error().message());
    engine_ = e->release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete dir_;
  }

  // Images prepared and embedded, and a prompt of a few text ids around their pads.
  struct Request {
    PreparedImages images;
    std::vector<float> media;
    std::vector<int32_t> ids;
  };
  static Request request(const std::vector<std::string>& files) {
    std::vector<std::vector<uint8_t>> bytes;
    for (const auto& f : files) bytes.push_back(fixture(f));
    auto prepared = prepare_images(bytes, ImageRequestLimits{});
    if (!prepared) throw std::runtime_error(prepared.error().message());
    Request r;
    r.images = std::move(*prepared);
    auto media = embed_images(*engine_, r.images);
    if (!media) throw std::runtime_error(media.error().message());
    r.media = std::move(*media);
    const int32_t pad = engine_->config().media_pad_id;
    r.ids = {5, 6, 7};
    for (const auto& im : r.images.images) {
      r.ids.push_back(8);
      r.ids.insert(r.ids.end(), static_cast<size_t>(im.plan.num_tokens), pad);
      r.ids.push_back(9);
    }
    r.ids.insert(r.ids.end(), {10, 11});
    return r;
  }
  static std::vector<float> logits(const Request& r, int64_t chunk = 0) {
    SequenceState seq = engine_->new_sequence();
    auto l = engine_->prefill_media(seq, r.ids, r.media, chunk, /*all_logits=*/true);
    if (!l) throw std::runtime_error(l.error().message());
    return *l;
  }

  static testing::TempDir* dir_;
  static Engine* engine_;
};
testing::TempDir* VisionPromptTest::dir_ = nullptr;
Engine* VisionPromptTest::engine_ = nullptr;

TEST_F(VisionPromptTest, PadIdIsTheK3MediaPad) {
  // The generator writes media_placeholder_token_id = first special id + 21, K3's <|media_pad|> offset.
  EXPECT_EQ(engine_->config().media_pad_id, engine_->config().text.bos_token_id + 21);
  EXPECT_TRUE(engine_->has_vision());
}

TEST_F(VisionPromptTest, ImageChangesLogitsAndSameImageSameBits) {
  const Request r = request({"rgb.png"});
  ASSERT_EQ(r.images.tokens, 6);  // 61x47 -> padded 84x56 -> 3x2 tokens
  const std::vector<float> a = logits(r), b = logits(r);
  EXPECT_EQ(a, b);
  const int64_t V = engine_->config().text.vocab_size;
  const size_t first_pad = 4;  // ids 5 6 7 8, then the pads
  // Rows before the first pad are causal-only: untouched by the image.
  SequenceState seq = engine_->new_sequence();
  auto text_only = engine_->prefill(seq, r.ids, 0, true);
  ASSERT_TRUE(text_only) << text_only.error().message();
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + static_cast<long>(first_pad * V), text_only->begin()));
  // From the first pad on, every row differs from the pads' own token embedding.
  for (size_t row = first_pad; row < r.ids.size(); ++row)
    EXPECT_FALSE(std::equal(a.begin() + static_cast<long>(row * V), a.begin() + static_cast<long>((row + 1) * V),
                            text_only->begin() + static_cast<long>(row * V)))
        << "row " << row;
}

TEST_F(VisionPromptTest, DifferentImagesBehindIdenticalTokenIdsGiveDifferentLogits) {
  const Request opaque = request({"palette.png"}), transparent = request({"palette_trns.png"});
  ASSERT_EQ(opaque.ids, transparent.ids);  // both 40x33: same prompt text, same pads
  EXPECT_NE(opaque.media, transparent.media);
  EXPECT_NE(logits(opaque), logits(transparent));
}

TEST_F(VisionPromptTest, ChunksThatSplitTheImageTakeTheRightRows) {
  const Request r = request({"rgb.png", "palette.png"});
  ASSERT_EQ(r.images.tokens, 10);
  const std::vector<float> whole = logits(r);
  const std::vector<float> chunked = logits(r, 3);  // chunk edges fall inside both pad runs
  ASSERT_EQ(whole.size(), chunked.size());
  double max_diff = 0;
  for (size_t i = 0; i < whole.size(); ++i) max_diff = std::max(max_diff, static_cast<double>(std::fabs(whole[i] - chunked[i])));
  EXPECT_LE(max_diff, 1e-4);  // chunked KDA/MLA prefill differs from one pass only by summation order
  // Rows shifted by one pad would be far off: the image rows are not interchangeable.
  Request shifted = r;
  std::rotate(shifted.media.begin(), shifted.media.begin() + engine_->config().text.hidden_size, shifted.media.end());
  const std::vector<float> wrong = logits(shifted);
  double wrong_diff = 0;
  for (size_t i = 0; i < whole.size(); ++i) wrong_diff = std::max(wrong_diff, static_cast<double>(std::fabs(whole[i] - wrong[i])));
  EXPECT_GT(wrong_diff, 1e-2);
}

TEST_F(VisionPromptTest, PadCountMismatchIsAClearError) {
  Request r = request({"rgb.png"});
  SequenceState seq = engine_->new_sequence();
  std::vector<int32_t> fewer = r.ids;
  fewer.erase(std::find(fewer.begin(), fewer.end(), engine_->config().media_pad_id));
  auto l = engine_->prefill_media(seq, fewer, r.media);
  ASSERT_FALSE(l);
  EXPECT_EQ(l.error().message(), "the prompt has 5 <|media_pad|> positions (id " +
                                     std::to_string(engine_->config().media_pad_id) +
                                     ") but the images give 6 embedding rows");
  std::vector<float> ragged(r.media.begin(), r.media.end() - 1);
  auto l2 = engine_->prefill_media(seq, r.ids, ragged);
  ASSERT_FALSE(l2);
  EXPECT_NE(l2.error().message().find("not whole rows of"), std::string::npos) << l2.error().message();
  EXPECT_EQ(seq.n_tokens, 0);  // nothing ran
}

TEST_F(VisionPromptTest, BatchedWithTextOnlyRequestIsBitIdenticalToAlone) {
  const Request r = request({"rgb.png"});
  const std::vector<int32_t> text = {12, 13, 14, 15, 16, 17, 18};
  Model& m = engine_->model();
  SequenceState s1 = engine_->new_sequence(), s2 = engine_->new_sequence();
  const SeqRun runs[] = {{r.ids.data(), static_cast<int64_t>(r.ids.size()), &s1, true, r.media.data(), r.images.tokens},
                         {text.data(), static_cast<int64_t>(text.size()), &s2, true, nullptr, 0}};
  std::vector<float> batched;
  m.forward_batch(runs, batched);
  const int64_t V = engine_->config().text.vocab_size;
  const std::vector<float> image_alone = logits(r);
  SequenceState s3 = engine_->new_sequence();
  auto text_alone = engine_->prefill(s3, text, 0, true);
  ASSERT_TRUE(text_alone);
  ASSERT_EQ(batched.size(), image_alone.size() + text_alone->size());
  EXPECT_TRUE(std::equal(image_alone.begin(), image_alone.end(), batched.begin()));
  EXPECT_TRUE(std::equal(text_alone->begin(), text_alone->end(), batched.begin() + static_cast<long>(r.ids.size() * V)));
}

TEST_F(VisionPromptTest, RequestLimitsAreCheckedBeforeTheTower) {
  const std::vector<std::vector<uint8_t>> three = {fixture("rgb.png"), fixture("rgb.png"), fixture("rgb.png")};
  ImageRequestLimits limits;
  limits.max_images = 2;
  auto p = prepare_images(three, limits);
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().message(), "3 images in one request; the limit is 2");
  limits = {};
  limits.max_tokens = 10;
  p = prepare_images(three, limits);
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().message(), "image 2: the request's images need 12 image tokens so far; the limit is 10");
  const std::vector<std::vector<uint8_t>> broken = {fixture("rgb.png"), {0x89, 'P', 'N', 'G', 1, 2, 3}};
  p = prepare_images(broken, ImageRequestLimits{});
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().message().rfind("image 2: ", 0), 0u) << p.error().message();
}

// The prefix-cache identity of an image: 256 bits over its bytes, the preprocessing config and the grid. Equal
// files give equal hashes; two different 40x33 images (identical prompt token ids) give different ones.
TEST_F(VisionPromptTest, ImageHashesFollowTheContent) {
  const std::vector<std::vector<uint8_t>> files = {fixture("palette.png"), fixture("palette_trns.png"),
                                                   fixture("palette.png")};
  auto p = prepare_images(files, ImageRequestLimits{});
  ASSERT_TRUE(p) << p.error().message();
  ASSERT_EQ(p->hashes.size(), 3u);
  EXPECT_EQ(p->prompts[0], p->prompts[1]);
  EXPECT_NE(p->hashes[0], p->hashes[1]);
  EXPECT_EQ(p->hashes[0], p->hashes[2]);
  std::vector<uint8_t> changed = files[0];
  changed.push_back(0);  // a byte after IEND: same pixels, another file
  const std::vector<std::vector<uint8_t>> one = {changed};
  auto q = prepare_images(one, ImageRequestLimits{});
  ASSERT_TRUE(q) << q.error().message();
  EXPECT_NE(q->hashes[0], p->hashes[0]);
}

TEST(VisionPromptNoTower, ImagesAreRefusedByAModelWithoutATower) {
  testing::TempDir dir;
  testing::make_checkpoint("kimi-linear-tiny", dir.path());
  auto e = Engine::load(dir.path());
  ASSERT_TRUE(e) << e.error().message();
  EXPECT_FALSE((*e)->has_vision());
  std::vector<float> px(3 * 14 * 14 * 4);
  const VisionImage im{px.data(), {1, 2, 2}};
  auto rows = (*e)->encode_images(std::span<const VisionImage>(&im, 1));
  ASSERT_FALSE(rows);
  EXPECT_NE(rows.error().message().find("without a vision tower"), std::string::npos);
  SequenceState seq = (*e)->new_sequence();
  const std::vector<int32_t> ids = {1, 2};
  const std::vector<float> media(static_cast<size_t>((*e)->config().text.hidden_size));
  auto l = (*e)->prefill_media(seq, ids, media);
  ASSERT_FALSE(l);
  EXPECT_NE(l.error().message().find("without a vision tower"), std::string::npos);
}

}  // namespace
}  // namespace kestrel
