#include "collective_checks.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace kestrel::dist::testing {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Rank r's i-th input: signed values spread over 20 binades, so the order of an fp32 sum changes its bits.
float value(int rank, size_t i, uint64_t seed) {
  const uint64_t h = mix(seed * 0x100000001b3ULL ^ (static_cast<uint64_t>(rank) << 40) ^ i);
  const int mantissa = static_cast<int>(h & 0xfffff) - 0x80000;
  const int exponent = static_cast<int>((h >> 20) % 20) - 30;
  return std::ldexp(static_cast<float>(mantissa), exponent);
}

std::vector<float> inputs(int rank, size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = value(rank, i, seed);
  return v;
}

// The definition of the result: x_0 + x_1 + ... + x_{N-1}, left to right.
std::vector<float> serial_sum(int nranks, size_t n, uint64_t seed, size_t first = 0) {
  std::vector<float> s(n);
  for (size_t i = 0; i < n; ++i) {
    float acc = value(0, first + i, seed);
    for (int r = 1; r < nranks; ++r) acc += value(r, first + i, seed);
    s[i] = acc;
  }
  return s;
}

size_t bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]);
  return bad;
}

uint32_t code(int src, int dst, size_t k) {
  return (static_cast<uint32_t>(src) << 24) | (static_cast<uint32_t>(dst) << 16) | static_cast<uint32_t>(k);
}

constexpr uint32_t kSentinel = 0xdeadbeef;

}  // namespace

void check_all_reduce_matches_serial(Communicator& comm) {
  const int n_ranks = comm.size(), me = comm.rank();
  // Both sides of the gather / reduce-scatter switch, odd sizes, sizes not divisible by the rank count.
  for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{31}, size_t{1000},
                   Communicator::kAllReduceGatherMaxFloats, Communicator::kAllReduceGatherMaxFloats + 1,
                   size_t{5003}, size_t{65537}}) {
    std::vector<float> data = inputs(me, n, n);
    ASSERT_TRUE(comm.all_reduce_sum(data).is_ok()) << "n=" << n;
    EXPECT_EQ(bit_mismatches(data, serial_sum(n_ranks, n, n)), 0u) << "rank " << me << " n=" << n;
  }
  // The inputs are order-sensitive: the reverse rank order gives other bits, so the check above can fail.
  if (n_ranks >= 3) {
    const size_t n = 65537;
    std::vector<float> reversed(n);
    for (size_t i = 0; i < n; ++i) {
      float acc = value(n_ranks - 1, i, n);
      for (int r = n_ranks - 2; r >= 0; --r) acc += value(r, i, n);
      reversed[i] = acc;
    }
    EXPECT_GT(bit_mismatches(reversed, serial_sum(n_ranks, n, n)), 0u);
  }
}

void check_all_reduce_reproducible(Communicator& comm) {
  for (size_t n : {size_t{1000}, size_t{40001}}) {
    const std::vector<float> expected = serial_sum(comm.size(), n, 77);
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<float> data = inputs(comm.rank(), n, 77);
      ASSERT_TRUE(comm.all_reduce_sum(data).is_ok());
      EXPECT_EQ(bit_mismatches(data, expected), 0u) << "rank " << comm.rank() << " n=" << n << " rep " << rep;
    }
  }
}

void check_reduce_scatter(Communicator& comm) {
  const int n_ranks = comm.size(), me = comm.rank();
  std::vector<size_t> counts(n_ranks);
  for (int r = 0; r < n_ranks; ++r) counts[r] = std::vector<size_t>{5, 0, 9, 1}[r % 4] + (r % 4 == 1 ? 0 : r);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const std::vector<float> send = inputs(me, total, 5);
  std::vector<float> recv(counts[me], -1.0f);
  ASSERT_TRUE(comm.reduce_scatter_sum(send, recv, counts).is_ok());
  const size_t first = std::accumulate(counts.begin(), counts.begin() + me, size_t{0});
  EXPECT_EQ(bit_mismatches(recv, serial_sum(n_ranks, counts[me], 5, first)), 0u) << "rank " << me;
}

void check_all_gather_v(Communicator& comm) {
  const int n_ranks = comm.size(), me = comm.rank();
  for (size_t scale : {size_t{1}, size_t{301}}) {
    std::vector<size_t> counts(n_ranks);
    for (int r = 0; r < n_ranks; ++r) counts[r] = std::vector<size_t>{3, 0, 1, 17}[r % 4] * scale;
    std::vector<uint32_t> send(counts[me]);
    for (size_t k = 0; k < send.size(); ++k) send[k] = code(me, 0, k);
    // Packed layout.
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    std::vector<uint32_t> packed(total, kSentinel);
    ASSERT_TRUE(comm.all_gather_v<uint32_t>(send, packed, counts).is_ok());
    size_t at = 0, bad = 0;
    for (int r = 0; r < n_ranks; ++r)
      for (size_t k = 0; k < counts[r]; ++k) bad += packed[at++] != code(r, 0, k);
    EXPECT_EQ(bad, 0u) << "packed, rank " << me << " scale " << scale;
    // Reversed order with a 2-element gap before each block: the gaps must stay untouched.
    std::vector<size_t> displs(n_ranks);
    at = 0;
    for (int r = n_ranks - 1; r >= 0; --r) {
      at += 2;
      displs[r] = at;
      at += counts[r];
    }
    std::vector<uint32_t> gapped(at, kSentinel);
    ASSERT_TRUE(comm.all_gather_v<uint32_t>(send, gapped, counts, displs).is_ok());
    std::vector<uint32_t> expected(at, kSentinel);
    for (int r = 0; r < n_ranks; ++r)
      for (size_t k = 0; k < counts[r]; ++k) expected[displs[r] + k] = code(r, 0, k);
    EXPECT_EQ(gapped, expected) << "gapped, rank " << me << " scale " << scale;
  }
}

void check_all_to_all_v(Communicator& comm) {
  const int n_ranks = comm.size(), me = comm.rank();
  for (size_t scale : {size_t{1}, size_t{97}}) {
    // Uneven, with empty messages (including some to self) and a rank count of 0 for some pairs.
    auto count = [&](int src, int dst) { return static_cast<size_t>((src * 3 + dst * 5 + 1) % 4) * scale; };
    std::vector<size_t> sc(n_ranks), sd(n_ranks), rc(n_ranks), rd(n_ranks);
    size_t at = 0;
    for (int p = 0; p < n_ranks; ++p) {
      sc[p] = count(me, p);
      sd[p] = at;
      at += sc[p];
    }
    std::vector<uint32_t> send(at);
    for (int p = 0; p < n_ranks; ++p)
      for (size_t k = 0; k < sc[p]; ++k) send[sd[p] + k] = code(me, p, k);
    // Receive blocks in reverse source order with one-element gaps.
    at = 0;
    for (int p = n_ranks - 1; p >= 0; --p) {
      rc[p] = count(p, me);
      rd[p] = ++at;
      at += rc[p];
    }
    std::vector<uint32_t> recv(at, kSentinel), expected(at, kSentinel);
    for (int p = 0; p < n_ranks; ++p)
      for (size_t k = 0; k < rc[p]; ++k) expected[rd[p] + k] = code(p, me, k);
    ASSERT_TRUE(comm.all_to_all_v<uint32_t>(send, sc, sd, recv, rc, rd).is_ok());
    EXPECT_EQ(recv, expected) << "rank " << me << " scale " << scale;
  }
  // Everything empty.
  std::vector<size_t> zeros(n_ranks, 0);
  std::vector<uint32_t> none;
  EXPECT_TRUE(comm.all_to_all_v<uint32_t>(none, zeros, zeros, none, zeros, zeros).is_ok());
}

void check_broadcast(Communicator& comm) {
  const int me = comm.rank();
  for (int root = 0; root < comm.size(); ++root) {
    for (size_t n : {size_t{0}, size_t{13}, size_t{10001}}) {
      const std::vector<float> from_root = inputs(root, n, 9);
      std::vector<float> data = me == root ? from_root : std::vector<float>(n, 0.0f);
      ASSERT_TRUE(comm.broadcast<float>(data, root).is_ok()) << "root " << root;
      EXPECT_EQ(bit_mismatches(data, from_root), 0u) << "rank " << me << " root " << root << " n=" << n;
    }
  }
}

void check_barrier_and_bad_arguments(Communicator& comm) {
  EXPECT_TRUE(comm.barrier().is_ok());
  // Wrong argument shapes on every rank: refused before any communication, the same way on every rank.
  std::vector<size_t> too_few(comm.size() - 1, 0);
  std::vector<uint32_t> buf(4);
  const Status st = comm.all_gather_v<uint32_t>(std::span<const uint32_t>(), buf, too_few, too_few);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  std::vector<size_t> counts(comm.size(), 1);
  std::vector<float> send(comm.size()), recv(2);
  const Status rs = comm.reduce_scatter_sum(send, recv, counts);
  EXPECT_EQ(rs.code(), StatusCode::kInvalidArgument) << rs.message();
  // Still usable afterwards.
  std::vector<float> one{1.0f};
  ASSERT_TRUE(comm.all_reduce_sum(one).is_ok());
  EXPECT_EQ(one[0], static_cast<float>(comm.size()));
  EXPECT_TRUE(comm.barrier().is_ok());
}

void check_all(Communicator& comm) {
  check_all_reduce_matches_serial(comm);
  check_all_reduce_reproducible(comm);
  check_reduce_scatter(comm);
  check_all_gather_v(comm);
  check_all_to_all_v(comm);
  check_broadcast(comm);
  check_barrier_and_bad_arguments(comm);
}

}  // namespace kestrel::dist::testing
