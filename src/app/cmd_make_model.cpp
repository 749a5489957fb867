#include <cstdio>

#include "app/args.h"
#include "app/commands.h"
#include "base/progress.h"
#include "models/checkpoint_generator.h"

namespace kestrel::app {

int cmd_make_model(const std::vector<std::string>& argv) {
  int exit_code = 0;
  auto a = Args::parse("make-model", argv, exit_code);
  if (!a) return exit_code;
  auto fail = [](const Status& s) { std::fprintf(stderr, "kestrel make-model: %s\n", s.message().c_str()); return 1; };
  if (!a->has("out")) return usage_error("make-model", invalid_argument("--out DIR is required"));
  auto spec = gen_preset(a->str("preset"));
  if (!spec) return usage_error("make-model", spec.error());
  auto set_int = [&](const char* flag, int& field) -> Status {
    auto v = a->integer_or(flag, field);
    if (!v) return v.error();
    if (*v < 0 || *v > (1 << 24)) return invalid_argument(std::string("--") + flag + " out of range");
    field = static_cast<int>(*v);
    return Status::ok();
  };
  int seed = static_cast<int>(spec->seed);
  for (auto [flag, field] : std::initializer_list<std::pair<const char*, int*>>{
           {"seed", &seed}, {"shards", &spec->shards}, {"mla-heads", &spec->mla_heads},
           {"kda-heads", &spec->kda_heads}, {"experts", &spec->experts}, {"top-k", &spec->top_k},
           {"attn-res-block", &spec->attn_res_block}, {"layers", &spec->layers},
           {"hidden", &spec->hidden},
           {"vt-layers", &spec->vt_layers}, {"vt-hidden", &spec->vt_hidden}, {"vt-intermediate", &spec->vt_intermediate},
           {"vt-heads", &spec->vt_heads}, {"vt-qkv", &spec->vt_qkv}, {"vt-pos-grid", &spec->vt_pos_grid}}) {
    Status s = set_int(flag, *field);
    if (!s.is_ok()) return usage_error("make-model", s);
  }
  spec->seed = static_cast<uint64_t>(seed);
  if (a->has("layers")) {  // keep K3's pattern: every 4th layer MLA, plus the last
    spec->full_attn_layers.clear();
    for (int l = 4; l <= spec->layers; l += 4) spec->full_attn_layers.push_back(l);
    if (spec->full_attn_layers.empty() || spec->full_attn_layers.back() != spec->layers)
      spec->full_attn_layers.push_back(spec->layers);
  }
  if (a->has("bf16-experts")) spec->mxfp4_experts = false;
  Progress progress("generating " + a->str("preset"), 0, 0);
  Status s = generate_checkpoint(*spec, a->str("out"), &progress);
  progress.finish();
  if (!s.is_ok()) return fail(s);
  std::fprintf(stderr, "kestrel make-model: wrote %s (random weights)\n", a->str("out").c_str());
  return 0;
}

}  // namespace kestrel::app
