#include "layers/vision_tower.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "kernels/cpu/blas_gemm.h"
#include "kernels/cpu/flash_attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/scratch.h"

namespace kestrel {

namespace {

constexpr double kRopeTheta = 10000.0;

// Adds the seconds since the previous lap to a stage of VisionStageTimes; nothing when there is none.
class StageClock {
 public:
  explicit StageClock(VisionStageTimes* times) : times_(times) {
    if (times_) last_ = std::chrono::steady_clock::now();
  }
  void lap(double VisionStageTimes::*stage) {
    if (!times_) return;
    const auto now = std::chrono::steady_clock::now();
    times_->*stage += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  VisionStageTimes* times_;
  std::chrono::steady_clock::time_point last_;
};

// Source index and weights of PyTorch's bilinear resize (align_corners=False, no antialias) along one axis.
struct Tap {
  int64_t i0, i1;
  float l0, l1;
};
std::vector<Tap> bilinear_taps(int64_t in, int64_t out) {
  std::vector<Tap> taps(static_cast<size_t>(out));
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  for (int64_t o = 0; o < out; ++o) {
    const float src = std::max(0.0f, scale * (static_cast<float>(o) + 0.5f) - 0.5f);
    const int64_t i0 = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
    const float l1 = std::min(std::max(src - static_cast<float>(i0), 0.0f), 1.0f);
    taps[static_cast<size_t>(o)] = {i0, i0 + (i0 < in - 1 ? 1 : 0), 1.0f - l1, l1};
  }
  return taps;
}

}  // namespace

Status VisionTower::bind(Binder& b, const VisionConfig& v) {
  v_ = v;
  head_dim_ = v.qkv_hidden / v.num_heads;
  if (head_dim_ % 4 != 0)
    return invalid_argument("vision_config: head width qkv_hidden_size / vt_num_attention_heads = " +
                            std::to_string(head_dim_) + " is not a multiple of 4 (2-D RoPE)");
  const int64_t hid = v.hidden, ps = v.patch_size;
  patch_proj_ = b.flattened("vision_tower.patch_embed.proj", {hid, 3, ps, ps});
  pos_grid_ = b.vec("vision_tower.patch_embed.pos_emb.weight", {v.pos_emb_height, v.pos_emb_width, hid});
  blocks_.resize(static_cast<size_t>(v.num_layers));
  for (int i = 0; i < v.num_layers && b.ok(); ++i) {
    const std::string p = "vision_tower.encoder.blocks." + std::to_string(i) + ".";
    Block& blk = blocks_[static_cast<size_t>(i)];
    blk.norm0 = b.vec(p + "norm0.weight", {hid});
    blk.norm1 = b.vec(p + "norm1.weight", {hid});
    blk.wqkv = b.linear(p + "wqkv", 3 * int64_t{v.qkv_hidden}, hid);
    blk.wo = b.linear(p + "wo", hid, v.qkv_hidden);
    blk.fc0 = b.linear(p + "mlp.fc0", v.intermediate, hid);
    blk.fc1 = b.linear(p + "mlp.fc1", hid, v.intermediate);
  }
  final_norm_ = b.vec("vision_tower.encoder.final_layernorm.weight", {hid});
  // Frequencies 1/θ^(4i/head_dim), i < head_dim/4, and angles position·frequency, each rounded to fp32 as the
  // reference's fp32 tables are; cos/sin are evaluated in double and rounded.
  const int64_t nf = head_dim_ / 4;
  rope_cos_.resize(static_cast<size_t>(kMaxGridSide * nf));
  rope_sin_.resize(rope_cos_.size());
  for (int64_t i = 0; i < nf; ++i) {
    const float e = static_cast<float>(4 * i) / static_cast<float>(head_dim_);
    const float freq = 1.0f / static_cast<float>(std::pow(kRopeTheta, static_cast<double>(e)));
    for (int64_t p = 0; p < kMaxGridSide; ++p) {
      const double angle = static_cast<float>(p) * freq;
      rope_cos_[static_cast<size_t>(p * nf + i)] = static_cast<float>(std::cos(angle));
      rope_sin_[static_cast<size_t>(p * nf + i)] = static_cast<float>(std::sin(angle));
    }
  }
  return b.status();
}

Status VisionTower::check_grid(const std::array<int64_t, 3>& g) const {
  const std::string grid = "[" + std::to_string(g[0]) + ", " + std::to_string(g[1]) + ", " + std::to_string(g[2]) + "]";
  if (g[0] != 1) return unsupported("vision tower: grid " + grid + " has t != 1 (video input is not supported)");
  if (g[1] < 1 || g[2] < 1 || g[1] > kMaxGridSide || g[2] > kMaxGridSide)
    return invalid_argument("vision tower: grid " + grid + " is outside 1.." + std::to_string(kMaxGridSide) +
                            " patches per side");
  if (g[1] % v_.merge_h != 0 || g[2] % v_.merge_w != 0)
    return invalid_argument("vision tower: grid " + grid + " is not a multiple of the merge kernel " +
                            std::to_string(v_.merge_h) + "x" + std::to_string(v_.merge_w));
  return Status::ok();
}

void VisionTower::position_grid(int64_t h, int64_t w, std::vector<float>& out) const {
  const int64_t H = v_.pos_emb_height, W = v_.pos_emb_width, D = v_.hidden;
  out.resize(static_cast<size_t>(h * w * D));
  if (h == H && w == W) {
    std::copy(pos_grid_.begin(), pos_grid_.end(), out.begin());
    return;
  }
  const std::vector<Tap> ty = bilinear_taps(H, h), tx = bilinear_taps(W, w);
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      const Tap& a = ty[static_cast<size_t>(y)];
      const Tap& c = tx[static_cast<size_t>(x)];
      const float* v00 = pos_grid_.data() + (a.i0 * W + c.i0) * D;
      const float* v01 = pos_grid_.data() + (a.i0 * W + c.i1) * D;
      const float* v10 = pos_grid_.data() + (a.i1 * W + c.i0) * D;
      const float* v11 = pos_grid_.data() + (a.i1 * W + c.i1) * D;
      float* o = out.data() + (y * w + x) * D;
      for (int64_t d = 0; d < D; ++d)
        o[d] = a.l0 * (c.l0 * v00[d] + c.l1 * v01[d]) + a.l1 * (c.l0 * v10[d] + c.l1 * v11[d]);
    }
}

void VisionTower::embed(std::span<const VisionImage> images, std::vector<float>& x) const {
  int64_t total = 0;
  for (const VisionImage& im : images) total += im.patches();
  const int64_t D = v_.hidden;
  x.resize(static_cast<size_t>(total * D));
  std::vector<float> pos;
  int64_t row = 0;
  for (const VisionImage& im : images) {
    const int64_t n = im.patches();
    kernels::matmul_sgemm(patch_proj_, im.pixel_values, n, x.data() + row * D);
    position_grid(im.grid_thw[1], im.grid_thw[2], pos);
    float* xr = x.data() + row * D;
    for (int64_t i = 0; i < n * D; ++i) xr[i] += pos[static_cast<size_t>(i)];
    row += n;
  }
}

// Per image: each head's keys and values packed once (kernels::pack_keys_values, heads in parallel), then one work
// item per head and block of kQueryBlock query rows, key-tiled with an online softmax (kernels::attend_rows) so the
// score tile stays in L2. Items run in parallel; an item's bits depend only on its image's rows.
void VisionTower::attention(std::span<const VisionImage> images, const float* qkv, float* out,
                            kernels::HugePageBuffer& kv) const {
  constexpr int64_t kQueryBlock = 96;
  const int64_t heads = v_.num_heads, hd = head_dim_, width = 3 * int64_t{v_.qkv_hidden}, qw = v_.qkv_hidden;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  int64_t start = 0;
  for (const VisionImage& im : images) {
    const int64_t n = im.patches(), blocks = (n + kQueryBlock - 1) / kQueryBlock;
    const int64_t per_head = kernels::packed_kv_floats(n, hd);
    kv.reserve(static_cast<size_t>(heads * per_head));
    float* packed = kv.data();
    const float* base = qkv + start * width;
    kernels::parallel_for_dynamic(heads, 1, [&](int64_t h) {
      kernels::pack_keys_values(base + qw + h * hd, base + 2 * qw + h * hd, width, n, hd, packed + h * per_head);
    });
    kernels::parallel_for_dynamic(heads * blocks, 1, [&](int64_t item) {
      const int64_t h = item / blocks, i0 = item % blocks * kQueryBlock, B = std::min(kQueryBlock, n - i0);
      kernels::attend_rows(base + i0 * width + h * hd, width, B, packed + h * per_head, n, hd, scale,
                           out + (start + i0) * qw + h * hd, qw);
    });
    start += n;
  }
}

void VisionTower::block_forward(const Block& blk, std::span<const VisionImage> images,
                                const std::vector<int64_t>& rope_pos, std::vector<float>& x, BlockBuffers& buf,
                                VisionStageTimes* times) const {
  StageClock clock(times);
  const int64_t T = static_cast<int64_t>(rope_pos.size() / 2), D = v_.hidden, qw = v_.qkv_hidden;
  const int64_t heads = v_.num_heads, hd = head_dim_, nf = hd / 4;
  buf.h.reserve(static_cast<size_t>(T * D));
  buf.qkv.reserve(static_cast<size_t>(T * 3 * qw));
  buf.attn.reserve(static_cast<size_t>(T * qw));
  buf.proj.reserve(static_cast<size_t>(T * D));
  buf.mid.reserve(static_cast<size_t>(T * v_.intermediate));
  clock.lap(&VisionStageTimes::buffers);
  float* const h = buf.h.data();
  float* const qkv = buf.qkv.data();
  float* const attn = buf.attn.data();
  float* const proj = buf.proj.data();
  float* const mid = buf.mid.data();
  kernels::rms_norm(x.data(), blk.norm0.data(), T, D, kEncoderNormEps, h);
  clock.lap(&VisionStageTimes::norms);
  kernels::matmul_sgemm(blk.wqkv, h, T, qkv);
  clock.lap(&VisionStageTimes::qkv);
  // 2-D RoPE on q and k: complex pair 2i turns by column·freq_i, pair 2i+1 by row·freq_i.
  kernels::parallel_for(0, T, 1, T * qw >= 65536, [&](int64_t t) {
    const int64_t y = rope_pos[static_cast<size_t>(2 * t)], xcol = rope_pos[static_cast<size_t>(2 * t + 1)];
    for (int64_t part = 0; part < 2; ++part)
      for (int64_t hh = 0; hh < heads; ++hh) {
        float* r = qkv + t * 3 * qw + part * qw + hh * hd;
        for (int64_t p = 0; p < hd / 2; ++p) {
          const int64_t i = p / 2, pos = (p % 2 == 0) ? xcol : y;
          const float c = rope_cos_[static_cast<size_t>(pos * nf + i)], s = rope_sin_[static_cast<size_t>(pos * nf + i)];
          const float a = r[2 * p], bb = r[2 * p + 1];
          r[2 * p] = a * c - bb * s;
          r[2 * p + 1] = a * s + bb * c;
        }
      }
  });
  clock.lap(&VisionStageTimes::rope);
  attention(images, qkv, attn, buf.kv);
  clock.lap(&VisionStageTimes::attention);
  kernels::matmul_sgemm(blk.wo, attn, T, proj);
  clock.lap(&VisionStageTimes::out_proj);
  for (int64_t i = 0; i < T * D; ++i) x[static_cast<size_t>(i)] += proj[i];
  clock.lap(&VisionStageTimes::residual);
  kernels::rms_norm(x.data(), blk.norm1.data(), T, D, kEncoderNormEps, h);
  clock.lap(&VisionStageTimes::norms);
  kernels::matmul_sgemm(blk.fc0, h, T, mid, kernels::GemmEpilogue::kGeluTanh);
  clock.lap(&VisionStageTimes::fc0_gelu);
  kernels::matmul_sgemm(blk.fc1, mid, T, proj);
  clock.lap(&VisionStageTimes::fc1);
  for (int64_t i = 0; i < T * D; ++i) x[static_cast<size_t>(i)] += proj[i];
  clock.lap(&VisionStageTimes::residual);
}

std::unique_ptr<VisionTower::BlockBuffers> VisionTower::take_buffers() const {
  std::lock_guard<std::mutex> lock(kept_mu_);
  return kept_ ? std::move(kept_) : std::make_unique<BlockBuffers>();
}

void VisionTower::keep_buffers(std::unique_ptr<BlockBuffers> buf) const {
  if (buf->bytes() > kMaxKeptBufferBytes) return;
  std::lock_guard<std::mutex> lock(kept_mu_);
  if (!kept_ || kept_->bytes() < buf->bytes()) kept_ = std::move(buf);
}

Status VisionTower::encode(std::span<const VisionImage> images, std::vector<float>& x, const StopFn& stop,
                           VisionStageTimes* times) const {
  std::vector<int64_t> rope_pos;  // (row, column) of every patch in its image
  for (const VisionImage& im : images)
    for (int64_t y = 0; y < im.grid_thw[1]; ++y)
      for (int64_t c = 0; c < im.grid_thw[2]; ++c) rope_pos.push_back(y), rope_pos.push_back(c);
  std::unique_ptr<BlockBuffers> buf = take_buffers();
  for (const Block& blk : blocks_) {
    if (stop && stop()) return unavailable("image encoding stopped");
    block_forward(blk, images, rope_pos, x, *buf, times);
  }
  keep_buffers(std::move(buf));
  StageClock clock(times);
  const int64_t T = static_cast<int64_t>(rope_pos.size() / 2);
  kernels::rms_norm(x.data(), final_norm_.data(), T, v_.hidden, kEncoderNormEps, x.data());
  clock.lap(&VisionStageTimes::norms);
  return Status::ok();
}

void VisionTower::merge(std::span<const VisionImage> images, const std::vector<float>& x,
                        std::vector<float>& merged) const {
  const int64_t D = v_.hidden, mh = v_.merge_h, mw = v_.merge_w;
  int64_t total = 0;
  for (const VisionImage& im : images) total += tokens(im);
  merged.resize(static_cast<size_t>(total * mh * mw * D));
  float* o = merged.data();
  int64_t row = 0;
  for (const VisionImage& im : images) {
    const int64_t h = im.grid_thw[1], w = im.grid_thw[2];
    for (int64_t r = 0; r < h / mh; ++r)
      for (int64_t c = 0; c < w / mw; ++c)
        for (int64_t kr = 0; kr < mh; ++kr)
          for (int64_t kc = 0; kc < mw; ++kc, o += D) {
            const float* src = x.data() + (row + (r * mh + kr) * w + (c * mw + kc)) * D;
            std::copy(src, src + D, o);
          }
    row += h * w;
  }
}

Result<std::vector<float>> VisionTower::forward(std::span<const VisionImage> images, const StopFn& stop,
                                                VisionStageTimes* times) const {
  for (const VisionImage& im : images) KESTREL_RETURN_IF_ERROR(check_grid(im.grid_thw));
  std::vector<float> x, merged;
  StageClock clock(times);
  embed(images, x);
  clock.lap(&VisionStageTimes::embed);
  KESTREL_RETURN_IF_ERROR(encode(images, x, stop, times));
  clock = StageClock(times);
  merge(images, x, merged);
  clock.lap(&VisionStageTimes::merger);
  return merged;
}

}  // namespace kestrel
