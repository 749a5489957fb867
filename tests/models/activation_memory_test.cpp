// The activation memory of a prefill chunk does not grow with the number of layers: the temporaries of a
// layer call (KDA projections and activations, MoE router logits, expert rows and outputs, the fused path's
// quantized rows, dense MLP rows) are shared by the layers of a kind on the calling thread
// (layers/shared_temps.h), where each layer used to hold its own set sized by the largest chunk it saw.
//
// Two K3-tiny checkpoints that differ only in depth (4 and 12 layers: 3 and 11 KDA layers and one MLA
// layer each, with K3-tiny's MoE blocks) prefill the same 256-token chunk, each on a fresh thread (so each starts
// without temporaries). The live heap is tracked through every operator new / delete form in this binary;
// the growth of its peak over the prefill is compared. Measured (2 vCPUs, AMD EPYC Zen 3): with a set of
// temporaries per layer, 22.1 MB for 4 layers and 61.8 MB for 12 (about 5 MB per KDA + MoE layer); shared,
// 12.4 MB and 13.0 MB. The bound is 1 MiB for the 8 extra layers: what remains per layer is bookkeeping
// (task lists, routing ids and weights, tokens per expert), and the MLA layer count is the same in both.
// The weights, KV pages and recurrent states are allocated before the measured window or scale with the
// sequence, not with a call's temporaries.
#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <numeric>
#include <thread>

#include "common/live_heap.h"
#include "common/test_util.h"
#include "runtime/engine.h"

namespace {
using kestrel::test::g_live;
using kestrel::test::g_peak;
using kestrel::test::track;
void* counted(void* p) {
  if (!p) throw std::bad_alloc();
  track(static_cast<int64_t>(malloc_usable_size(p)));
  return p;
}
void release(void* p) {
  if (p) track(-static_cast<int64_t>(malloc_usable_size(p)));
  std::free(p);
}
size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
}  // namespace

void* operator new(std::size_t n) { return counted(std::malloc(n ? n : 1)); }
void* operator new[](std::size_t n) { return counted(std::malloc(n ? n : 1)); }
void* operator new(std::size_t n, std::align_val_t a) {
  const auto al = static_cast<size_t>(a);
  return counted(std::aligned_alloc(al, round_up(n ? n : 1, al)));
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }
void operator delete(void* p, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { release(p); }

namespace kestrel {
namespace {

// Peak live-heap growth over one prefill of `T` tokens on a fresh thread, for a K3-tiny of `layers` layers
// (the last one MLA, the rest KDA).
int64_t prefill_growth(int layers, int64_t T) {
  testing::TempDir tmp;
  testing::make_checkpoint("k3-tiny", tmp.path(), [&](GenSpec& s) {
    s.layers = layers;
    s.full_attn_layers = {layers};
  });
  auto e = Engine::load(tmp.path());
  EXPECT_TRUE(e) << e.error().message();
  if (!e) return -1;
  const int64_t vocab = (*e)->config().text.vocab_size;
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37 + 11) % vocab);
  int64_t growth = -1;
  std::thread worker([&] {
    SequenceState s = (*e)->new_sequence();
    const int64_t base = g_live.load();
    g_peak.store(base);
    auto r = (*e)->prefill(s, ids, /*chunk=*/T, /*all_logits=*/false, ForwardOptions{});
    EXPECT_TRUE(r) << (r ? "" : r.error().message());
    growth = g_peak.load() - base;
  });
  worker.join();
  return growth;
}

TEST(ActivationMemory, PrefillTemporariesDoNotGrowWithTheNumberOfLayers) {
  const int64_t T = 256;
  const int64_t shallow = prefill_growth(4, T), deep = prefill_growth(12, T);
  ASSERT_GT(shallow, 0);
  std::printf("peak live-heap growth over a %lld-token prefill: 4 layers %lld B, 12 layers %lld B\n",
              static_cast<long long>(T), static_cast<long long>(shallow), static_cast<long long>(deep));
  EXPECT_LT(deep - shallow, int64_t{1} << 20) << "8 more KDA + MoE layers added their own temporaries";
}

}  // namespace
}  // namespace kestrel
