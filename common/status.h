// Status and Result<T>: how errors travel across every weft boundary.
//
// A Status is either OK or carries a code and a message. The codes separate what a caller can do
// about the error: fix its input (kInvalidArgument), look elsewhere (kNotFound), re-read and retry
// the race (kConflict), retry later (kUnavailable, kTimeout), or give up on corrupted data
// (kDataLoss). kInternal is for invariants we failed to keep. Context is added as an error travels
// up: `status.WithContext("reading model.safetensors")` prefixes the message.
//
// Result<T> holds either a value or a non-OK Status. Both types are cheap to move, not thread-safe
// to mutate concurrently, and never throw.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace weft {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,  // the input is malformed or out of range; retrying the same input fails again
  kNotFound,         // the named thing does not exist
  kConflict,         // a concurrent writer won (compare-and-swap lost, version exists)
  kUnavailable,      // transient: the peer or resource is down; retry with backoff
  kTimeout,          // a deadline passed
  kDataLoss,         // stored or transmitted data is corrupted or truncated
  kInternal,         // a bug: an invariant did not hold
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "<context>: <message>"; OK stays OK.
  Status WithContext(std::string_view context) const;
  // "invalid argument: <message>" for logs and command-line output.
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message));
}
inline Status NotFound(std::string message) {
  return Status(StatusCode::kNotFound, std::move(message));
}
inline Status Conflict(std::string message) {
  return Status(StatusCode::kConflict, std::move(message));
}
inline Status Unavailable(std::string message) {
  return Status(StatusCode::kUnavailable, std::move(message));
}
inline Status Timeout(std::string message) {
  return Status(StatusCode::kTimeout, std::move(message));
}
inline Status DataLoss(std::string message) {
  return Status(StatusCode::kDataLoss, std::move(message));
}
inline Status Internal(std::string message) {
  return Status(StatusCode::kInternal, std::move(message));
}

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!status_.ok() && "a Result built from a Status must carry an error");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  // By value, so that `for (auto& x : F().value())` and `auto& x = F().value()` hold the value
  // itself rather than a reference into the Result that dies at the end of the expression.
  T value() && {
    assert(ok());
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace weft

#define WEFT_CONCAT_INNER(a, b) a##b
#define WEFT_CONCAT(a, b) WEFT_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` is not OK.
#define WEFT_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::weft::Status weft_status_ = (expr);        \
    if (!weft_status_.ok()) return weft_status_; \
  } while (0)

// `WEFT_ASSIGN_OR_RETURN(auto x, MakeX());` binds the value or returns the error.
#define WEFT_ASSIGN_OR_RETURN(lhs, expr) \
  WEFT_ASSIGN_OR_RETURN_IMPL(WEFT_CONCAT(weft_result_, __LINE__), lhs, expr)
#define WEFT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
