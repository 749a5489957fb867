// Bidirectional softmax attention of one head over one sequence in key tiles with an online softmax (the vision
// tower's attention, docs/vision.md §5.4): the keys and values are packed once per head, then each block of query
// rows walks the keys kKeyTile at a time, so its score tile (rows × kKeyTile) stays in L2 instead of a whole
// rows × n score block. AVX-512 register-blocked products (12 query rows × 32 keys for the scores, 6 rows × 64
// value columns for P·V), libmvec's 16-lane expf; with AVX2 + FMA only, 6 rows × 16 keys and 6 rows × 16 value
// columns, libmvec's 8-lane expf; a scalar version of the same tile order elsewhere.
// Arithmetic: an output element is a fixed-order function of its query row and of the keys and values alone — no
// dependence on the other rows of its block, on the block size or on threads — so an image's rows are the same bits
// alone or in any batch, and run to run.
#pragma once

#include <cstdint>

namespace kestrel::kernels {

inline constexpr int64_t kKeyPanel = 32;  // keys per packed key panel (two 16-lane vectors)
inline constexpr int64_t kKeyTile = 512;  // keys per online-softmax step

// Width of a packed value row: the head width rounded up to 16 floats.
inline int64_t packed_head_width(int64_t hd) { return (hd + 15) / 16 * 16; }

// Floats pack_keys_values writes for n keys of width hd (keys and values together).
int64_t packed_kv_floats(int64_t n, int64_t hd);

// Packs one head: keys k[j·ld + d] transposed into panels of kKeyPanel keys ([panel][d][kKeyPanel], zeros past n),
// then values v[j·ld + d] as rows of packed_head_width(hd) floats (zeros past hd). `packed` must be 64-byte aligned.
void pack_keys_values(const float* k, const float* v, int64_t ld, int64_t n, int64_t hd, float* packed);

// out[i·ldo + d] = Σ_j softmax_j(scale · q_i · k_j) v_j[d] for the B query rows q[i·ldq + d], over the n keys and
// values packed by pack_keys_values.
void attend_rows(const float* q, int64_t ldq, int64_t B, const float* packed, int64_t n, int64_t hd, float scale,
                 float* out, int64_t ldo);

}  // namespace kestrel::kernels
