// kestrel: one binary, subcommands. Wiring only; the logic lives in the libraries.
#include <cstdio>
#include <string>
#include <vector>

#include "app/args.h"
#include "app/commands.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/w4a8_gemm.h"
#include "kernels/cpu/w4a8_isa.h"

namespace {

// `--kernels exact|fast`, accepted anywhere on the command line (every command that loads a model):
// removed from args and applied before anything loads. fast = the approximate paths llama.cpp and vLLM
// run by default: bf16-rounded activations on BF16 weights, int8 activations on MXFP4 experts.
bool apply_kernels_flag(std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const bool joined = args[i].rfind("--kernels=", 0) == 0;
    if (args[i] != "--kernels" && !joined) continue;
    const std::string v = joined ? args[i].substr(10) : i + 1 < args.size() ? args[i + 1] : "";
    if (v != "exact" && v != "fast") {
      std::fprintf(stderr, "kestrel: --kernels takes exact or fast (got '%s')\n", v.c_str());
      return false;
    }
    kestrel::kernels::set_bf16_acts(v == "fast");
    kestrel::kernels::set_mxfp4_int8(v == "fast");
    const size_t n = joined || i + 1 >= args.size() ? 1 : 2;
    args.erase(args.begin() + static_cast<std::ptrdiff_t>(i), args.begin() + static_cast<std::ptrdiff_t>(i + n));
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
  std::string cmd = args.front();
  if (cmd == "-h" || cmd == "--help") return std::fputs(kestrel::app::overview_help().c_str(), stdout), 0;
  if (cmd == "help") {  // `kestrel help [COMMAND]`
    if (args.size() == 1) return std::fputs(kestrel::app::overview_help().c_str(), stdout), 0;
    cmd = args[1];
    args = {cmd, "--help"};
  }
  if (cmd.rfind("--", 0) == 0) return kestrel::app::cmd_generate(args);  // flags alone: generate
  args.erase(args.begin());
  if (cmd == "generate") return kestrel::app::cmd_generate(args);
  if (cmd == "bench") return kestrel::app::cmd_bench(args);
  if (cmd == "chat") return kestrel::app::cmd_chat(args);
  if (cmd == "serve") return kestrel::app::cmd_serve(args);
  if (cmd == "make-model") return kestrel::app::cmd_make_model(args);
  if (cmd == "plan") return kestrel::app::cmd_plan(args);
  if (cmd == "quantize") return kestrel::app::cmd_quantize(args);
  std::vector<std::string> names;
  for (const auto& c : kestrel::app::command_specs()) names.push_back(c.name);
  std::fprintf(stderr, "kestrel: unknown command '%s' (did you mean %s? kestrel --help lists them)\n", cmd.c_str(),
               kestrel::app::closest(cmd, names).c_str());
  return 2;
}
