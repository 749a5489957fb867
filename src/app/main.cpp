// kestrel: one binary, subcommands. Wiring only; the logic lives in the libraries.
#include <cstdio>
#include <string>
#include <vector>

#include "app/commands.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/w4a8_gemm.h"
#include "kernels/cpu/w4a8_isa.h"

namespace {
void usage() {
  std::fprintf(stderr,
               "usage: kestrel <command> [flags]\n"
               "  serve      [--model DIR] [--host 127.0.0.1 --port 8000 --api-key K --cache-mib 2048 --max-running 16]\n"
               "             [--max-waiting 256 --max-batch-tokens 512 --prefill-chunk 256 --max-context 8192]\n"
               "  generate   --model DIR --prompt-ids 1,2,3 --max-tokens N [--json] [--top-logits K]\n"
               "             [--temperature T --top-k K --top-p P --min-p M --seed S --chunk C]\n"
               "  chat       [--model DIR] [--system TEXT] [--hide-thinking] [--no-thinking] [--effort low|high|max]\n"
               "  bench      [--preset k3-bench | --model DIR|FILE.gguf] [--prompt N --gen M --chunk C --context N] [--threads T] [--json]\n"
               "             [--pp 512 --tg 128 --reps 3 --warmup 1]   (llama-bench pp/tg protocol)\n"
               "             [--gate-ids 1,2,3 --gate-gen 16 --gate-out LOGITS.f32]   (greedy continuation + logits)\n"
               "  make-model --preset NAME --out DIR [--seed S --shards N --bf16-experts ...]\n"
               "  plan       --model DIR|config.json [--cluster h200|b200|...|SPEC.json] [--json]\n"
               "             [--prefill-nodes 4 --decode-nodes 4 --gpus-per-node 8 --tp 8 --ep 8 --dcp 1]\n"
               "             [--context 1048576 --batch B --kv-dtype bf16|fp8 --expert-format checkpoint|mxfp4|bf16|w4a8]\n"
               "  quantize   --model IN --out OUT [--group-size 32|64|128] [--quantize-lm-head]\n"
               "             [--report [--prompts 8 --prompt-len 64]] [--json]\n"
               "  quantize   --model REF --compare DIR [--prompts 8 --prompt-len 64] [--json]   (report only)\n"
               "With no command, kestrel runs `generate` on the shipped default model (small, trained; models/default).\n"
               "Environment: KESTREL_ISA=scalar|avx2|avx512vnni|amx forces the int8 kernel path;\n"
               "KESTREL_MXFP4_INT8=1 runs MXFP4 experts with int8 activations (faster, approximate);\n"
               "KESTREL_W4A8_WEIGHT_ONLY=1 runs W4A8 weights with fp32 activations (accuracy studies).\n"
               "Every command: --kernels exact (default: fp32 activations) | fast (bf16 activations on BF16\n"
               "weights, int8 on MXFP4 experts: what llama.cpp and vLLM compute; = KESTREL_BF16_ACTS=1\n"
               "KESTREL_MXFP4_INT8=1).\n");
}


// `--kernels exact|fast`, accepted anywhere on the command line (every command that loads a model):
// removed from args and applied before anything loads. fast = the approximate paths llama.cpp and vLLM
// run by default: bf16-rounded activations on BF16 weights, int8 activations on MXFP4 experts.
bool apply_kernels_flag(std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] != "--kernels") continue;
    const std::string v = i + 1 < args.size() ? args[i + 1] : "";
    if (v != "exact" && v != "fast") {
      std::fprintf(stderr, "kestrel: --kernels takes exact or fast (got '%s')\n", v.c_str());
      return false;
    }
    kestrel::kernels::set_bf16_acts(v == "fast");
    kestrel::kernels::set_mxfp4_int8(v == "fast");
    args.erase(args.begin() + static_cast<std::ptrdiff_t>(i), args.begin() + static_cast<std::ptrdiff_t>(i + 2));
    --i;
  }
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (auto isa = kestrel::kernels::isa_from_env(); !isa) {
    std::fprintf(stderr, "kestrel: %s\n", isa.error().message().c_str());
    return 2;
  }
  if (!apply_kernels_flag(args)) return 2;
  if (args.empty()) return kestrel::app::cmd_generate({});
  const std::string cmd = args.front();
  args.erase(args.begin());
  if (cmd == "generate") return kestrel::app::cmd_generate(args);
  if (cmd == "bench") return kestrel::app::cmd_bench(args);
  if (cmd == "chat") return kestrel::app::cmd_chat(args);
  if (cmd == "serve") return kestrel::app::cmd_serve(args);
  if (cmd == "make-model") return kestrel::app::cmd_make_model(args);
  if (cmd == "plan") return kestrel::app::cmd_plan(args);
  if (cmd == "quantize") return kestrel::app::cmd_quantize(args);
  if (cmd == "-h" || cmd == "--help" || cmd == "help") return usage(), 0;
  if (cmd.rfind("--", 0) == 0) {  // flags without a command: generate on the default model
    args.insert(args.begin(), cmd);
    return kestrel::app::cmd_generate(args);
  }
  std::fprintf(stderr, "kestrel: unknown command '%s'\n", cmd.c_str());
  usage();
  return 2;
}
