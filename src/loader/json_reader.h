// Internal to loader/: typed reads of one JSON object for the config parsers. The first error is
// kept with the file (and sub-object) and key named; later reads return defaults, so parsers read
// straight through and check status() once.
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/result.h"

namespace kestrel::config_detail {

using nlohmann::json;

class Reader {
 public:
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {}
  const Status& status() const { return st_; }
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  int req_int(const char* key) {
    if (!has(key)) return fail(key, "missing required key"), 0;
    if (!j_[key].is_number_integer()) return fail(key, "must be an integer"), 0;
    const int64_t v = j_[key].get<int64_t>();
    if (v < -(int64_t{1} << 30) || v > (int64_t{1} << 30)) return fail(key, "integer out of range"), 0;
    return static_cast<int>(v);
  }
  int opt_int(const char* key, int dflt) { return has(key) ? req_int(key) : dflt; }
  float req_float(const char* key) {
    if (!has(key)) return fail(key, "missing required key"), 0.0f;
    if (!j_[key].is_number()) return fail(key, "must be a number"), 0.0f;
    return j_[key].get<float>();
  }
  float opt_float(const char* key, float dflt) { return has(key) ? req_float(key) : dflt; }
  bool opt_bool(const char* key, bool dflt) {
    if (!has(key)) return dflt;
    if (!j_[key].is_boolean()) return fail(key, "must be a boolean"), dflt;
    return j_[key].get<bool>();
  }
  std::string req_str(const char* key) {
    if (!has(key)) return fail(key, "missing required key"), "";
    if (!j_[key].is_string()) return fail(key, "must be a string"), "";
    return j_[key].get<std::string>();
  }
  std::vector<int> req_layer_list(const char* key, int num_layers) {
    std::vector<int> out;
    if (!has(key)) return fail(key, "missing required key"), out;
    if (!j_[key].is_array()) return fail(key, "must be a list of one-based layer numbers"), out;
    for (const auto& v : j_[key]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > num_layers)
        return fail(key, "entries must be one-based layer numbers in 1.." + std::to_string(num_layers)), out;
      out.push_back(v.get<int>() - 1);
    }
    return out;
  }
  void fail(const std::string& key, const std::string& what) {
    if (st_.is_ok()) st_ = invalid_argument(where_ + ": key '" + key + "': " + what);
  }

 private:
  const json& j_;
  std::string where_;
  Status st_;
};

// A size read from a config and the range it must lie in, checked before any arithmetic (shapes, modulo,
// products) uses it.
struct Bound {
  const char* key;
  long long value, lo, hi;
};
inline constexpr long long kBigSize = 1 << 24;

// The first bound broken, as an error naming the file and the key; ok when none is.
inline Status check_bounds(const std::string& where, std::initializer_list<Bound> bounds) {
  for (const Bound& b : bounds)
    if (b.value < b.lo || b.value > b.hi)
      return invalid_argument(where + ": key '" + b.key + "': " + std::to_string(b.value) + " is outside " +
                              std::to_string(b.lo) + ".." + std::to_string(b.hi));
  return Status::ok();
}

}  // namespace kestrel::config_detail
