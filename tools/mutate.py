#!/usr/bin/env python3
"""Mutation harness: applies named small mutations to the source, one at a time, rebuilds, runs the tests that
should notice, and reports which tests fail. A mutation that no test catches is a hole in the test suite: the
script exits 1 and names it.

Each mutation is an exact text replacement that must match once. The file is restored afterwards (also on
Ctrl-C or error) and the tree is rebuilt, so the working tree ends as it started; files with uncommitted
changes are refused, so nothing of yours is ever overwritten.

  tools/mutate.py                       # every mutation (several minutes each on 2 cores: each rebuilds)
  tools/mutate.py --only sampler_uniform,kda_state_reset --build-dir build/release
  tools/mutate.py --list

Needs a configured and built tree (scripts/test.sh makes build/release).
"""
import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (file, old text, new text, ctest regex of the tests expected to catch it, what the defect is)
MUTATIONS = {
    "sampler_uniform": (
        "src/runtime/sampler.cpp",
        "    c += cand_[i].first;\n    if (r < c) return cand_[i].second;",
        "    c += total / static_cast<double>(n);\n    if (r < c) return cand_[i].second;",
        "Sampler",
        "draws uniformly over the kept tokens instead of by probability"),
    "rope_neox_for_interleaved": (
        "src/layers/rope.cpp",
        "    const float a = x[2 * i], b = x[2 * i + 1];\n"
        "    x[2 * i] = a * cos[i] - b * sin[i];\n"
        "    x[2 * i + 1] = b * cos[i] + a * sin[i];",
        "    const size_t h = inv_freq_.size();\n"
        "    const float a = x[i], b = x[i + h];\n"
        "    x[i] = a * cos[i] - b * sin[i];\n"
        "    x[i + h] = b * cos[i] + a * sin[i];",
        "GoldenTest.*deepseek",
        "MLA rope dims rotated as NeoX halves instead of DeepSeek's interleaved pairs"),
    "kda_state_reset_per_chunk": (
        "src/kernels/cpu/kda_chunked.cpp",
        "        chunk_head(a, h, t0, std::min(C, a.T - t0), w);",
        "        if (t0 > 0) std::fill(w.S.p, w.S.p + w.Kp * w.Vp, 0.0f);\n"
        "        chunk_head(a, h, t0, std::min(C, a.T - t0), w);",
        "Kda|RecurrentKdaEqualsChunked|ChunkedPrefillEqualsOneChunk|GoldenTest.*(k3|kimi_linear)",
        "KDA recurrent state not carried from one chunk to the next"),
    "indexer_rope_plain_theta": (
        "src/layers/dsa_indexer.cpp",
        "  if (c.mla_rope && d.rope > 0) {  // DeepSeek V3.2",
        "  if (false && c.mla_rope && d.rope > 0) {  // DeepSeek V3.2",
        "GoldenTest.*deepseek_v32",
        "DSA indexer RoPE with plain theta instead of the model's YaRN table"),
    "mxfp4_scale_off_by_one": (
        "src/tensor/dtype.h",
        "  return std::bit_cast<float>(static_cast<uint32_t>(s) << 23);",
        "  return std::bit_cast<float>(static_cast<uint32_t>(s + 1) << 23);",
        "GoldenTest.*mxfp4|LayerOps|Mxfp4|W4a8|Int8",
        "E8M0 block scale one exponent too large"),
    "batch_dependent_reduction": (
        "src/kernels/cpu/linear.cpp",
        "      float s = sums[u * R + r];\n      for (int64_t j = i; j < n; ++j) s = tail_step(s, w[r * ws + j], x[u * xs + j]);",
        "      float s = 0;\n      for (int k = 0; k < 16; ++k) s += acc[r][u][U > 1 ? 15 - k : k];\n"
        "      for (int64_t j = i; j < n; ++j) s = tail_step(s, w[r * ws + j], x[u * xs + j]);",
        "BatchedEqualsAlone|Linear|ModelConsistency",
        "lane sum order depends on how many tokens share the block (batch-dependent bits)"),
    "scheduler_one_sequence_per_step": (
        "src/scheduler/scheduler.cpp",
        "  auto plan = [&](Seq& s, int64_t T) -> bool {\n",
        "  auto plan = [&](Seq& s, int64_t T) -> bool {\n    if (!runs_.empty()) return false;\n",
        "BatchedEqualsAlone",
        "every forward runs one sequence (no co-batching: batch invariance holds trivially)"),
    "fast_kernels_ignored": (
        "src/kernels/cpu/linear.cpp",
        "(w.format == WeightFormat::kMxfp4 && mxfp4_int8_enabled())",
        "(w.format == WeightFormat::kMxfp4 && false)",
        "FastKernels",
        "`--kernels fast` leaves MXFP4 experts on the exact fp32 path"),
    "scheduler_event_alloc": (
        "src/scheduler/scheduler.cpp",
        "  GenerationEvent& ev = token_event_;",
        "  GenerationEvent ev;",
        "DecodeAlloc",
        "a fresh token event (and its top-logprob vector) per generated token"),
    "scratch_aligned_alloc_per_call": (
        "src/kernels/cpu/scratch.h",
        "  if (b.size() < n) b.resize(n);\n  return b.data();",
        "  thread_local float* fresh[kScratchSlots] = {};\n  (void)b;\n  __builtin_free(fresh[slot]);\n"
        "  fresh[slot] = static_cast<float*>(__builtin_malloc(n * sizeof(float)));\n"
        "  return fresh[slot];",
        "DecodeAlloc",
        "kernel scratch taken from malloc on every call (a C allocation: operator new is not involved)"),
    "kda_decay_linearised": (
        "src/kernels/cpu/kda.cpp",
        "for (int64_t d = 0; d < K; ++d) decay[d] = std::exp(g[d]);",
        "for (int64_t d = 0; d < K; ++d) decay[d] = 1.0f + g[d];",
        "GoldenTest",
        "KDA decode (recurrent) decay exp(g) linearised to 1 + g; prefill (chunked) unchanged"),
    "ep_remote_expert_dropped": (
        "src/layers/ffn.cpp",
        "      add_weighted(acc_.data() + t * in_, ep_ret_recv_.data() + row * static_cast<size_t>(in_), w_[s], in_);",
        "      if (owner[s] == me || k + 1 < K_)\n"
        "        add_weighted(acc_.data() + t * in_, ep_ret_recv_.data() + row * static_cast<size_t>(in_), w_[s], in_);",
        "CellFake.*ep[24]",
        "a cell drops each token's highest-id expert when another rank owns it"),
    "cell_follower_state_reset": (
        "src/runtime/cell.cpp",
        "  mine_.push_back(SeqRun{r.ids.data(), static_cast<int64_t>(r.ids.size()), &p.st, false});",
        "  Pooled& q = pooled_[-1 - r.seq];\n"
        "  q.st = model_.new_sequence(kv_);\n"
        "  mine_.push_back(SeqRun{r.ids.data(), static_cast<int64_t>(r.ids.size()), &q.st, false});",
        "SchedulerCell",
        "a serving cell's follower runs every step over a fresh state instead of its sequence's own"),
    "cell_placement_rank0_only": (
        "src/scheduler/scheduler.cpp",
        "  for (size_t r = 0; r < (rank0_only ? 1 : ledgers_.size()); ++r) {",
        "  for (size_t r = 0; r < (rank0_only ? 1 : 1); ++r) {",
        "SchedulerCell",
        "a serving cell places every request on rank 0"),
    "cell_drop_never_sent": (
        "src/scheduler/scheduler.cpp",
        "    if (s.rank != 0 && !s.fresh) cell_runs_.push_back(",
        "    if (false) cell_runs_.push_back(",
        "SchedulerCell",
        "a serving cell never tells a rank to free a finished sequence's slot and pages"),
    "ep_owner_off_by_one": (
        "src/layers/expert_shard.h",
        "  int owner(int64_t e, int64_t num_experts) const { return dist::expert_owner(e, num_experts, size); }",
        "  int owner(int64_t e, int64_t num_experts) const { return (dist::expert_owner(e, num_experts, size) + 1) % size; }",
        "CellFake.*ep[24]",
        "a cell dispatches every token to the rank after the one owning its expert"),
    "ep_combine_in_routing_order": (
        "src/layers/ffn.cpp",
        "    std::sort(slot, slot + K_, [id](int a, int b) { return id[a] < id[b]; });",
        "    (void)id;",
        "CellFake.*ep[24]",
        "a cell combines a token's expert outputs in routing-score order instead of ascending expert id"),
    "tp_partial_dropped": (
        "src/layers/ffn.cpp",
        "  for (int m = 1; m < G; ++m) add_partial(y, tp_recv_.data() + m * T * hid, T * hid);",
        "  for (int m = 1; m + 1 < G; ++m) add_partial(y, tp_recv_.data() + m * T * hid, T * hid);",
        "TpMlp|CellFakeTp",
        "a tensor-parallel MLP leaves the last member's partial out of the sum"),
    "tp_sum_in_reverse_order": (
        "src/layers/ffn.cpp",
        "  std::copy_n(tp_recv_.data(), T * hid, y);\n"
        "  for (int m = 1; m < G; ++m) add_partial(y, tp_recv_.data() + m * T * hid, T * hid);",
        "  std::copy_n(tp_recv_.data() + (G - 1) * T * hid, T * hid, y);\n"
        "  for (int m = G - 2; m >= 0; --m) add_partial(y, tp_recv_.data() + m * T * hid, T * hid);",
        "TpMlp.*tp[34]",
        "a tensor-parallel MLP adds the members' partials in reverse order (two partials commute: TP 3 and 4 show it)"),
    "cell_health_ignores_liveness": (
        "src/server/api_handlers.cpp",
        "  if (config_.liveness)\n    if (const std::string why = config_.liveness(); !why.empty())",
        "  if (false)\n    if (const std::string why = config_.liveness(); !why.empty())",
        "ServerTest.UnhealthyCellFailsBothHealthChecks",
        "/health answers 200 while a cell rank is gone or silent"),
    "liveness_closed_connection_ignored": (
        "src/dist/liveness.cpp",
        "        tracker.lost(ranks_[i], after);\n",
        "",
        "Liveness",
        "a rank whose liveness connection closed is only noticed once its silence passes the window"),
    "liveness_window_ignored": (
        "src/dist/liveness.cpp",
        "    const bool bad = p.lost || now - p.last >= o_.window;",
        "    const bool bad = p.lost;",
        "Liveness",
        "a silent (frozen) rank never makes the cell unhealthy"),
}

# Mutations whose catching tests only run on some CPUs: name -> /proc/cpuinfo flag. Elsewhere they are
# reported as not run (the tests skip there), not as survivors.
NEEDS_CPU_FLAG = {
    "gguf_int8_not_dispatched": "avx2",
}
MUTATIONS["gguf_int8_not_dispatched"] = (
    "src/kernels/cpu/linear.cpp",
    "  if (gguf_int8_applies(w)) return ActKind::kQ8Blocks;",
    "  if (false && gguf_int8_applies(w)) return ActKind::kQ8Blocks;",
    "GgufInt8",
    "GGUF Q4_0/Q8_0/MXFP4 products stay on the exact fp32 path in the default int8 mode")
NEEDS_CPU_FLAG["gguf_gemm_halves_swapped"] = "avx512_vnni"
MUTATIONS["gguf_gemm_halves_swapped"] = (
    "src/kernels/cpu/gguf_int8_gemm_avx512.cpp",
    "          acc[r][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), s0, acc[r][u]);\n"
    "          acc[r][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), s1, acc[r][u]);",
    "          acc[r][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), s1, acc[r][u]);\n"
    "          acc[r][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), s0, acc[r][u]);",
    "GgufInt8Gemm",
    "Q8_0 prefill GEMM adds a chunk's two block pairs in the other order (same sums, other fp32 rounding)")

NEEDS_CPU_FLAG["q4_x16_compensation_dropped"] = "avx512_vnni"
MUTATIONS["q4_x16_compensation_dropped"] = (
    "src/kernels/cpu/gguf_q4_x16_avx512.cpp",
    "      __m512i s = _mm512_set1_epi32(C[t][4 * b]);",
    "      __m512i s = _mm512_set1_epi32(0 * C[t][4 * b]);",
    "GgufQ4x16",
    "the AVX-512 packed Q4_0 kernel forgets the −8·Σq of each block (codes used as 0..15, not −8..7)")
NEEDS_CPU_FLAG["q4_x16_amx_codes_unsigned"] = "avx512_vnni"
MUTATIONS["q4_x16_amx_codes_unsigned"] = (
    "src/kernels/cpu/gguf_q4_x16_amx.cpp",
    "    return _mm512_sub_epi8(nibbles, _mm512_set1_epi8(8));",
    "    return nibbles;",
    "GgufQ4x16",
    "the AMX tile form feeds Q4_0 nibbles 0..15 to tdpbssd, not the weights −8..7")
NEEDS_CPU_FLAG["q4_x16_amx_odd_block_scale"] = "avx512_vnni"
MUTATIONS["q4_x16_amx_odd_block_scale"] = (
    "src/kernels/cpu/gguf_q4_x16_amx.cpp",
    "  const float* dx = t.d + b * 16;",
    "  const float* dx = t.d + (b & ~int64_t{1}) * 16;",
    "GgufQ4x16",
    "the AMX tile form scales each odd block with the even block's d_x before it")
NEEDS_CPU_FLAG["q4_x16_avx2_scale_unfused"] = "avx2"
MUTATIONS["q4_x16_avx2_scale_unfused"] = (
    "src/kernels/cpu/gguf_q4_x16_avx2.cpp",
    "      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(D[t][b])), acc[t]);",
    "      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s), dw), _mm256_set1_ps(D[t][b]), acc[t]);",
    "GgufQ4x16",
    "the AVX2 packed Q4_0 kernel multiplies the block sum by d_w before d_x (another rounding than d_w·d_x)")
NEEDS_CPU_FLAG["q4_x16_avx2_one_token_scales_swapped"] = "avx2"
MUTATIONS["q4_x16_avx2_one_token_scales_swapped"] = (
    "src/kernels/cpu/gguf_q4_x16_avx2.cpp",
    "    const __m256 dw1 = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 16)));",
    "    const __m256 dw1 = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p + 0 * 16)));",
    "GgufQ4x16",
    "the AVX2 one-token form gives rows 8..15 of a group the scales of rows 0..7")
NEEDS_CPU_FLAG["prefill_attention_values_unfused"] = "avx512f"
MUTATIONS["prefill_attention_values_unfused"] = (
    "src/kernels/cpu/prefill_attention.cpp",
    "      acc[u][2] = _mm512_fmadd_ps(b, v2, acc[u][2]);",
    "      acc[u][2] = _mm512_add_ps(_mm512_mul_ps(b, v2), acc[u][2]);",
    "PrefillAttention",
    "the AVX-512 prefill attention rounds p·v before adding it (two roundings where its definition fuses)")
NEEDS_CPU_FLAG["prefill_attention_second_group_weights_dropped"] = "avx512f"
MUTATIONS["prefill_attention_second_group_weights_dropped"] = (
    "src/kernels/cpu/prefill_attention.cpp",
    "          add_weights<4>(p + g, l + i + g);",
    "          if (g == 0) add_weights<4>(p + g, l + i + g);",
    "PrefillAttention",
    "the AVX-512 8-query score tile leaves its second group's weights out of their softmax sums")
NEEDS_CPU_FLAG["prefill_attention_kv_group_modulo"] = "avx512f"
MUTATIONS["prefill_attention_kv_group_modulo"] = (
    "src/kernels/cpu/prefill_attention.cpp",
    "Dv = a.Dv, kvh = h / a.kv_group;",
    "Dv = a.Dv, kvh = h % (a.H / a.kv_group);",
    "PrefillAttention",
    "the AVX-512 prefill attention gives query head h key/value head h % (H / kv_group) instead of h / kv_group")
NEEDS_CPU_FLAG["gqa_decode_values_unfused"] = "avx2"
MUTATIONS["gqa_decode_values_unfused"] = (
    "src/kernels/cpu/gqa_decode.cpp",
    "acc[u] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + 8 * u), acc[u]);",
    "acc[u] = _mm256_add_ps(_mm256_mul_ps(pv, _mm256_loadu_ps(v + 8 * u)), acc[u]);",
    "GqaDecode",
    "the grouped-query decode kernel rounds p·v before adding it (two roundings where its definition fuses)")
NEEDS_CPU_FLAG["gqa_decode_rescale_dropped"] = "avx2"
MUTATIONS["gqa_decode_rescale_dropped"] = (
    "src/kernels/cpu/gqa_decode.cpp",
    "          if (!(gm >> i & 1)) continue;",
    "          if (gm != 0) continue;",
    "GqaDecode",
    "the grouped-query decode kernel keeps a head's output unscaled when a later key block raises its max")
MUTATIONS["gqa_decode_cached_rows_dropped"] = (
    "src/layers/gqa_layer.cpp",
    "    d.T = sg.T, d.L = cache.n_tokens, d.H = nh_, d.G = nkv_, d.D = hd_;",
    "    d.T = sg.T, d.L = sg.T, d.H = nh_, d.G = nkv_, d.D = hd_;",
    "Qwen3|qwen3",
    "a Qwen3-MoE decode step attends only to its own new rows: the cached keys and values of earlier tokens are dropped")
MUTATIONS["gqa_window_dropped"] = (
    "src/layers/gqa_layer.cpp",
    "    d.window = window_;",
    "    d.window = 0;",
    "GptOss|gptoss",
    "gpt-oss decode steps on a sliding layer attend to every cached key instead of the window")
MUTATIONS["gqa_sinks_dropped"] = (
    "src/layers/gqa_layer.cpp",
    "  a.sinks = sinks_.empty() ? nullptr : sinks_.data();",
    "  a.sinks = nullptr;",
    "GptOss|gptoss",
    "gpt-oss prefill chunks attend without the per-head sink in the softmax denominator")
MUTATIONS["attention_sink_weight_off"] = (
    "src/kernels/cpu/prefill_attention_tiles.h",
    "  l += prefill_exp(sink - m);",
    "  l += prefill_exp(sink - m - 1.0f);",
    "PrefillAttention|GqaDecode",
    "the attention kernels give the sink e^(s-1) instead of e^s in the denominator")
MUTATIONS["moe_fused_expert_bias_dropped"] = (
    "src/layers/moe_fused.cpp",
    "    ex.add_gate_up_bias(g, u, fe.n, inter, r0, r1);",
    "",
    "GptOss|gptoss",
    "the fused int8 MoE path leaves out the experts' gate and up biases")
MUTATIONS["moe_router_bias_dropped"] = (
    "src/layers/ffn.cpp",
    "  if (logit_bias_.empty()) return;",
    "  return;",
    "GptOss|gptoss",
    "gpt-oss routes on the router's logits without its bias")
MUTATIONS["swiglu_oai_unclamped"] = (
    "src/kernels/cpu/elementwise.cpp",
    "    const float x = std::min(g[i], limit), y = std::clamp(u[i], -limit, limit);",
    "    const float x = g[i], y = std::clamp(u[i], -limit, limit);",
    "GptOss|gptoss",
    "gpt-oss's SwiGLU without the clamp of the gate at the limit")
MUTATIONS["yarn_truncate_ignored"] = (
    "src/layers/rope.cpp",
    "  double low = std::max(c.truncate ? std::floor(lo) : lo, 0.0);",
    "  double low = std::max(std::floor(lo), 0.0);",
    "GptOss",
    "YaRN rounds the ramp's lower end whatever the config's truncate says")
NEEDS_CPU_FLAG["sparse_mla_lane_sums_heads_swapped"] = "avx512f"
MUTATIONS["sparse_mla_lane_sums_heads_swapped"] = (
    "src/kernels/cpu/sparse_mla_attention.cpp",
    "    _mm_storeu_ps(s[1] + j, _mm512_extractf32x4_ps(sums, 1));",
    "    _mm_storeu_ps(s[1] + j, _mm512_extractf32x4_ps(sums, 2));",
    "SparseMla",
    "the AVX-512 latent attention's transposed score sums give head 1 the scores of head 2")
NEEDS_CPU_FLAG["sparse_mla_lane_sums_tree_reordered"] = "avx512f"
MUTATIONS["sparse_mla_lane_sums_tree_reordered"] = (
    "src/kernels/cpu/sparse_mla_attention.cpp",
    "  return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));  // then the two",
    "  return _mm512_add_ps(_mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_set1_ps(1e-7f)), _mm512_sub_ps(_mm512_shuffle_ps(d[0], d[1], 0xDD), _mm512_set1_ps(1e-7f)));",
    "SparseMla",
    "the AVX-512 latent attention's last score sum step rounds through another order than lane_sum's tree")
MUTATIONS["latent_span_merge_dropped"] = (
    "src/kernels/cpu/latent_spans.cpp",
    "      for (int64_t g = 0; g < nh; ++g) merge_span(m[g], l[g], out[g], ms[g], ls[g], os[g], a.Dv);",
    "      (void)ms, (void)ls;",
    "SparseMla",
    "latent attention over a whole query drops every span after the first")
MUTATIONS["latent_spans_merged_backwards"] = (
    "src/kernels/cpu/latent_spans.cpp",
    "      const float* at = state + off[s] + (k * a.H + h) * (a.Dv + 2);",
    "      const float* at = state + off[s] + ((span_count(q.count) - 1 - k) * a.H + h) * (a.Dv + 2);",
    "SparseMla",
    "spans spread over the threads are merged last to first, not in list order")
NEEDS_CPU_FLAG["sparse_mla_tile_rescale_dropped"] = "avx512f"
MUTATIONS["sparse_mla_tile_rescale_dropped"] = (
    "src/kernels/cpu/sparse_mla_attention.cpp",
    "        if (rescale[u]) acc[u][w] = _mm512_mul_ps(acc[u][w], rv[u]);",
    "        if (false && rescale[u]) acc[u][w] = _mm512_mul_ps(acc[u][w], rv[u]);",
    "SparseMla",
    "the AVX-512 sparse MLA tile keeps the output accumulated under an older, smaller running max")
MUTATIONS["dense_mla_last_row_dropped"] = (
    "src/kernels/cpu/attention.cpp",
    "nullptr, a.L - a.T + t + 1, path);",
    "nullptr, a.L - a.T + t, path);",
    "SparseMla|KvRowKernels|DsaGolden|GoldenTest.*deepseek",
    "dense causal MLA leaves out the query's own row (the key it just appended)")
NEEDS_CPU_FLAG["sparse_mla_tile_exp_unshifted"] = "avx512f"
MUTATIONS["sparse_mla_tile_exp_unshifted"] = (
    "src/kernels/cpu/sparse_mla_attention.cpp",
    "    _mm512_storeu_ps(s[u], exp16(_mm512_sub_ps(sv, _mm512_set1_ps(m[u]))));",
    "    _mm512_storeu_ps(s[u], exp16(_mm512_sub_ps(sv, _mm512_set1_ps(mb))));",
    "SparseMla",
    "the AVX-512 tile takes exp of the scores minus the tile's max, not the running max")
NEEDS_CPU_FLAG["sparse_mla_scores_rows_swapped"] = "avx512f"
MUTATIONS["sparse_mla_scores_rows_swapped"] = (
    "src/kernels/cpu/sparse_mla_attention.cpp",
    "      acc[u][2] = _mm512_fmadd_ps(qv, r2, acc[u][2]);",
    "      acc[u][2] = _mm512_fmadd_ps(qv, r3, acc[u][2]);",
    "SparseMla",
    "the AVX-512 score pass scores the fourth row of a group in place of the third")
MUTATIONS["expanded_mla_reuse_unchecked"] = (
    "src/layers/mla_layer.cpp",
    "  while (reuse < known && std::memcmp(",
    "  while (reuse < known && 0 * std::memcmp(",
    "ExpandedMlaReusesKeysOnlyFromIdenticalRows",
    "the expanded MLA form reuses up-projected keys and values without comparing the cache rows")

MUTATIONS["shared_prefill_never_waited_for"] = (
    "src/scheduler/scheduler.cpp",
    "  if (!prefix_ || s.generated > 0 || s.req.handoff == Handoff::kReceive) return false;",
    "  if (!prefix_ || s.generated >= 0 || s.req.handoff == Handoff::kReceive) return false;",
    "RequestsArrivingTogetherShareOnePrefill",
    "a request arriving during a prefill of the same prefix never waits for it (both compute it side by side)")


def cpu_flags():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def run(cmd, **kw):
    return subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, **kw)


def build(build_dir):
    r = run(["cmake", "--build", build_dir, "-j%d" % os.cpu_count()])
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).splitlines()[-20:])
        raise RuntimeError("build failed:\n" + tail)


def failing_tests(build_dir, regex, timeout):
    r = run(["ctest", "--test-dir", build_dir, "-R", regex, "-j%d" % os.cpu_count(), "--timeout", str(timeout)])
    out = r.stdout + r.stderr
    # Summary lines: "\t253 - Name  # GetParam() = ... (Failed)"; parameterised names carry a GetParam note.
    failed = re.findall(r"^\s*\d+ - (\S+).*\((?:Failed|Timeout|SEGFAULT|Subprocess aborted|Exception|Child aborted)\)\s*$",
                        out, re.M)
    ran = re.search(r"tests passed, (\d+) tests? failed out of (\d+)", out)
    if not ran:
        raise RuntimeError("no ctest summary for -R %r:\n%s" % (regex, out[-2000:]))
    if int(ran.group(1)) != len(failed):
        raise RuntimeError("ctest reports %s failures, parsed %d" % (ran.group(1), len(failed)))
    return failed, int(ran.group(2)), r.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build/release")
    ap.add_argument("--only", default="", help="comma-separated mutation names")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--timeout", type=int, default=600, help="per-test timeout (s)")
    args = ap.parse_args()
    if args.list:
        for name, m in MUTATIONS.items():
            print("%-28s %-28s %s" % (name, m[0], m[4]))
        return 0
    names = [n for n in args.only.split(",") if n] or list(MUTATIONS)
    for n in names:
        if n not in MUTATIONS:
            sys.exit("mutate.py: unknown mutation %r (--list)" % n)
    dirty = run(["git", "status", "--porcelain", "--"] + sorted({MUTATIONS[n][0] for n in names})).stdout.strip()
    if dirty:
        sys.exit("mutate.py: uncommitted changes in files it would mutate:\n" + dirty)

    results = []
    flags = cpu_flags()
    for name in names:
        path, old, new, regex, what = MUTATIONS[name]
        if NEEDS_CPU_FLAG.get(name, "") and NEEDS_CPU_FLAG[name] not in flags:
            print("%-28s NOT RUN: its tests need a CPU with %s" % (name, NEEDS_CPU_FLAG[name]), flush=True)
            continue
        full = os.path.join(ROOT, path)
        original = open(full, encoding="utf-8").read()
        if original.count(old) != 1:
            sys.exit("mutate.py: %s: the text to mutate occurs %d times in %s (update the mutation)"
                     % (name, original.count(old), path))
        t0 = time.time()
        try:
            with open(full, "w", encoding="utf-8") as f:
                f.write(original.replace(old, new))
            build(args.build_dir)
            failed, total, _ = failing_tests(args.build_dir, regex, args.timeout)
        finally:
            with open(full, "w", encoding="utf-8") as f:
                f.write(original)
        caught = bool(failed)
        results.append((name, what, caught, failed, total, time.time() - t0))
        print("%-28s %s: %d of %d selected tests fail%s" % (
            name, "CAUGHT" if caught else "SURVIVED", len(failed), total,
            (" (" + ", ".join(failed[:4]) + (", ..." if len(failed) > 4 else "") + ")") if failed else ""),
            flush=True)
    build(args.build_dir)  # back to the unmutated binaries
    survived = [r[0] for r in results if not r[2]]
    print("\n| mutation | defect | failing tests (of those selected) |\n|---|---|---|")
    for name, what, caught, failed, total, secs in results:
        print("| `%s` | %s | %s |" % (name, what, ("%d of %d: " % (len(failed), total)) + ", ".join(
            "`%s`" % f for f in failed[:3]) + (" …" if len(failed) > 3 else "") if caught else "**none**"))
    if survived:
        print("mutate.py: not caught by any test: " + ", ".join(survived))
        return 1
    print("mutate.py: every mutation is caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
