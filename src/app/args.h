// The command line of every subcommand, declared once: each flag's name, value placeholder, default and
// one-line meaning (cli_spec.cpp). The same declaration drives parsing, the defaults the getters return,
// `kestrel <command> --help` and the hidden `--list-flags` the tests compare the help with, so they cannot
// drift apart.
//
// Syntax: `--name VALUE`, `--name=VALUE`, `--switch` (repeated: the last value wins); at most one bare argument
// where the command declares a positional (e.g. `kestrel serve MODEL` = `--model MODEL`, not both). Usage errors (unknown flag, with the closest
// declared one named; missing value; bad value) are one stderr line and exit code 2.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "tensor/kv_cache_dtype.h"

namespace kestrel::app {

struct FlagSpec {
  std::string name;  // without the leading "--"
  std::string meta;  // value placeholder ("DIR", "N"); empty → a switch that takes no value
  std::string dflt;  // the default: shown in help, returned by the getters; empty → none
  std::string help;  // one line
};

struct CommandSpec {
  std::string name;        // "serve"
  std::string summary;     // one line, for `kestrel --help`
  std::string usage;       // what follows the command in the usage line
  std::string positional;  // flag a bare argument sets ("model"); empty → no bare argument
  std::vector<FlagSpec> flags;
};

// Every subcommand, in the order `kestrel --help` lists them.
const std::vector<CommandSpec>& command_specs();
const CommandSpec* find_command(std::string_view name);
// Flags every command accepts (main.cpp applies --kernels before the command runs).
const std::vector<FlagSpec>& common_flags();

std::string overview_help();
std::string command_help(const CommandSpec& c);
// One line per declared flag (the command's, then the common ones): "--name<TAB>META<TAB>DEFAULT".
std::string flag_list(const CommandSpec& c);
// The declared name closest to `name` by edit distance (for "did you mean").
std::string closest(std::string_view name, const std::vector<std::string>& candidates);

class Args {
 public:
  // Parses `argv` (the words after the command). --help/-h print the help to stdout and --list-flags the
  // flag list: both return nullopt with exit_code 0. A usage error prints one line and sets exit_code 2.
  static std::optional<Args> parse(const std::string& command, const std::vector<std::string>& argv, int& exit_code);

  // Given on the command line (a declared default does not count).
  bool has(const std::string& k) const { return values_.count(k) != 0; }
  // The value given, else the declared default.
  std::string str(const std::string& k) const;
  // Every value given for a flag that may repeat (e.g. --image), in command-line order; empty when not given.
  std::vector<std::string> all(const std::string& k) const {
    auto it = all_.find(k);
    return it == all_.end() ? std::vector<std::string>{} : it->second;
  }
  Result<long long> integer(const std::string& k) const;
  Result<double> number(const std::string& k) const;
  // For flags whose default depends on other input (a preset, a cluster spec): the value given, else `dflt`.
  Result<long long> integer_or(const std::string& k, long long dflt) const;
  Result<double> number_or(const std::string& k, double dflt) const;

 private:
  const FlagSpec& spec(const std::string& k) const;
  const CommandSpec* cmd_ = nullptr;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> all_;
};

// The first error among values read with the getters (in argument order), or ok.
template <typename... R>
Status first_error(const R&... r) {
  Status s;
  ((s.is_ok() && !r ? (void)(s = r.error()) : (void)0), ...);
  return s;
}

// Prints "kestrel <command>: <message>" and returns 2, the exit code of a usage error.
int usage_error(const std::string& command, const Status& s);

Result<std::vector<int32_t>> parse_id_list(const std::string& s);

// --kv-cache-dtype of the commands that run a model (fp32|bf16|fp8; the declared default when not given).
Result<KvCacheDtype> kv_cache_dtype_flag(const Args& a);

}  // namespace kestrel::app
