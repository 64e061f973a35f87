// ds41 core: Status and Result<T> — errors are values (ARCHITECTURE.md "Errors").
// A Status is either ok or carries a code and a message that names the file, tensor,
// field or limit involved. Result<T> holds a T or a non-ok Status. No exceptions cross
// library boundaries.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace ds41 {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad user input (request, flag, config value)
  kNotFound,         // missing file / tensor / key
  kDataLoss,         // corrupt or truncated data (checksum, short file)
  kIoError,          // OS-level I/O failure
  kOutOfRange,       // offsets / indices outside bounds
  kResourceExhausted,// capacity / memory / queue full
  kFailedPrecondition,
  kUnimplemented,
  kUnavailable,      // remote peer down / timed out
  kInternal,
};

const char* status_code_name(StatusCode c);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message" (or "OK").
  std::string to_string() const;

  // Returns a copy with "context: " prepended to the message.
  Status with_context(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status failed_precondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Result<T>: a value or an error Status. Access to value() on an error aborts.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}            // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {      // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "Result built from ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { check_ok(); return std::get<T>(v_); }
  const T& value() const& { check_ok(); return std::get<T>(v_); }
  T&& value() && { check_ok(); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void check_ok() const;
  std::variant<T, Status> v_;
};

[[noreturn]] void result_access_failed(const Status& s);

template <typename T>
void Result<T>::check_ok() const {
  if (!ok()) result_access_failed(std::get<Status>(v_));
}

}  // namespace ds41

// Propagate a non-ok Status from an expression returning Status.
#define DS41_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::ds41::Status ds41_status_ = (expr);        \
    if (!ds41_status_.ok()) return ds41_status_; \
  } while (0)

#define DS41_CONCAT_INNER_(a, b) a##b
#define DS41_CONCAT_(a, b) DS41_CONCAT_INNER_(a, b)
// DS41_ASSIGN_OR_RETURN(auto x, expr_returning_result);
#define DS41_ASSIGN_OR_RETURN(lhs, expr) \
  DS41_ASSIGN_OR_RETURN_IMPL_(DS41_CONCAT_(ds41_result_, __LINE__), lhs, expr)
#define DS41_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
