// Result<T>: the error-as-value type used at module boundaries (std::expected-shaped; C++20 has none).
// Expected failures (bad files, bad input, missing keys) travel as Status; invariants use KCHECK.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace kestrel {

enum class StatusCode { kOk, kInvalidArgument, kNotFound, kIo, kCorrupt, kUnsupported, kInternal, kUnavailable,
                        kTooLarge };

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::kIo, std::move(m)}; }
inline Status corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
inline Status unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }  // retry later (429/503)
inline Status too_large(std::string m) { return {StatusCode::kTooLarge, std::move(m)}; }

// Holds either a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design, like std::expected
  Result(Status status) : v_(std::move(status)) {}  // NOLINT
  bool has_value() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return has_value(); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Status& error() const { return std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

// Result<void> equivalent.
using VoidResult = Status;

}  // namespace kestrel

// Propagates a non-ok Status / failed Result from an expression returning Status.
#define KESTREL_RETURN_IF_ERROR(expr)          \
  do {                                         \
    ::kestrel::Status _st = (expr);            \
    if (!_st.is_ok()) return _st;              \
  } while (0)
