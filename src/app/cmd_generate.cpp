#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>

#include "app/args.h"
#include "app/cell_launch.h"
#include "app/commands.h"
#include "app/default_model.h"
#include "chat/model_tokenizer.h"
#include "chat/stream_decoder.h"
#include "runtime/cell.h"
#include "runtime/engine.h"
#include "runtime/image_input.h"
#include "runtime/sampler.h"

namespace kestrel::app {

std::string resolve_model_or_default(const std::string& model_flag, bool verbose, int& rc, const std::string& preset) {
  rc = 0;
  if (!model_flag.empty()) return model_flag;
  auto d = preset.empty() ? default_model_dir() : ensure_preset_model(preset, verbose);
  if (!d) {
    std::fprintf(stderr, "kestrel: %s\n", d.error().message().c_str());
    rc = 1;
    return "";
  }
  if (verbose) {
    if (preset.empty())
      std::fprintf(stderr, "kestrel: no --model given: using the shipped default model %s (a small trained "
                           "K3-architecture model, tools/default_model/)\n", d->c_str());
    else
      std::fprintf(stderr, "kestrel: using the generated '%s' K3-architecture model (RANDOM weights: the output "
                           "is not meaningful text)\n", preset.c_str());
  }
  return *d;
}

void print_load_notes(const Engine& engine, const std::string& dir, bool verbose) {
  if (!verbose) return;
  for (const auto& n : engine.load_notes()) std::fprintf(stderr, "kestrel: %s: %s\n", dir.c_str(), n.c_str());
}

Result<std::vector<uint8_t>> read_image_file(const std::string& path, const std::string& label) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return io_error(label + ": " + ec.message());
  if (size > media::ImageLimits{}.max_file_bytes)
    return invalid_argument(label + ": " + std::to_string(size) + " bytes; the limit is " +
                            std::to_string(media::ImageLimits{}.max_file_bytes));
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size)))
    return io_error(label + ": read failed");
  return bytes;
}

namespace {

int fail(const Status& s) {
  std::fprintf(stderr, "kestrel: %s\n", s.message().c_str());
  return 1;
}

// Top-n (id, logit) pairs of one row.
std::vector<std::pair<int32_t, float>> top_entries(const std::vector<float>& l, int n) {
  std::vector<int32_t> idx(l.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
  n = std::min<int>(n, static_cast<int>(idx.size()));
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
    return l[static_cast<size_t>(a)] > l[static_cast<size_t>(b)] || (l[static_cast<size_t>(a)] == l[static_cast<size_t>(b)] && a < b);
  });
  std::vector<std::pair<int32_t, float>> out;
  for (int i = 0; i < n; ++i) out.push_back({idx[static_cast<size_t>(i)], l[static_cast<size_t>(idx[static_cast<size_t>(i)])]});
  return out;
}

// Every rank's bound weight bytes and MoE / tensor-parallel / cell bytes sent, gathered on every rank (after
// the last step).
Result<nlohmann::json> cell_report(CellLaunch& c, const Model& m, const Cell& cell) {
  constexpr size_t kN = 5;
  const EpTraffic& t = c.shard.traffic;
  const uint64_t mine[kN] = {m.bound_weight_bytes(), t.total() - t.tp_total(),
                             cell.traffic().plan_bytes + cell.traffic().logits_bytes, cell.traffic().steps,
                             t.tp_total()};
  std::vector<uint64_t> all(kN * static_cast<size_t>(c.shard.size));
  std::vector<size_t> counts(static_cast<size_t>(c.shard.size), kN);
  KESTREL_RETURN_IF_ERROR(c.comm->all_gather_v<uint64_t>(std::span<const uint64_t>(mine, kN), all, counts));
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < static_cast<size_t>(c.shard.size); ++r)
    ranks.push_back({{"rank", r}, {"weight_bytes", all[kN * r]}, {"moe_bytes_sent", all[kN * r + 1]},
                     {"tp_bytes_sent", all[kN * r + 4]}, {"cell_bytes_sent", all[kN * r + 2]}});
  return nlohmann::json{{"ep", c.shard.size}, {"tp", c.shard.tp}, {"steps", all[3]}, {"ranks", ranks}};
}

}  // namespace

int cmd_generate(const std::vector<std::string>& argv) {
  int exit_code = 0;
  auto a = Args::parse("generate", argv, exit_code);
  if (!a) return exit_code;
  const bool quiet = a->has("quiet");
  if (a->has("prompt") && a->has("prompt-ids"))
    return usage_error("generate", invalid_argument("give --prompt or --prompt-ids, not both"));
  auto max_tokens = a->integer("max-tokens");
  auto temp = a->number("temperature");
  auto top_k = a->integer("top-k");
  auto top_p = a->number("top-p");
  auto min_p = a->number("min-p");
  auto seed = a->integer("seed");
  auto chunk = a->integer("chunk");
  auto top_logits = a->integer("top-logits");
  auto ep = a->integer("ep");
  auto kv = kv_cache_dtype_flag(*a);
  if (Status bad = first_error(max_tokens, temp, top_k, top_p, min_p, seed, chunk, top_logits, ep, kv); !bad.is_ok())
    return usage_error("generate", bad);
  if (*max_tokens < 0 || *temp < 0 || *top_k < 0 || *top_p <= 0 || *top_p > 1 || *min_p < 0 || *min_p > 1 ||
      *chunk < 1 || *top_logits < 0)
    return usage_error("generate", invalid_argument("sampling flag out of range"));
  if (a->has("prompt-ids"))
    if (auto ids = parse_id_list(a->str("prompt-ids")); !ids) return usage_error("generate", ids.error());
  auto lo = liveness_flags(*a);
  if (!lo) return usage_error("generate", lo.error());
  auto tp = a->integer("tp");
  if (!tp) return usage_error("generate", tp.error());
  auto launch = open_cell(*ep, *tp);
  if (!launch) return usage_error("generate", launch.error());
  CellLaunch* cl = launch->get();
  if (Status s = apply_numa(*a, cl, a->has("quiet")); !s.is_ok()) {  // before any thread pool or weight page
    if (cl != nullptr) cell_exit(*cl, s);
    return usage_error("generate", s);
  }
  std::unique_ptr<dist::Liveness> liveness;  // a frozen or lost rank ends the cell at the deadline
  if (cl != nullptr) liveness = open_liveness(*cl, *lo, /*report_health=*/false);
  if (cl != nullptr && cl->shard.rank != 0) {  // a follower: rank 0 resolves (and maybe generates) the model first
    if (Status s = cl->comm->barrier(); !s.is_ok()) cell_exit(*cl, s);
    int rc = 0;
    const std::string dir = resolve_model_or_default(a->str("model"), false, rc, a->str("preset"));
    if (rc) cell_exit(*cl, invalid_argument("no model"));
    auto eng = Engine::load(dir, &cl->shard);
    if (!eng) cell_exit(*cl, eng.error());
    Cell cell((*eng)->model(), *cl->comm, {}, *kv);
    if (Status s = cell.follow(); !s.is_ok()) cell_exit(*cl, s);
    if (auto r = cell_report(*cl, (*eng)->model(), cell); !r) cell_exit(*cl, r.error());
    return 0;
  }
  // From here on an error on rank 0 of a cell ends the cell.
  auto die = [&](const Status& s) {
    if (cl != nullptr) cell_exit(*cl, s);
    return fail(s);
  };
  int rc = 0;
  const std::string dir = resolve_model_or_default(a->str("model"), !quiet, rc, a->str("preset"));
  if (rc) {
    if (cl != nullptr) cell_exit(*cl, invalid_argument("no model"));
    return rc;
  }
  if (cl != nullptr)
    if (Status s = cl->comm->barrier(); !s.is_ok()) cell_exit(*cl, s);
  // Text prompts go through the checkpoint's tokenizer (raw completion: special-token strings in the
  // prompt stay text). Without --prompt/--prompt-ids the default model gets a fixed greeting.
  std::optional<chat::Tokenizer> tok;
  if (a->has("prompt") || !a->has("prompt-ids")) {
    auto t = chat::load_model_tokenizer(dir);
    if (!t) return die(t.error());
    tok.emplace(std::move(*t));
  }
  // --image files: decoded and preprocessed first (a bad file fails before the model loads); with --prompt each
  // image's expanded placeholder goes before the text, with --prompt-ids the ids must hold the pads themselves.
  std::vector<std::vector<uint8_t>> files;
  for (const std::string& path : a->all("image")) {
    auto bytes = read_image_file(path, "--image " + path);
    if (!bytes) return die(bytes.error());
    files.push_back(std::move(*bytes));
  }
  auto images = prepare_images(files, ImageRequestLimits{});
  if (!images) return die(images.error());
  Result<std::vector<int32_t>> ids = parse_id_list(a->str("prompt-ids"));
  if (tok) {
    std::vector<int32_t> text_ids;
    for (const std::string& p : images->prompts) tok->encode_append(p, chat::SpecialMode::kAllow, text_ids);
    tok->encode_append(a->str("prompt"), chat::SpecialMode::kAsText, text_ids);
    ids = std::move(text_ids);
  }
  if (!ids) return die(ids.error());
  if (ids->empty()) return die(invalid_argument("the prompt encodes to no tokens"));

  auto eng = Engine::load(dir, cl != nullptr ? &cl->shard : nullptr);
  if (!eng) return die(eng.error());
  print_load_notes(**eng, dir, !quiet);
  Engine& e = **eng;
  std::vector<float> media;
  double encode_s = 0;
  if (!files.empty()) {
    if (cl != nullptr) return die(unsupported("--image in a cell (--ep): images run in one process only"));
    if (!e.has_vision()) return die(unsupported(dir + ": the model has no vision tower; --image needs one"));
    const auto te = std::chrono::steady_clock::now();
    auto rows = embed_images(e, *images);
    if (!rows) return die(rows.error());
    encode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - te).count();
    media = std::move(*rows);
  }
  SamplingParams sp{static_cast<float>(*temp), static_cast<int>(*top_k), static_cast<float>(*top_p),
                    static_cast<float>(*min_p), static_cast<uint64_t>(*seed)};
  Sampler sampler(sp);
  SequenceState seq = e.new_sequence(*kv);
  // In a cell the request lives on rank 0 (its pages and KDA state); every step runs on all ranks.
  std::optional<Cell> cell;
  if (cl != nullptr) cell.emplace(e.model(), *cl->comm, ForwardOptions{}, *kv);
  auto cell_prefill = [&]() -> Result<std::vector<float>> {
    std::vector<float> out;
    for (size_t s = 0; s < ids->size(); s += static_cast<size_t>(*chunk)) {
      const size_t n = std::min(static_cast<size_t>(*chunk), ids->size() - s);
      std::vector<CellRun> runs{CellRun{0, 0, s == 0, false, std::vector<int32_t>(ids->begin() + static_cast<long>(s),
                                                                               ids->begin() + static_cast<long>(s + n))}};
      KESTREL_RETURN_IF_ERROR(cell->step(runs, out));
    }
    return out;
  };
  auto cell_decode = [&](int32_t id) -> Result<std::vector<float>> {
    std::vector<float> out;
    KESTREL_RETURN_IF_ERROR(cell->step({CellRun{0, 0, false, false, {id}}}, out));
    return out;
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto logits = cell ? cell_prefill() : e.prefill_media(seq, *ids, media, *chunk);
  if (!logits) return die(logits.error());
  const auto t1 = std::chrono::steady_clock::now();
  std::vector<int32_t> out;
  nlohmann::json tops = nlohmann::json::array();
  std::string finish = "length";
  std::vector<float> cur = std::move(*logits);
  for (long long i = 0; i < *max_tokens; ++i) {
    if (*top_logits > 0) {
      nlohmann::json row = nlohmann::json::array();
      for (auto [id, v] : top_entries(cur, static_cast<int>(*top_logits))) row.push_back({{"id", id}, {"logit", v}});
      tops.push_back(row);
    }
    const int32_t tok = sampler.sample(cur);
    out.push_back(tok);
    if (!a->has("ignore-eos") && tok == e.config().text.eos_token_id) {
      finish = "stop";
      break;
    }
    if (i + 1 == *max_tokens) break;
    auto next = cell ? cell_decode(tok) : e.decode(seq, tok);
    if (!next) return die(next.error());
    cur = std::move(*next);
  }
  const auto t2 = std::chrono::steady_clock::now();
  nlohmann::json cell_json;
  if (cell) {
    if (Status s = cell->finish(); !s.is_ok()) cell_exit(*cl, s);
    auto r = cell_report(*cl, e.model(), *cell);
    if (!r) cell_exit(*cl, r.error());
    cell_json = std::move(*r);
  }
  const double pre_s = std::chrono::duration<double>(t1 - t0).count();
  const double dec_s = std::chrono::duration<double>(t2 - t1).count();
  std::string text;
  if (tok) {  // complete UTF-8 only; invalid bytes (random weights produce them) become U+FFFD
    chat::StreamDecoder sd(*tok);
    for (int32_t id : out) {
      auto piece = sd.push(id);
      if (!piece) return fail(piece.error());
      text += *piece;
    }
    text += sd.flush();
  }
  if (a->has("json")) {
    nlohmann::json j = {{"model", dir}, {"prompt_ids", *ids}, {"tokens", out}, {"finish_reason", finish},
                        {"prefill_seconds", pre_s}, {"decode_seconds", dec_s},
                        {"weight_bytes", e.model().bound_weight_bytes()}};
    if (!files.empty()) j["image_tokens"] = images->tokens, j["encode_seconds"] = encode_s;
    if (tok) j["text"] = text;
    if (*top_logits > 0) j["top_logits"] = tops;
    if (cell) j["cell"] = cell_json;
    std::printf("%s\n", j.dump().c_str());
  } else if (tok) {
    std::printf("%s\n", text.c_str());
  } else {
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
    std::printf("\n");
    if (!quiet)
      std::fprintf(stderr, "kestrel: %zu prompt tokens in %.3f s, %zu generated in %.3f s (finish: %s)\n", ids->size(),
                   pre_s, out.size(), dec_s, finish.c_str());
  }
  if (cell && !quiet && !a->has("json"))
    for (const auto& r : cell_json["ranks"])
      std::fprintf(stderr, "kestrel: cell rank %d: %llu weight bytes bound, %llu MoE bytes sent\n", r["rank"].get<int>(),
                   r["weight_bytes"].get<unsigned long long>(), r["moe_bytes_sent"].get<unsigned long long>());
  return 0;
}

}  // namespace kestrel::app
