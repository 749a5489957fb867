#include "layers/vision_projector.h"

#include "kernels/cpu/blas_gemm.h"
#include "kernels/cpu/elementwise.h"

namespace kestrel {

Status VisionProjector::bind(Binder& b, const VisionConfig& v) {
  const int64_t merged = v.merged_width();
  fc0_ = b.linear("mm_projector.proj.0", merged, merged);
  fc2_ = b.linear("mm_projector.proj.2", v.text_hidden, merged);
  post_norm_ = b.vec("mm_projector.post_norm.weight", {v.text_hidden});
  eps_ = v.projector_ln_eps;
  return b.status();
}

void VisionProjector::forward(const float* merged, int64_t T, std::vector<float>& out) const {
  std::vector<float> h(static_cast<size_t>(T * fc0_.out));
  kernels::matmul_sgemm(fc0_, merged, T, h.data(), kernels::GemmEpilogue::kGeluErf);  // then nn.GELU()
  out.resize(static_cast<size_t>(T * fc2_.out));
  kernels::matmul_sgemm(fc2_, h.data(), T, out.data());
  kernels::rms_norm(out.data(), post_norm_.data(), T, fc2_.out, eps_, out.data());
}

}  // namespace kestrel
