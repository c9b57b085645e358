#include "common/status.h"

namespace weft {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kConflict:
      return "conflict";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kTimeout:
      return "timeout";
    case StatusCode::kDataLoss:
      return "data loss";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string message(context);
  message += ": ";
  message += message_;
  return Status(code_, std::move(message));
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string text(StatusCodeName(code_));
  text += ": ";
  text += message_;
  return text;
}

}  // namespace weft
