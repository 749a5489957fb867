#include "app/quant_report.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/engine.h"

namespace kestrel::app {
namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Token ids below the special-token block (the last 256 ids in our checkpoints and the Kimi vocab).
std::vector<std::vector<int32_t>> make_prompts(const PromptSet& set, int vocab) {
  const int range = vocab > 512 ? vocab - 256 : std::max(1, vocab / 2);
  uint64_t s = set.seed;
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(set.prompts));
  for (auto& p : out)
    for (int i = 0; i < set.length; ++i) p.push_back(static_cast<int32_t>(splitmix64(s) % static_cast<uint64_t>(range)));
  return out;
}

// All positions' logits of every prompt, [prompts][length · vocab].
Result<std::vector<std::vector<float>>> run_all(const std::string& dir, const PromptSet& set, int* vocab) {
  auto eng = Engine::load(dir);
  if (!eng) return eng.error();
  *vocab = (*eng)->config().text.vocab_size;
  std::vector<std::vector<float>> out;
  for (const auto& p : make_prompts(set, *vocab)) {
    SequenceState seq = (*eng)->new_sequence();
    auto l = (*eng)->prefill(seq, p, 0, /*all_logits=*/true);
    if (!l) return l.error();
    out.push_back(std::move(*l));
  }
  return out;
}

void log_softmax(const float* z, int n, std::vector<double>& out) {
  out.resize(static_cast<size_t>(n));
  double m = z[0];
  for (int i = 1; i < n; ++i) m = std::max(m, static_cast<double>(z[i]));
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(z[i] - m);
  const double lse = m + std::log(s);
  for (int i = 0; i < n; ++i) out[static_cast<size_t>(i)] = z[i] - lse;
}

}  // namespace

Result<AccuracyReport> accuracy_report(const std::string& ref_dir, const std::string& quant_dir, const PromptSet& set) {
  if (set.prompts < 1 || set.length < 1) return invalid_argument("prompt set must have at least one token");
  int v_ref = 0, v_q = 0;
  auto ref = run_all(ref_dir, set, &v_ref);  // the reference engine is freed before the second load
  if (!ref) return ref.error();
  auto q = run_all(quant_dir, set, &v_q);
  if (!q) return q.error();
  if (v_ref != v_q) return invalid_argument("vocab sizes differ between the two checkpoints");
  AccuracyReport r;
  r.set = set;
  int64_t agree = 0;
  double kl_sum = 0;
  std::vector<double> lp, lq;
  for (size_t p = 0; p < ref->size(); ++p)
    for (int t = 0; t < set.length; ++t) {
      const float* zr = (*ref)[p].data() + static_cast<size_t>(t) * static_cast<size_t>(v_ref);
      const float* zq = (*q)[p].data() + static_cast<size_t>(t) * static_cast<size_t>(v_ref);
      log_softmax(zr, v_ref, lp);
      log_softmax(zq, v_ref, lq);
      double kl = 0;
      for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
      kl = std::max(kl, 0.0);  // fp64 round-off can leave −1e-17 for identical rows
      kl_sum += kl;
      r.kl_max = std::max(r.kl_max, kl);
      agree += std::max_element(zr, zr + v_ref) - zr == std::max_element(zq, zq + v_ref) - zq;
      ++r.positions;
    }
  r.kl_mean = kl_sum / static_cast<double>(r.positions);
  r.top1 = static_cast<double>(agree) / static_cast<double>(r.positions);
  return r;
}

}  // namespace kestrel::app
