// Minimal JSON value for the chat renderers: parse like Python's json.loads, print like json.dumps(ensure_ascii=False).
//
// Only what rendering byte-exactly against Python needs: object keys keep insertion order (a repeated key keeps its
// first position and takes the last value, as a Python dict does), integers keep their digits (Python ints are
// unbounded), floats print as Python's repr (shortest round-trip; exponent form below 1e-4 and from 1e16), NaN and
// ±Infinity are accepted and printed as Python does. Strings hold UTF-8; a \u escape of a lone surrogate becomes
// U+FFFD (Python would keep the surrogate, which no UTF-8 tokenizer input can carry).
// Values are plain data; no method mutates shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"

namespace kestrel::chat {

class Json {
 public:
  enum class Type { kNull, kBool, kInt, kFloat, kString, kArray, kObject };

  Json() = default;
  static Json null() { return Json(); }
  static Json boolean(bool b);
  static Json string(std::string s);
  static Json array(std::vector<Json> items);
  static Json object(std::vector<std::pair<std::string, Json>> members);

  // Python json.loads of `text` (whole input, surrounding whitespace allowed). Errors name the byte offset.
  static Result<Json> parse(std::string_view text);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_object() const { return type_ == Type::kObject; }
  bool is_array() const { return type_ == Type::kArray; }
  bool as_bool() const { return bool_; }
  const std::string& as_string() const { return str_; }  // kString: the text; kInt: the digits
  double as_float() const { return num_; }
  const std::vector<Json>& items() const { return items_; }
  const std::vector<std::pair<std::string, Json>>& members() const { return members_; }
  // First member with this key, or nullptr (objects only).
  const Json* find(std::string_view key) const;

  // json.dumps(v, ensure_ascii=False) with separators (", ", ": ") or, compact, (",", ":").
  std::string dump(bool compact = false) const;
  // Python's deep_sort_dict: every object's members sorted by key (code point order == UTF-8 byte order).
  Json deep_sorted() const;

 private:
  friend class JsonParser;
  void dump_to(std::string& out, bool compact) const;

  Type type_ = Type::kNull;
  bool bool_ = false;
  double num_ = 0;
  std::string str_;
  std::vector<Json> items_;
  std::vector<std::pair<std::string, Json>> members_;
};

// Python float repr (e.g. 1e+16, 1e-05, 0.0001, 2.5, -0.0, inf/nan as Infinity/NaN in JSON).
std::string python_float_repr(double v);
// JSON string literal with json.dumps(ensure_ascii=False) escaping, quotes included.
void append_json_string(std::string& out, std::string_view s);

}  // namespace kestrel::chat
