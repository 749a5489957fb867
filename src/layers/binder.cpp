#include "layers/binder.h"

#include <cstring>

#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/linear_fp8.h"

namespace kestrel {

namespace {
const std::vector<DType> kFloat = {DType::kF32, DType::kBF16, DType::kF16};

kernels::WeightFormat format_of(DType d) {
  switch (d) {
    case DType::kBF16: return kernels::WeightFormat::kBF16;
    case DType::kF16: return kernels::WeightFormat::kF16;
    default: return kernels::WeightFormat::kF32;
  }
}

// A tensor-parallel slice [b0, b1) of a dimension of n must start on a block and end on one or at n.
Status check_cut(const std::string& name, int64_t n, int64_t block, int64_t b0, int64_t b1) {
  if (b0 < 0 || b0 > b1 || b1 > n || b0 % block != 0 || (b1 % block != 0 && b1 != n))
    return invalid_argument("tensor '" + name + "': slice [" + std::to_string(b0) + ", " + std::to_string(b1) +
                            ") of " + std::to_string(n) + " is not on its " + std::to_string(block) + "-wide blocks");
  return Status::ok();
}

// Bytes per element of a stored [out, in] tensor, from its header (0 when absent: get_part then names it).
int64_t element_bytes(const Checkpoint& ck, const std::string& name, int64_t out, int64_t in) {
  return out * in > 0 ? static_cast<int64_t>(ck.tensor_bytes(name)) / (out * in) : 0;
}
}  // namespace

kernels::WeightMatrix Binder::linear(const std::string& name, int64_t out, int64_t in) {
  kernels::WeightMatrix w;
  w.out = out;
  w.in = in;
  if (!ok()) return w;
  if (gguf_ != nullptr) {
    auto g = gguf_->linear(name, out, in);  // block formats: in % 32 == 0 holds (parser checks ne[0])
    if (!g) return fail(g.error()), w;
    return *g;
  }
  Checkpoint& ck = *ckpt_;
  const std::string packed = name + ".weight_packed";
  if (ck.contains(packed)) {
    auto any = ck.get(packed, {DType::kU8, DType::kI32}, {});
    if (!any) return fail(any.error()), w;
    if (any->dtype == DType::kI32) return int4_linear(ck, name, out, in);
    if (in % 32 != 0) {
      fail(corrupt(ck.file_of(packed) + ": tensor '" + packed + "': MXFP4 input dim " + std::to_string(in) +
                   " is not a multiple of 32"));
      return w;
    }
    auto p = ck.get(packed, {DType::kU8}, {out, in / 2});
    if (!p) return fail(p.error()), w;
    auto s = ck.get(name + ".weight_scale", {DType::kU8}, {out, in / 32});
    if (!s) return fail(s.error()), w;
    w.format = kernels::WeightFormat::kMxfp4;
    w.data = p->data;
    w.scales = static_cast<const uint8_t*>(s->data);
    return w;
  }
  const std::string scale_inv = name + ".weight_scale_inv";
  if (ck.contains(scale_inv)) {  // DeepSeek FP8: e4m3 weight + fp32 scale per 128×128 block
    auto q = ck.get(name + ".weight", {DType::kF8E4M3}, {out, in});
    if (!q) return fail(q.error()), w;
    auto s = ck.get(scale_inv, {DType::kF32}, {kernels::fp8_blocks(out), kernels::fp8_blocks(in)});
    if (!s) return fail(s.error()), w;
    w.format = kernels::WeightFormat::kFp8Block;
    w.data = q->data;
    w.scales = static_cast<const uint8_t*>(s->data);
    return w;
  }
  auto t = ck.get(name + ".weight", kFloat, {out, in});
  if (!t) return fail(t.error()), w;
  w.format = format_of(t->dtype);
  w.data = t->data;
  w.act_bf16 = w.format == kernels::WeightFormat::kBF16 && kernels::bf16_acts_opt_in();
  return w;
}

kernels::WeightMatrix Binder::flattened(const std::string& name, const std::vector<int64_t>& shape) {
  kernels::WeightMatrix w;
  w.out = shape.empty() ? 0 : shape[0];
  w.in = 1;
  for (size_t i = 1; i < shape.size(); ++i) w.in *= shape[i];
  if (!ok()) return w;
  if (gguf_ != nullptr) return fail(unsupported("'" + name + ".weight': flattened weights are read from safetensors only")), w;
  auto t = ckpt_->get(name + ".weight", kFloat, shape);
  if (!t) return fail(t.error()), w;
  w.format = format_of(t->dtype);
  w.data = t->data;
  return w;
}

kernels::WeightMatrix Binder::int4_linear(Checkpoint& ck, const std::string& name, int64_t out, int64_t in) {
  kernels::WeightMatrix w;
  w.out = out;
  w.in = in;
  const std::string packed = name + ".weight_packed";
  const std::string where = ck.file_of(packed) + ": tensor '" + packed + "': ";
  const int64_t G = int4_group_;
  if (G == 0)
    return fail(corrupt(where + "int4 pack-quantized weight, but config.json declares no pack-quantized group")), w;
  if (in % G != 0)
    return fail(corrupt(where + "input dim " + std::to_string(in) + " is not a multiple of group size " +
                        std::to_string(G))), w;
  auto p = ck.get(packed, {DType::kI32}, {out, in / 8});
  if (!p) return fail(p.error()), w;
  auto s = ck.get(name + ".weight_scale", {DType::kBF16}, {out, in / G});
  if (!s) return fail(s.error()), w;
  auto shape = ck.get(name + ".weight_shape", {DType::kI64, DType::kI32}, {2});
  if (!shape) return fail(shape.error()), w;
  int64_t dims[2];
  for (int i = 0; i < 2; ++i) {
    if (shape->dtype == DType::kI64) {
      std::memcpy(&dims[i], static_cast<const uint8_t*>(shape->data) + 8 * i, 8);
    } else {
      int32_t v;
      std::memcpy(&v, static_cast<const uint8_t*>(shape->data) + 4 * i, 4);
      dims[i] = v;
    }
  }
  if (dims[0] != out || dims[1] != in)
    return fail(corrupt(ck.file_of(packed) + ": tensor '" + name + ".weight_shape' is [" + std::to_string(dims[0]) +
                        ", " + std::to_string(dims[1]) + "], expected [" + std::to_string(out) + ", " +
                        std::to_string(in) + "]")), w;
  w.format = kernels::WeightFormat::kW4A8;
  w.data = p->data;
  w.scales = static_cast<const uint8_t*>(s->data);
  w.group = G;
  return w;
}

void Binder::skip_linear(const std::string& name) {
  if (!ok()) return;
  if (gguf_ != nullptr) return fail(unsupported(gguf_->path() + ": expert parallelism needs a safetensors checkpoint "
                                                "(a GGUF file stacks a layer's experts in one tensor)"));
  bool any = false;
  for (const char* suffix : {".weight", ".weight_packed", ".weight_scale", ".weight_scale_inv", ".weight_shape"}) {
    if (!ckpt_->contains(name + suffix)) continue;
    any = true;
    if (Status s = ckpt_->expect(name + suffix, {}, {}); !s.is_ok()) return fail(s);
  }
  if (!any) fail(not_found(ckpt_->dir() + ": missing tensor '" + name + ".weight'"));
}

int64_t Binder::tp_block(const std::string& name) {
  if (!ok()) return 0;
  if (gguf_ != nullptr)
    return fail(unsupported(gguf_->path() + ": tensor parallelism needs a safetensors checkpoint")), 0;
  if (ckpt_->contains(name + ".weight_packed"))
    return fail(unsupported(ckpt_->file_of(name + ".weight_packed") + ": tensor '" + name +
                            "': tensor parallelism slices F32 / BF16 / F16 and FP8-block weights, not MXFP4 or "
                            "int4 pack-quantized ones")), 0;
  return ckpt_->contains(name + ".weight_scale_inv") ? kernels::kFp8Block : 1;
}

kernels::WeightMatrix Binder::linear_rows(const std::string& name, int64_t out, int64_t in, int64_t r0, int64_t r1) {
  kernels::WeightMatrix w;
  w.out = r1 - r0;
  w.in = in;
  const int64_t block = tp_block(name);
  if (ok()) fail(check_cut(name, out, block, r0, r1));
  if (!ok()) return w;
  Checkpoint& ck = *ckpt_;
  if (block == kernels::kFp8Block) {
    auto q = ck.get_part(name + ".weight", {DType::kF8E4M3}, {out, in}, static_cast<uint64_t>(w.out * in));
    if (!q) return fail(q.error()), w;
    const int64_t kb = kernels::fp8_blocks(in), s0 = r0 / block, s1 = r1 > r0 ? kernels::fp8_blocks(r1) : s0;
    auto s = ck.get_part(name + ".weight_scale_inv", {DType::kF32}, {kernels::fp8_blocks(out), kb},
                         static_cast<uint64_t>((s1 - s0) * kb) * sizeof(float));
    if (!s) return fail(s.error()), w;
    w.format = kernels::WeightFormat::kFp8Block;
    w.data = static_cast<const uint8_t*>(q->data) + r0 * in;
    w.scales = static_cast<const uint8_t*>(s->data) + static_cast<size_t>(s0 * kb) * sizeof(float);
    return w;
  }
  const int64_t esz = element_bytes(ck, name + ".weight", out, in);
  auto t = ck.get_part(name + ".weight", kFloat, {out, in}, static_cast<uint64_t>(w.out * in * esz));
  if (!t) return fail(t.error()), w;
  w.format = format_of(t->dtype);
  w.data = static_cast<const uint8_t*>(t->data) + r0 * in * esz;
  w.act_bf16 = w.format == kernels::WeightFormat::kBF16 && kernels::bf16_acts_opt_in();
  return w;
}

kernels::WeightMatrix Binder::linear_cols(const std::string& name, int64_t out, int64_t in, int64_t c0, int64_t c1,
                                          std::vector<uint64_t>& store) {
  kernels::WeightMatrix w;
  w.out = out;
  w.in = c1 - c0;
  const int64_t block = tp_block(name);
  if (ok()) fail(check_cut(name, in, block, c0, c1));
  if (!ok()) return w;
  Checkpoint& ck = *ckpt_;
  auto copy_cols = [&](const uint8_t* src, int64_t rows, int64_t row_bytes, int64_t b0, int64_t b1, uint8_t* dst) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * (b1 - b0), src + r * row_bytes + b0, static_cast<size_t>(b1 - b0));
  };
  auto words = [](int64_t bytes) { return static_cast<size_t>((bytes + 7) / 8); };
  if (block == kernels::kFp8Block) {
    const int64_t ob = kernels::fp8_blocks(out), kb = kernels::fp8_blocks(in);
    const int64_t s0 = c0 / block, s1 = c1 > c0 ? kernels::fp8_blocks(c1) : s0;
    const int64_t qbytes = out * w.in, sbytes = ob * (s1 - s0) * static_cast<int64_t>(sizeof(float));
    auto q = ck.get_part(name + ".weight", {DType::kF8E4M3}, {out, in}, static_cast<uint64_t>(qbytes));
    if (!q) return fail(q.error()), w;
    auto s = ck.get_part(name + ".weight_scale_inv", {DType::kF32}, {ob, kb}, static_cast<uint64_t>(sbytes));
    if (!s) return fail(s.error()), w;
    store.assign(words(qbytes) + words(sbytes), 0);
    auto* dst = reinterpret_cast<uint8_t*>(store.data());
    copy_cols(static_cast<const uint8_t*>(q->data), out, in, c0, c1, dst);
    uint8_t* sdst = dst + words(qbytes) * 8;
    copy_cols(static_cast<const uint8_t*>(s->data), ob, kb * 4, s0 * 4, s1 * 4, sdst);
    w.format = kernels::WeightFormat::kFp8Block;
    w.data = dst;
    w.scales = sdst;
    return w;
  }
  const int64_t esz = element_bytes(ck, name + ".weight", out, in);
  auto t = ck.get_part(name + ".weight", kFloat, {out, in}, static_cast<uint64_t>(out * w.in * esz));
  if (!t) return fail(t.error()), w;
  store.assign(words(out * w.in * esz), 0);
  copy_cols(static_cast<const uint8_t*>(t->data), out, in * esz, c0 * esz, c1 * esz, reinterpret_cast<uint8_t*>(store.data()));
  w.format = format_of(t->dtype);
  w.data = store.data();
  w.act_bf16 = w.format == kernels::WeightFormat::kBF16 && kernels::bf16_acts_opt_in();
  return w;
}

std::vector<float> Binder::vec(const std::string& name, const std::vector<int64_t>& shape) {
  if (!ok()) return {};
  auto t = get(name, shape);
  if (!t) return fail(t.error()), std::vector<float>{};
  return to_f32(*t);
}

std::vector<float> Binder::vec_any(const std::string& name, const std::vector<std::vector<int64_t>>& shapes) {
  if (!ok()) return {};
  auto any = get(name, {});
  if (!any) return fail(any.error()), std::vector<float>{};
  for (const auto& s : shapes)
    if (any->shape == s) return to_f32(*any);
  std::string want;
  for (const auto& s : shapes) want += (want.empty() ? "" : " or ") + shape_str(s);
  fail(corrupt(file_of(name) + ": tensor '" + name + "' has shape " + shape_str(any->shape) +
               ", expected " + want));
  return {};
}

Result<TensorView> Binder::get(const std::string& name, const std::vector<int64_t>& shape) {
  if (gguf_ != nullptr) return gguf_->get(name, shape);
  return ckpt_->get(name, kFloat, shape);
}

std::string Binder::file_of(const std::string& name) const {
  return gguf_ != nullptr ? gguf_->path() : ckpt_->file_of(name);
}

}  // namespace kestrel
