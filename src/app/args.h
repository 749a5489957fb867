// Minimal `--flag value` / `--switch` parser for the CLI subcommands.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/result.h"

namespace kestrel::app {

class Args {
 public:
  // `switches` take no value; every other --name takes exactly one.
  static Result<Args> parse(const std::vector<std::string>& argv, const std::set<std::string>& known,
                            const std::set<std::string>& switches);
  bool has(const std::string& k) const { return values_.count(k) != 0; }
  std::string str(const std::string& k, const std::string& dflt = "") const;
  Result<long long> integer(const std::string& k, long long dflt) const;
  Result<double> number(const std::string& k, double dflt) const;

 private:
  std::map<std::string, std::string> values_;
};

Result<std::vector<int32_t>> parse_id_list(const std::string& s);

}  // namespace kestrel::app
