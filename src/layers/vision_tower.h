// The Kimi K3 vision tower (MoonViT3d, docs/vision.md §5) on CPU in fp32: patch embedding (a Conv2d whose kernel
// equals its stride, i.e. a matrix over flattened 14x14 patches), the learnable position grid bilinearly
// interpolated to each image's patch grid, pre-norm blocks with 2-D RoPE and bidirectional attention inside each
// image, the final RMSNorm and the sd2 "tpool" patch merger. Weights are bound by their released names in place
// (bf16 in the checkpoint, fp32 arithmetic: the dense products through OpenBLAS, kernels/cpu/blas_gemm.h). The images
// of one request run as one batch: every matrix product of the blocks covers all their patches, attention runs per
// image (variable-length segments, nothing crosses images).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "base/result.h"
#include "kernels/cpu/huge_page_buffer.h"
#include "layers/binder.h"
#include "loader/vision_config.h"

namespace kestrel {

// One preprocessed image: pixel_values [t·h·w patches, 3, patch, patch] (media::PreprocessedImage) and its grid.
struct VisionImage {
  const float* pixel_values = nullptr;
  std::array<int64_t, 3> grid_thw = {1, 0, 0};
  int64_t patches() const { return grid_thw[0] * grid_thw[1] * grid_thw[2]; }
};

// Asked between the tower's blocks: true stops the encoding (a cancelled or timed-out request).
using StopFn = std::function<bool()>;

// Wall seconds per stage of an encoding, summed over blocks and calls (bench/vision_bench's profile; the tower adds
// one clock read per stage when a caller passes one). The GELU runs inside fc0's product (kernels::GemmEpilogue).
struct VisionStageTimes {
  double embed = 0;       // patch embedding + position grid
  double buffers = 0;     // allocating the per-block activation buffers (first block)
  double norms = 0;       // norm0, norm1 and the final norm
  double qkv = 0;         // wqkv
  double rope = 0;        // 2-D RoPE on q and k
  double attention = 0;   // key/value packing + key-tiled attention
  double out_proj = 0;    // wo
  double fc0_gelu = 0;    // mlp.fc0 with the GELU on each output tile
  double fc1 = 0;         // mlp.fc1
  double residual = 0;    // the two residual adds
  double merger = 0;      // the 2x2 patch merger
  double projector = 0;   // PatchMergerMLPV2 (filled by the model)
};

class VisionTower {
 public:
  // The encoder norms' epsilon: the released modules build RMSNorm without one, which PyTorch (2.7 and
  // later) resolves to the float32 machine epsilon, 2^-23 (docs/vision.md §5.2).
  static constexpr float kEncoderNormEps = 1.1920928955078125e-07f;
  // Longest side of a patch grid the 2-D RoPE table covers (the reference's 512 x 512).
  static constexpr int64_t kMaxGridSide = 512;

  // Binds vision_tower.* (docs/vision.md §5.1); the config must be the checkpoint's own.
  Status bind(Binder& b, const VisionConfig& v);

  // A grid the tower can run: t == 1 (images only), 1 <= h, w <= 512, h and w multiples of the merge kernel.
  Status check_grid(const std::array<int64_t, 3>& grid_thw) const;

  // The stages, for all images at once (x is [total patches, hidden]):
  // patch embedding plus the (interpolated) position grid,
  void embed(std::span<const VisionImage> images, std::vector<float>& x) const;
  // the blocks and the final norm, in place (`stop`, when set, is asked before every block: true ends the
  // encoding with kUnavailable, x left half-done),
  Status encode(std::span<const VisionImage> images, std::vector<float>& x, const StopFn& stop = {},
                VisionStageTimes* times = nullptr) const;
  // and the merger: merged [total tokens, merge_h·merge_w·hidden], each image's 2x2 windows in raster order,
  // the window's patches in (row, column) order.
  void merge(std::span<const VisionImage> images, const std::vector<float>& x, std::vector<float>& merged) const;

  // All three; every grid must pass check_grid.
  // `times`, when set, gets each stage's seconds added.
  Result<std::vector<float>> forward(std::span<const VisionImage> images, const StopFn& stop = {},
                                     VisionStageTimes* times = nullptr) const;

  int64_t hidden() const { return v_.hidden; }
  int64_t merged_width() const { return v_.merged_width(); }
  int64_t tokens(const VisionImage& im) const { return im.patches() / (int64_t{v_.merge_h} * v_.merge_w); }

 private:
  struct Block {
    std::vector<float> norm0, norm1;
    kernels::WeightMatrix wqkv, wo, fc0, fc1;
  };
  // Activations of one block, sized once per encode and reused by every block (no page faults per block).
  struct BlockBuffers {
    kernels::HugePageBuffer h, qkv, attn, proj, mid;
    kernels::HugePageBuffer kv;  // one image's keys and values packed per head (kernels::pack_keys_values)
    size_t bytes() const {
      return (h.capacity() + qkv.capacity() + attn.capacity() + proj.capacity() + mid.capacity() + kv.capacity()) *
             sizeof(float);
    }
  };
  // Block buffers kept from one encoding for the next (their pages already faulted in: a fresh 250 MiB set costs
  // its page faults and the kernel's zeroing of every page on first touch, again for every image), when they total
  // at most kMaxKeptBufferBytes (an image of up to ~2,000 tokens at K3's widths); an encoding running while the set
  // is taken allocates its own.
  static constexpr size_t kMaxKeptBufferBytes = size_t{512} << 20;
  std::unique_ptr<BlockBuffers> take_buffers() const;
  void keep_buffers(std::unique_ptr<BlockBuffers> buf) const;
  // Position grid interpolated to h x w (or the grid itself when it is h x w): [h·w, hidden].
  void position_grid(int64_t h, int64_t w, std::vector<float>& out) const;
  void block_forward(const Block& blk, std::span<const VisionImage> images, const std::vector<int64_t>& rope_pos,
                     std::vector<float>& x, BlockBuffers& buf, VisionStageTimes* times) const;
  void attention(std::span<const VisionImage> images, const float* qkv, float* out, kernels::HugePageBuffer& kv) const;

  VisionConfig v_;
  int64_t head_dim_ = 0;
  kernels::WeightMatrix patch_proj_;
  std::vector<float> pos_grid_;  // [pos_h, pos_w, hidden]
  std::vector<Block> blocks_;
  std::vector<float> final_norm_;
  // RoPE: cos/sin of position p times frequency i, [kMaxGridSide, head_dim / 4].
  std::vector<float> rope_cos_, rope_sin_;
  mutable std::mutex kept_mu_;
  mutable std::unique_ptr<BlockBuffers> kept_;  // guarded by kept_mu_
};

}  // namespace kestrel
