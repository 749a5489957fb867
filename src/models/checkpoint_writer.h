// Internal to models/: the pieces the checkpoint generators share — a deterministic RNG seeded per
// tensor name (so a tensor's values do not depend on which other tensors exist), a tensor
// collector with the value distributions the presets use, and the sharded safetensors writer.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/progress.h"
#include "base/result.h"
#include "loader/safetensors.h"
#include "models/checkpoint_generator.h"
#include "tensor/dtype.h"

namespace kestrel::gen_detail {

namespace fs = std::filesystem;
using nlohmann::json;

// splitmix64: tiny, deterministic across platforms.
class Rng {
 public:
  explicit Rng(uint64_t s) : s_(s) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>((next() >> 40) * (1.0 / 16777216.0)); }  // [0,1)
  float sym() { return 2.0f * uniform() - 1.0f; }                                     // [-1,1)

 private:
  uint64_t s_;
};

inline uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (char ch : name) h = (h ^ static_cast<uint8_t>(ch)) * 1099511628211ull;
  return h;
}

class Writer {
 public:
  Writer(const GenSpec& s, Progress* progress = nullptr) : spec_(s), progress_(progress) {}
  std::vector<TensorToWrite> tensors;

  void bf16(const std::string& name, std::vector<int64_t> shape, float scale, float offset = 0.0f) {
    push(name, DType::kBF16, std::move(shape), [&](Rng& r, std::vector<uint8_t>& b, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t v = f32_to_bf16(offset + scale * r.sym());
        b[static_cast<size_t>(2 * i)] = static_cast<uint8_t>(v), b[static_cast<size_t>(2 * i + 1)] = static_cast<uint8_t>(v >> 8);
      }
    });
  }
  template <typename F>
  void f32(const std::string& name, std::vector<int64_t> shape, F value) {
    push(name, DType::kF32, std::move(shape), [&](Rng& r, std::vector<uint8_t>& b, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const float v = value(r, i);
        std::memcpy(b.data() + 4 * i, &v, 4);
      }
    });
  }
  // Linear [out, in] with uniform(-a, a), a = sqrt(3/in) → unit-variance outputs for unit inputs.
  void linear(const std::string& name, int64_t out, int64_t in) {
    bf16(name + ".weight", {out, in}, std::sqrt(3.0f / static_cast<float>(in)));
  }
  // compressed-tensors MXFP4: random E2M1 codes, E8M0 scales around 2^-(log2(sqrt(in))+1).
  void mxfp4(const std::string& name, int64_t out, int64_t in) {
    const int base = 127 - static_cast<int>(std::lround(std::log2(std::sqrt(static_cast<float>(in))))) - 1;
    push(name + ".weight_packed", DType::kU8, {out, in / 2}, [&](Rng& r, std::vector<uint8_t>& b, int64_t n) {
      for (int64_t i = 0; i < n; ++i) b[static_cast<size_t>(i)] = static_cast<uint8_t>(r.next() & 0xff);
    });
    push(name + ".weight_scale", DType::kU8, {out, in / 32}, [&](Rng& r, std::vector<uint8_t>& b, int64_t n) {
      for (int64_t i = 0; i < n; ++i) b[static_cast<size_t>(i)] = static_cast<uint8_t>(base - 1 + static_cast<int>(r.next() % 3));
    });
  }
  void norm(const std::string& name, int64_t n) { bf16(name, {n}, 0.1f, 1.0f); }

 private:
  template <typename F>
  void push(const std::string& name, DType dt, std::vector<int64_t> shape, F fill) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    TensorToWrite t{name, dt, std::move(shape), std::vector<uint8_t>(static_cast<size_t>(n * dtype_size(dt)))};
    Rng r(name_seed(spec_.seed, name));
    fill(r, t.bytes, n);
    if (progress_) progress_->advance(t.bytes.size());
    tensors.push_back(std::move(t));
  }
  const GenSpec& spec_;
  Progress* progress_;
};

// Nearest float8_e4m3fn code (ties to the even code) for |x| ≤ 448; sign in bit 7.
inline uint8_t f32_to_e4m3(float x) {
  static const std::vector<float> mags = [] {
    std::vector<float> v;
    for (int c = 0; c < 0x7f; ++c) v.push_back(f8e4m3_to_f32(static_cast<uint8_t>(c)));  // ascending
    return v;
  }();
  const float a = std::min(std::fabs(x), 448.0f);
  const size_t hi = static_cast<size_t>(std::lower_bound(mags.begin(), mags.end(), a) - mags.begin());
  size_t c = std::min(hi, mags.size() - 1);
  if (hi > 0) {
    const float dl = a - mags[hi - 1], dh = mags[c] - a;
    if (dl < dh || (dl == dh && (hi - 1) % 2 == 0)) c = hi - 1;
  }
  return static_cast<uint8_t>(c | (x < 0 ? 0x80 : 0));
}

// DeepSeek FP8 linear [out, in]: values uniform(-a, a)·(block gain in [0.5, 1.5)), a = sqrt(3/in),
// quantised per 128×128 block with scale = amax/448 (the convention of DeepSeek's FP8 conversion);
// writes `<name>.weight` F8_E4M3 and `<name>.weight_scale_inv` F32 [ceil(out/128), ceil(in/128)].
inline void fp8_block_linear(Writer& w, const std::string& name, int64_t out, int64_t in, uint64_t seed) {
  const int64_t B = 128, rb = (out + B - 1) / B, cb = (in + B - 1) / B;
  const float a = std::sqrt(3.0f / static_cast<float>(in));
  Rng r(name_seed(seed, name + ".weight"));
  std::vector<float> v(static_cast<size_t>(out * in));
  for (auto& x : v) x = a * r.sym();
  Rng g(name_seed(seed, name + ".gain"));
  std::vector<float> scale(static_cast<size_t>(rb * cb));
  TensorToWrite q{name + ".weight", DType::kF8E4M3, {out, in}, std::vector<uint8_t>(static_cast<size_t>(out * in))};
  for (int64_t bi = 0; bi < rb; ++bi)
    for (int64_t bj = 0; bj < cb; ++bj) {
      const float gain = 0.5f + g.uniform();
      float amax = 0;
      for (int64_t i = bi * B; i < std::min(out, (bi + 1) * B); ++i)
        for (int64_t j = bj * B; j < std::min(in, (bj + 1) * B); ++j) {
          float& x = v[static_cast<size_t>(i * in + j)];
          x *= gain;
          amax = std::max(amax, std::fabs(x));
        }
      const float s = std::max(amax, 1e-12f) / 448.0f;
      scale[static_cast<size_t>(bi * cb + bj)] = s;
      for (int64_t i = bi * B; i < std::min(out, (bi + 1) * B); ++i)
        for (int64_t j = bj * B; j < std::min(in, (bj + 1) * B); ++j)
          q.bytes[static_cast<size_t>(i * in + j)] = f32_to_e4m3(v[static_cast<size_t>(i * in + j)] / s);
    }
  w.tensors.push_back(std::move(q));
  TensorToWrite st{name + ".weight_scale_inv", DType::kF32, {rb, cb}, std::vector<uint8_t>(scale.size() * 4)};
  std::memcpy(st.bytes.data(), scale.data(), st.bytes.size());
  w.tensors.push_back(std::move(st));
}

// Shards: contiguous runs of tensors, balanced by bytes; plus model.safetensors.index.json.
inline Status write_shards(std::vector<TensorToWrite>& tensors, int num_shards, const std::string& dir,
                           Progress* progress = nullptr) {
  // Shards: contiguous runs of tensors, balanced by bytes.
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.bytes.size();
  if (progress) progress->restart("writing " + dir, total, tensors.size());
  const int shards = std::max(1, num_shards);
  json weight_map = json::object();
  std::vector<TensorToWrite> cur;
  uint64_t acc = 0;
  int idx = 0;
  auto shard_name = [&](int i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i + 1, shards);
    return std::string(buf);
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    acc += tensors[i].bytes.size();
    weight_map[tensors[i].name] = shard_name(idx);
    cur.push_back(std::move(tensors[i]));
    const bool last = i + 1 == tensors.size();
    if (last || (idx + 1 < shards && acc >= total * static_cast<uint64_t>(idx + 1) / static_cast<uint64_t>(shards))) {
      KESTREL_RETURN_IF_ERROR(write_safetensors((fs::path(dir) / shard_name(idx)).string(), cur, {{"format", "pt"}}));
      cur.clear();
      if (progress) progress->set(acc, i + 1);
      ++idx;
    }
  }
  if (idx != shards) return io_error("internal: shard count mismatch");
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream(fs::path(dir) / "model.safetensors.index.json") << index.dump(2) << "\n";

  return Status::ok();
}

}  // namespace kestrel::gen_detail

namespace kestrel {
// deepseek_checkpoint.cpp: spec.arch "deepseek_v3" / "deepseek_v32".
Status generate_deepseek_checkpoint(const GenSpec& spec, const std::string& dir, Progress* progress);
// qwen3_checkpoint.cpp: spec.arch "qwen3_moe".
Status generate_qwen3_moe_checkpoint(const GenSpec& spec, const std::string& dir, Progress* progress);
Status generate_gpt_oss_checkpoint(const GenSpec& spec, const std::string& dir, Progress* progress);
}  // namespace kestrel
