#include "chat/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace kestrel::chat {

Json Json::boolean(bool b) {
  Json j;
  j.type_ = Type::kBool;
  j.bool_ = b;
  return j;
}

Json Json::string(std::string s) {
  Json j;
  j.type_ = Type::kString;
  j.str_ = std::move(s);
  return j;
}

Json Json::array(std::vector<Json> items) {
  Json j;
  j.type_ = Type::kArray;
  j.items_ = std::move(items);
  return j;
}

Json Json::object(std::vector<std::pair<std::string, Json>> members) {
  Json j;
  j.type_ = Type::kObject;
  j.members_ = std::move(members);
  return j;
}

const Json* Json::find(std::string_view key) const {
  for (const auto& [k, v] : members_)
    if (k == key) return &v;
  return nullptr;
}

namespace {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

constexpr int kMaxDepth = 512;

}  // namespace

class JsonParser {
 public:
  explicit JsonParser(std::string_view s) : s_(s) {}

  Result<Json> run() {
    skip_ws();
    Json v;
    if (!value(v, 0)) return invalid_argument("invalid JSON at byte " + std::to_string(pos_) + ": " + err_);
    skip_ws();
    if (pos_ != s_.size()) return invalid_argument("invalid JSON at byte " + std::to_string(pos_) + ": extra data");
    return v;
  }

 private:
  bool fail(const char* m) {
    err_ = m;
    return false;
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool literal(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }

  bool value(Json& v, int depth) {
    if (depth > kMaxDepth) return fail("nesting too deep");
    if (pos_ >= s_.size()) return fail("unexpected end");
    const char c = s_[pos_];
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v.type_ = Json::Type::kString;
      return string(v.str_);
    }
    if (literal("null")) return true;
    if (literal("true")) return v = Json::boolean(true), true;
    if (literal("false")) return v = Json::boolean(false), true;
    if (literal("NaN")) return set_float(v, std::nan("")), true;
    if (literal("Infinity")) return set_float(v, HUGE_VAL), true;
    if (literal("-Infinity")) return set_float(v, -HUGE_VAL), true;
    return number(v);
  }

  static void set_float(Json& v, double d) {
    v.type_ = Json::Type::kFloat;
    v.num_ = d;
  }

  bool number(Json& v) {
    const size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    if (pos_ >= s_.size() || !isdigit(uint8_t(s_[pos_]))) return fail("expected a value");
    if (s_[pos_] == '0') {
      ++pos_;
    } else {
      while (pos_ < s_.size() && isdigit(uint8_t(s_[pos_]))) ++pos_;
    }
    bool is_float = false;
    if (pos_ + 1 < s_.size() && s_[pos_] == '.' && isdigit(uint8_t(s_[pos_ + 1]))) {
      is_float = true;
      pos_ += 2;
      while (pos_ < s_.size() && isdigit(uint8_t(s_[pos_]))) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < s_.size() && (s_[p] == '+' || s_[p] == '-')) ++p;
      if (p < s_.size() && isdigit(uint8_t(s_[p]))) {
        is_float = true;
        pos_ = p;
        while (pos_ < s_.size() && isdigit(uint8_t(s_[pos_]))) ++pos_;
      }
    }
    const std::string text(s_.substr(start, pos_ - start));
    if (is_float) {
      set_float(v, std::strtod(text.c_str(), nullptr));  // overflow gives ±HUGE_VAL like Python's float()
    } else {
      v.type_ = Json::Type::kInt;
      v.str_ = (text == "-0") ? "0" : text;
    }
    return true;
  }

  bool hex4(uint32_t& out) {
    if (pos_ + 4 > s_.size()) return fail("truncated \\u escape");
    out = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      out <<= 4;
      if (c >= '0' && c <= '9') out |= c - '0';
      else if (c >= 'a' && c <= 'f') out |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') out |= c - 'A' + 10;
      else return fail("bad \\u escape");
    }
    return true;
  }

  bool string(std::string& out) {
    ++pos_;  // opening quote
    while (true) {
      if (pos_ >= s_.size()) return fail("unterminated string");
      const char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (uint8_t(c) < 0x20) return fail("control character in string");  // json.loads strict=True
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      if (++pos_ >= s_.size()) return fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(pos_, 2) == "\\u") {
            const size_t save = pos_;
            pos_ += 2;
            uint32_t lo;
            if (!hex4(lo)) return false;
            if (lo >= 0xDC00 && lo < 0xE000) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else {
              pos_ = save;
            }
          }
          if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;
          append_utf8(out, cp);
          break;
        }
        default: return fail("bad escape");
      }
    }
  }

  bool array(Json& v, int depth) {
    ++pos_;
    v.type_ = Json::Type::kArray;
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == ']') return ++pos_, true;
    while (true) {
      skip_ws();
      Json item;
      if (!value(item, depth + 1)) return false;
      v.items_.push_back(std::move(item));
      skip_ws();
      if (pos_ >= s_.size()) return fail("unterminated array");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == ']') return ++pos_, true;
      return fail("expected , or ]");
    }
  }

  bool object(Json& v, int depth) {
    ++pos_;
    v.type_ = Json::Type::kObject;
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == '}') return ++pos_, true;
    while (true) {
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != '"') return fail("expected a key");
      std::string key;
      if (!string(key)) return false;
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != ':') return fail("expected :");
      ++pos_;
      skip_ws();
      Json item;
      if (!value(item, depth + 1)) return false;
      auto it = std::find_if(v.members_.begin(), v.members_.end(), [&](const auto& m) { return m.first == key; });
      if (it != v.members_.end()) {
        it->second = std::move(item);  // Python dict: first position, last value
      } else {
        v.members_.emplace_back(std::move(key), std::move(item));
      }
      skip_ws();
      if (pos_ >= s_.size()) return fail("unterminated object");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == '}') return ++pos_, true;
      return fail("expected , or }");
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
  const char* err_ = "";
};

Result<Json> Json::parse(std::string_view text) { return JsonParser(text).run(); }

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);  // shortest round-trip
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp10 = std::stoi(sci.substr(e + 1));
  std::string sign;
  if (mant[0] == '-') sign = "-", mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  const int decpt = exp10 + 1;  // digits d1 d2 ... with the point after `decpt` digits
  std::string out = sign;
  if (decpt > 16 || decpt < -3) {
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  } else if (decpt <= 0) {
    out += "0." + std::string(-decpt, '0') + digits;
  } else if (static_cast<size_t>(decpt) >= digits.size()) {
    out += digits + std::string(decpt - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  return out;
}

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (uint8_t(c) < 0x20) {
          char b[8];
          snprintf(b, sizeof b, "\\u%04x", unsigned(uint8_t(c)));
          out += b;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void Json::dump_to(std::string& out, bool compact) const {
  switch (type_) {
    case Type::kNull: out += "null"; break;
    case Type::kBool: out += bool_ ? "true" : "false"; break;
    case Type::kInt: out += str_; break;
    case Type::kFloat: out += python_float_repr(num_); break;
    case Type::kString: append_json_string(out, str_); break;
    case Type::kArray:
      out += '[';
      for (size_t i = 0; i < items_.size(); ++i) {
        if (i) out += compact ? "," : ", ";
        items_[i].dump_to(out, compact);
      }
      out += ']';
      break;
    case Type::kObject:
      out += '{';
      for (size_t i = 0; i < members_.size(); ++i) {
        if (i) out += compact ? "," : ", ";
        append_json_string(out, members_[i].first);
        out += compact ? ":" : ": ";
        members_[i].second.dump_to(out, compact);
      }
      out += '}';
      break;
  }
}

std::string Json::dump(bool compact) const {
  std::string out;
  dump_to(out, compact);
  return out;
}

Json Json::deep_sorted() const {
  Json j = *this;
  for (auto& it : j.items_) it = it.deep_sorted();
  for (auto& m : j.members_) m.second = m.second.deep_sorted();
  std::stable_sort(j.members_.begin(), j.members_.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  return j;
}

}  // namespace kestrel::chat
