// The deterministic reductions shared by every backend (see communicator.h for the ordering rule).
#include "dist/communicator.h"

#include <cstring>

namespace kestrel::dist {
namespace {

// out[i] = ((b_0[i] + b_1[i]) + ...) + b_{N-1}[i], where b_r = blocks + r·stride. The rank loop is outside so
// the inner loop vectorises, yet each element still sees its addends in rank order. Starting from b_0 (not
// 0.0f) keeps -0.0 contributions exact: the serial reference is x_0 + x_1 + ..., never 0 + x_0 + ....
void sum_rank_order(const float* blocks, size_t stride, int nranks, float* out, size_t n) {
  if (out != blocks) std::memcpy(out, blocks, n * sizeof(float));
  for (int r = 1; r < nranks; ++r) {
    const float* b = blocks + static_cast<size_t>(r) * stride;
    for (size_t i = 0; i < n; ++i) out[i] += b[i];
  }
}

}  // namespace

Status to_bytes(std::span<const size_t> elems, size_t elem_size, std::vector<size_t>& bytes) {
  bytes.resize(elems.size());
  for (size_t i = 0; i < elems.size(); ++i) {
    if (elems[i] > std::numeric_limits<size_t>::max() / elem_size)
      return invalid_argument("dist: element count " + std::to_string(elems[i]) + " overflows a byte count");
    bytes[i] = elems[i] * elem_size;
  }
  return Status::ok();
}

Status check_layout(std::span<const size_t> counts, std::span<const size_t> displs, size_t buffer_bytes, int nranks,
                    const char* what) {
  if (counts.size() != static_cast<size_t>(nranks) || displs.size() != static_cast<size_t>(nranks))
    return invalid_argument(std::string("dist: ") + what + ": " + std::to_string(counts.size()) + " counts and " +
                            std::to_string(displs.size()) + " displacements for " + std::to_string(nranks) +
                            " ranks");
  for (int r = 0; r < nranks; ++r) {
    if (displs[r] > buffer_bytes || counts[r] > buffer_bytes - displs[r])
      return invalid_argument(std::string("dist: ") + what + ": block of rank " + std::to_string(r) + " [" +
                              std::to_string(displs[r]) + ", +" + std::to_string(counts[r]) +
                              ") is outside the buffer of " + std::to_string(buffer_bytes) + " bytes");
  }
  return Status::ok();
}

Status Communicator::check_counts(std::span<const size_t> counts, const char* what) const {
  if (counts.size() != static_cast<size_t>(size()))
    return invalid_argument(std::string("dist: ") + what + ": " + std::to_string(counts.size()) + " counts for " +
                            std::to_string(size()) + " ranks");
  return Status::ok();
}

Status Communicator::all_reduce_sum(std::span<float> data) {
  const int nranks = size();
  const size_t n = data.size();
  // Sizes match on every rank (the calling contract), so all ranks take the same early return.
  if (nranks == 1 || n == 0) return Status::ok();
  if (n <= kAllReduceGatherMaxFloats) {
    // Gather every rank's vector, then add them locally in rank order.
    scratch_.resize(n * static_cast<size_t>(nranks));
    scratch_counts_.resize(2 * static_cast<size_t>(nranks));
    std::span<size_t> counts(scratch_counts_.data(), nranks), displs(scratch_counts_.data() + nranks, nranks);
    for (int r = 0; r < nranks; ++r) {
      counts[r] = n * sizeof(float);
      displs[r] = static_cast<size_t>(r) * n * sizeof(float);
    }
    KESTREL_RETURN_IF_ERROR(all_gather_v_bytes(std::as_bytes(std::span<const float>(data)),
                                               std::as_writable_bytes(std::span<float>(scratch_)), counts, displs));
    sum_rank_order(scratch_.data(), n, nranks, data.data(), n);
    return Status::ok();
  }
  // Reduce-scatter into block `rank` of near-equal blocks, then all_gather the summed blocks.
  const size_t base = n / nranks, extra = n % nranks;
  scratch_counts_.resize(4 * static_cast<size_t>(nranks));
  std::span<size_t> sc(scratch_counts_.data(), nranks), sd(scratch_counts_.data() + nranks, nranks),
      rc(scratch_counts_.data() + 2 * nranks, nranks), rd(scratch_counts_.data() + 3 * nranks, nranks);
  const int me = rank();
  size_t at = 0;
  for (int r = 0; r < nranks; ++r) {
    const size_t len = base + (static_cast<size_t>(r) < extra ? 1 : 0);
    sc[r] = len * sizeof(float);
    sd[r] = at * sizeof(float);
    at += len;
  }
  const size_t mine = sc[me] / sizeof(float);
  for (int r = 0; r < nranks; ++r) {
    rc[r] = mine * sizeof(float);
    rd[r] = static_cast<size_t>(r) * mine * sizeof(float);
  }
  // scratch: N received copies of my block, then my summed block (the all_gather's send buffer: MPI forbids a
  // send buffer that overlaps the receive buffer).
  scratch_.resize(mine * static_cast<size_t>(nranks + 1));
  KESTREL_RETURN_IF_ERROR(all_to_all_v_bytes(std::as_bytes(std::span<const float>(data)), sc, sd,
                                             std::as_writable_bytes(std::span<float>(scratch_)), rc, rd));
  float* summed = scratch_.data() + mine * static_cast<size_t>(nranks);
  sum_rank_order(scratch_.data(), mine, nranks, summed, mine);
  return all_gather_v_bytes(std::as_bytes(std::span<const float>(summed, mine)),
                            std::as_writable_bytes(std::span<float>(data)), sc, sd);
}

Status Communicator::reduce_scatter_sum(std::span<const float> send, std::span<float> recv,
                                        std::span<const size_t> counts) {
  KESTREL_RETURN_IF_ERROR(check_counts(counts, "reduce_scatter_sum"));
  const int nranks = size();
  const int me = rank();
  size_t total = 0;
  for (size_t c : counts) total += c;
  if (send.size() != total)
    return invalid_argument("dist: reduce_scatter_sum: send holds " + std::to_string(send.size()) +
                            " floats, the counts add up to " + std::to_string(total));
  if (recv.size() != counts[me])
    return invalid_argument("dist: reduce_scatter_sum: recv holds " + std::to_string(recv.size()) +
                            " floats, rank " + std::to_string(me) + "'s count is " + std::to_string(counts[me]));
  scratch_counts_.resize(4 * static_cast<size_t>(nranks));
  std::span<size_t> sc(scratch_counts_.data(), nranks), sd(scratch_counts_.data() + nranks, nranks),
      rc(scratch_counts_.data() + 2 * nranks, nranks), rd(scratch_counts_.data() + 3 * nranks, nranks);
  size_t at = 0;
  for (int r = 0; r < nranks; ++r) {
    sc[r] = counts[r] * sizeof(float);
    sd[r] = at * sizeof(float);
    at += counts[r];
  }
  const size_t mine = counts[me];
  for (int r = 0; r < nranks; ++r) {
    rc[r] = mine * sizeof(float);
    rd[r] = static_cast<size_t>(r) * mine * sizeof(float);
  }
  scratch_.resize(mine * static_cast<size_t>(nranks));
  KESTREL_RETURN_IF_ERROR(all_to_all_v_bytes(std::as_bytes(send), sc, sd,
                                             std::as_writable_bytes(std::span<float>(scratch_)), rc, rd));
  if (mine > 0) sum_rank_order(scratch_.data(), mine, nranks, recv.data(), mine);
  return Status::ok();
}

}  // namespace kestrel::dist
