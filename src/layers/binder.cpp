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
