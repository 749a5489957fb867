// kestrel quantize --model IN --out OUT [--group-size 32|64|128] [--quantize-lm-head]
//                  [--report [--prompts N --prompt-len L]] [--json]
// kestrel quantize --model IN --compare DIR [--prompts N --prompt-len L] [--json]
// BF16 checkpoint → W4A8 (models/w4a8_quantizer.h); MXFP4 experts kept; progress on a terminal.
// --compare only runs the accuracy report of DIR (any checkpoint with IN's vocabulary) against IN.
#include <chrono>
#include <cstdio>
#include <optional>
#include <nlohmann/json.hpp>

#include "app/args.h"
#include "app/commands.h"
#include "app/quant_report.h"
#include "base/progress.h"
#include "models/w4a8_quantizer.h"

namespace kestrel::app {

int cmd_quantize(const std::vector<std::string>& argv) {
  auto fail = [](const Status& s) { std::fprintf(stderr, "kestrel quantize: %s\n", s.message().c_str()); return 1; };
  int exit_code = 0;
  auto a = Args::parse("quantize", argv, exit_code);
  if (!a) return exit_code;
  if (!a->has("model") || a->has("out") == a->has("compare"))
    return usage_error("quantize", invalid_argument("--model DIR and one of --out DIR / --compare DIR are required"));
  auto g = a->integer("group-size");
  auto np = a->integer("prompts");
  auto len = a->integer("prompt-len");
  if (!g || !np || !len) return usage_error("quantize", invalid_argument("--group-size, --prompts, --prompt-len must be integers"));
  if (*g != 32 && *g != 64 && *g != 128) return usage_error("quantize", invalid_argument("--group-size must be 32, 64 or 128"));
  if (*np < 1 || *np > 1024 || *len < 1 || *len > 8192)
    return usage_error("quantize", invalid_argument("--prompts must be in 1..1024 and --prompt-len in 1..8192"));
  PromptSet set;
  set.prompts = static_cast<int>(*np), set.length = static_cast<int>(*len);
  auto report_json = [&](const std::string& ref, const std::string& q, nlohmann::json& j) -> Status {
    auto r = accuracy_report(ref, q, set);
    if (!r) return r.error();
    j["report"] = {{"prompts", set.prompts}, {"prompt_len", set.length}, {"seed", set.seed}, {"positions", r->positions},
                   {"kl_mean", r->kl_mean}, {"kl_max", r->kl_max}, {"top1_agreement", r->top1}};
    std::fprintf(stderr,
                 "accuracy of %s vs %s (%d prompts × %d tokens, %lld positions): KL(p_ref||p_q) mean %.3e max %.3e "
                 "nats; top-1 agreement %.2f%%\n",
                 q.c_str(), ref.c_str(), set.prompts, set.length, static_cast<long long>(r->positions), r->kl_mean,
                 r->kl_max, 100.0 * r->top1);
    return Status::ok();
  };
  if (a->has("compare")) {
    nlohmann::json j = {{"model", a->str("model")}, {"compare", a->str("compare")}};
    Status s = report_json(a->str("model"), a->str("compare"), j);
    if (!s.is_ok()) return fail(s);
    if (a->has("json")) std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  QuantizeOptions opt;
  opt.in_dir = a->str("model"), opt.out_dir = a->str("out");
  opt.group_size = static_cast<int>(*g);
  opt.quantize_lm_head = a->has("quantize-lm-head");
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<Progress> progress;  // created at the first callback, which knows the tensor count
  auto sum = quantize_checkpoint(opt, [&](size_t done, size_t total, const std::string&) {
    if (!progress) progress.emplace("quantizing " + opt.in_dir, 0, total);
    progress->set(0, done);
  });
  progress.reset();
  if (!sum) return fail(sum.error());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json j = {{"model", opt.in_dir}, {"out", opt.out_dir}, {"group_size", opt.group_size},
                      {"quantized_tensors", sum->quantized}, {"mxfp4_tensors_kept", sum->kept_mxfp4},
                      {"copied_tensors", sum->copied}, {"bytes_in", sum->bytes_in}, {"bytes_out", sum->bytes_out},
                      {"seconds", secs}};
  std::fprintf(stderr, "kestrel quantize: %d linear weights → W4A8 (group %d), %d MXFP4 kept, %d copied; %.1f → %.1f MiB in %.1f s\n",
               sum->quantized, opt.group_size, sum->kept_mxfp4, sum->copied, sum->bytes_in / 1048576.0,
               sum->bytes_out / 1048576.0, secs);
  if (a->has("report")) {
    Status s = report_json(opt.in_dir, opt.out_dir, j);
    if (!s.is_ok()) return fail(s);
  }
  if (a->has("json")) std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace kestrel::app
