// Small fp32 products for the KDA chunked kernel (kda_chunked.cpp), register-tiled at the vector width of
// kda_vec.h. Any sizes are accepted (columns, or the reduction length of gram_nt, that do not fill a vector are
// done by a scalar tail); the chunk kernel pads its rows to whole vectors so the tails are not taken there.
// Deterministic: the same arguments give the same bits (no threads, no dependence on buffer alignment).
#pragma once

#include <cstdint>

namespace kestrel::kernels::kda {

// C[M×N] += A·B, with A(i, p) = A[i·a_rs + p·a_ps] (a_rs = lda, a_ps = 1 for row-major A; a_rs = 1, a_ps = lda for
// Aᵀ stored row-major), B row-major [Kd×N] (leading dimension ldb), C row-major (ldc). Each element is one chain
// c ← c + a·b over p = 0, 1, …, Kd−1.
void gemm_acc(int64_t M, int64_t N, int64_t Kd, const float* A, int64_t a_rs, int64_t a_ps, const float* B,
              int64_t ldb, float* C, int64_t ldc);

// G[i][j] = Σ_p A[i][p]·B[j][p] for i < M, j < N, p < Kd (A·Bᵀ, both row-major; leading dims lda, ldb, ldg).
void gram_nt(int64_t M, int64_t N, int64_t Kd, const float* A, int64_t lda, const float* B, int64_t ldb, float* G,
             int64_t ldg);

}  // namespace kestrel::kernels::kda
