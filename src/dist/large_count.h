// Splitting transfers whose byte counts exceed what one MPI call accepts.
//
// MPI-3 calls take `int` counts and displacements, so one call moves at most INT_MAX elements. MPI 4.0 adds
// MPI_Count variants (MPI_Bcast_c, ...), but Debian 12's Open MPI 4.1.4 does not have them, so the MPI backend
// moves a larger block as consecutive pieces of at most `limit` bytes. Both ends derive the pieces from the
// same byte count and the same limit, so they agree on the split without exchanging anything.
// Pure functions, so they are tested without MPI; the MPI tests lower the limit to a few bytes to run the
// piecewise paths for real.
#pragma once

#include <cstddef>
#include <span>

namespace kestrel::dist {

struct Piece {
  size_t offset = 0;
  size_t bytes = 0;
};

// Number of pieces of at most `limit` bytes (limit > 0) that cover `bytes`: 0 for an empty block.
inline size_t piece_count(size_t bytes, size_t limit) { return bytes / limit + (bytes % limit != 0 ? 1 : 0); }

// The i-th piece (i < piece_count): every piece is `limit` bytes except a shorter last one.
inline Piece piece(size_t bytes, size_t limit, size_t i) {
  const size_t offset = i * limit;
  const size_t left = bytes - offset;
  return {offset, left < limit ? left : limit};
}

// True if every value fits one MPI call's count / displacement argument.
inline bool all_fit(std::span<const size_t> values, size_t limit) {
  for (size_t v : values)
    if (v > limit) return false;
  return true;
}

}  // namespace kestrel::dist
