// llama-bench-style measurements for `kestrel bench` (issue 5 "Measure", bench/llama_cpp_compare.py):
// pp<N> = one prefill of N tokens in chunks of `chunk` (llama-bench's n_ubatch, 512) on an empty sequence; tg<M> = M single-token decodes
// starting from an empty sequence; each repeated R times, mean ± sd of the per-repetition tokens/s
// (llama-bench's avg_ts / stddev_ts). And the correctness gate the comparison runs before timing.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/result.h"
#include "runtime/engine.h"

namespace kestrel::app {

struct PpTgOptions {
  int64_t pp = 512;   // 0 = skip
  int64_t tg = 128;   // 0 = skip
  int64_t reps = 3;   // ≥ 1
  int64_t warmup = 1; // untimed runs on a throwaway sequence before timing: a pp-sized prefill + tg-1
                     // (llama-bench's warm-up: the timed prefill finds its buffers grown)
  KvCacheDtype kv = KvCacheDtype::kF32;  // MLA latent cache dtype of the timed sequences
  int64_t chunk = 512;                   // prefill chunk of pp (--chunk; llama-bench computes in ubatches of 512)
};

// Token ids of a timed prompt: (i·7919 + 13 + salt·104729) mod vocab (salt 0: the plain bench's prompt);
// a different salt per prefill keeps the prompts distinct.
std::vector<int32_t> bench_prompt_ids(int64_t n, int vocab, int64_t salt);

// {"pp": {"n_tokens", "seconds": [...], "tok_s": [...], "tok_s_mean", "tok_s_sd", "cores_used": [...]},
//  "tg": {...}} (absent phases skipped); cores_used = process CPU seconds / wall seconds per repetition.
Result<nlohmann::json> run_pp_tg(Engine& e, const PpTgOptions& o);

// Greedy gate: prefill `prompt` in one chunk, then `gen` greedy decodes. Row i of the logits written to
// `logits_path` (raw little-endian fp32 [gen, vocab]) is the distribution that chose generated token i.
// Returns {"prompt_tokens", "generated": [...], "vocab", "logits_file"}.
Result<nlohmann::json> run_gate(Engine& e, const std::vector<int32_t>& prompt, int64_t gen, const std::string& logits_path,
                                KvCacheDtype kv = KvCacheDtype::kF32);

}  // namespace kestrel::app
