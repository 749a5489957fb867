#include "app/args.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "base/check.h"

namespace kestrel::app {

namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

const FlagSpec* find_flag(const CommandSpec& c, std::string_view name) {
  for (const auto& f : c.flags)
    if (f.name == name) return &f;
  for (const auto& f : common_flags())
    if (f.name == name) return &f;
  return nullptr;
}

std::string flag_column(const FlagSpec& f) { return "--" + f.name + (f.meta.empty() ? "" : " " + f.meta); }

Result<long long> to_integer(const std::string& k, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || end == v.c_str() || *end != '\0') return invalid_argument("--" + k + ": not an integer: " + v);
  return x;
}

Result<double> to_number(const std::string& k, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  if (errno != 0 || end == v.c_str() || *end != '\0') return invalid_argument("--" + k + ": not a number: " + v);
  return x;
}

}  // namespace

std::string closest(std::string_view name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    // A prefix of a declared name ("--max" for "--max-tokens") is as close as one edit.
    const size_t d = c.rfind(name, 0) == 0 && !name.empty() ? 1 : edit_distance(name, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

const CommandSpec* find_command(std::string_view name) {
  for (const auto& c : command_specs())
    if (c.name == name) return &c;
  return nullptr;
}

std::string overview_help() {
  std::string s =
      "usage: kestrel <command> [flags]      (kestrel <command> --help lists a command's flags)\n\ncommands:\n";
  for (const auto& c : command_specs()) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "  %-11s %s\n", c.name.c_str(), c.summary.c_str());
    s += buf;
  }
  s += "\nWith no command, kestrel runs `generate` on the embedded default model (random weights).\n"
       "Every command takes --kernels exact|fast (default exact; fast = bf16 activations on BF16 weights and int8\n"
       "on MXFP4 experts, what llama.cpp and vLLM compute; = KESTREL_BF16_ACTS=1 KESTREL_MXFP4_INT8=1).\n"
       "Environment: KESTREL_ISA=scalar|avx2|avx512vnni|amx forces the int8 kernel path;\n"
       "KESTREL_W4A8_WEIGHT_ONLY=1 runs W4A8 weights with fp32 activations (accuracy studies);\n"
       "KESTREL_CACHE_DIR holds generated models; KESTREL_PROGRESS=0 hides progress lines on a terminal.\n";
  return s;
}

std::string command_help(const CommandSpec& c) {
  std::string s = "usage: kestrel " + c.name + " " + c.usage + "\n\n" + c.summary + "\n\nflags:\n";
  size_t width = 0;
  for (const auto& f : c.flags) width = std::max(width, flag_column(f).size());
  for (const auto& f : common_flags()) width = std::max(width, flag_column(f).size());
  width = std::min<size_t>(width, 28);  // a longer flag column pushes its own line's text right
  auto row = [&](const FlagSpec& f) {
    std::string col = flag_column(f);
    if (col.size() < width) col.resize(width, ' ');
    s += "  " + col + "  " + f.help + (f.dflt.empty() ? "" : " (default: " + f.dflt + ")") + "\n";
  };
  for (const auto& f : c.flags) row(f);
  for (const auto& f : common_flags()) row(f);
  std::string h = "-h, --help";
  h.resize(width, ' ');
  s += "  " + h + "  show this help and exit\n";
  return s;
}

std::string flag_list(const CommandSpec& c) {
  std::string s;
  auto row = [&](const FlagSpec& f) { s += "--" + f.name + "\t" + f.meta + "\t" + f.dflt + "\n"; };
  for (const auto& f : c.flags) row(f);
  for (const auto& f : common_flags()) row(f);
  return s;
}

int usage_error(const std::string& command, const Status& s) {
  std::fprintf(stderr, "kestrel %s: %s\n", command.c_str(), s.message().c_str());
  return 2;
}

std::optional<Args> Args::parse(const std::string& command, const std::vector<std::string>& argv, int& exit_code) {
  const CommandSpec* c = find_command(command);
  KCHECK(c != nullptr, "Args::parse: undeclared command");
  exit_code = 0;
  Args a;
  a.cmd_ = c;
  auto error = [&](const std::string& m) -> std::optional<Args> {
    exit_code = usage_error(command, invalid_argument(m));
    return std::nullopt;
  };
  for (const auto& s : argv)
    if (s == "--help" || s == "-h" || s == "--list-flags") {
      const std::string out = s == "--list-flags" ? flag_list(*c) : command_help(*c);
      std::fwrite(out.data(), 1, out.size(), stdout);
      return std::nullopt;
    }
  std::string bare;        // the positional argument, if any
  bool named_too = false;  // ... and its flag given by name as well
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& s = argv[i];
    if (s.rfind("--", 0) != 0 || s == "--") {
      if (c->positional.empty() || s == "--") return error("unexpected argument '" + s + "'");
      if (!bare.empty()) return error("unexpected argument '" + s + "' (" + bare + " is already the " + c->positional + ")");
      bare = s;
      continue;
    }
    std::string k = s.substr(2), v;
    const size_t eq = k.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) v = k.substr(eq + 1), k.resize(eq);
    const FlagSpec* f = find_flag(*c, k);
    if (!f) {
      std::vector<std::string> names;
      for (const auto& d : c->flags) names.push_back(d.name);
      for (const auto& d : common_flags()) names.push_back(d.name);
      return error("unknown flag --" + k + " (did you mean --" + closest(k, names) + "? kestrel " + command +
                   " --help lists them)");
    }
    named_too |= k == c->positional;  // a repeated flag: the last value wins (scripts append overrides)
    if (f->meta.empty()) {
      if (inline_value) return error("--" + k + " takes no value");
      a.values_[k] = "1";
    } else if (inline_value) {
      a.values_[k] = v;
    } else {
      if (i + 1 >= argv.size()) return error("--" + k + " needs a value (" + f->meta + ")");
      a.values_[k] = argv[++i];
    }
    if (!f->meta.empty()) a.all_[k].push_back(a.values_[k]);
  }
  if (!bare.empty()) {
    if (named_too) return error("the " + c->positional + " is given twice: '" + bare + "' and --" + c->positional);
    a.values_[c->positional] = bare;
  }
  return a;
}

const FlagSpec& Args::spec(const std::string& k) const {
  const FlagSpec* f = find_flag(*cmd_, k);
  KCHECK(f != nullptr, "Args: flag not declared in cli_spec.cpp");
  return *f;
}

std::string Args::str(const std::string& k) const {
  const FlagSpec& f = spec(k);
  auto it = values_.find(k);
  return it == values_.end() ? f.dflt : it->second;
}

Result<long long> Args::integer(const std::string& k) const { return to_integer(k, str(k)); }
Result<double> Args::number(const std::string& k) const { return to_number(k, str(k)); }

Result<long long> Args::integer_or(const std::string& k, long long dflt) const {
  spec(k);
  return has(k) ? to_integer(k, values_.at(k)) : Result<long long>(dflt);
}

Result<double> Args::number_or(const std::string& k, double dflt) const {
  spec(k);
  return has(k) ? to_number(k, values_.at(k)) : Result<double>(dflt);
}

Result<KvCacheDtype> kv_cache_dtype_flag(const Args& a) {
  const std::string v = a.str("kv-cache-dtype");
  if (auto d = parse_kv_cache_dtype(v)) return *d;
  return invalid_argument("--kv-cache-dtype must be fp32, bf16 or fp8 (got '" + v + "')");
}

Result<std::vector<int32_t>> parse_id_list(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string tok = s.substr(i, j - i);
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(tok.c_str(), &end, 10);
    if (tok.empty() || errno != 0 || *end != '\0' || v < 0 || v > 0x7fffffff)
      return invalid_argument("bad token id '" + tok + "' in --prompt-ids");
    ids.push_back(static_cast<int32_t>(v));
    i = j + 1;
  }
  if (ids.empty()) return invalid_argument("--prompt-ids is empty");
  return ids;
}

}  // namespace kestrel::app
