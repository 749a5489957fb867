#include "app/args.h"

#include <cerrno>
#include <cstdlib>

namespace kestrel::app {

Result<Args> Args::parse(const std::vector<std::string>& argv, const std::set<std::string>& known,
                         const std::set<std::string>& switches) {
  Args a;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& s = argv[i];
    if (s.rfind("--", 0) != 0) return invalid_argument("unexpected argument '" + s + "'");
    const std::string k = s.substr(2);
    if (switches.count(k)) {
      a.values_[k] = "1";
    } else if (known.count(k)) {
      if (i + 1 >= argv.size()) return invalid_argument("--" + k + " needs a value");
      a.values_[k] = argv[++i];
    } else {
      return invalid_argument("unknown flag --" + k);
    }
  }
  return a;
}

std::string Args::str(const std::string& k, const std::string& dflt) const {
  auto it = values_.find(k);
  return it == values_.end() ? dflt : it->second;
}

Result<long long> Args::integer(const std::string& k, long long dflt) const {
  if (!has(k)) return dflt;
  const std::string& v = values_.at(k);
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || end == v.c_str() || *end != '\0') return invalid_argument("--" + k + ": not an integer: " + v);
  return x;
}

Result<double> Args::number(const std::string& k, double dflt) const {
  if (!has(k)) return dflt;
  const std::string& v = values_.at(k);
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v.c_str(), &end);
  if (errno != 0 || end == v.c_str() || *end != '\0') return invalid_argument("--" + k + ": not a number: " + v);
  return x;
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
