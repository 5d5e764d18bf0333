// Status and Result<T>: the error type of every fallible call in parasync.
//
// A Status is ok or carries a code and a message. Network, storage and GPU calls return one;
// exceptions from third-party libraries are caught and converted in the one file that talks
// to that library. Status values cross the wire as (code, message) and become a Status again
// on the other side. Immutable after construction; safe to copy between threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace parasync {

// The numbers are part of the wire protocol (schema/parasync.fbs, enum Code): never renumber.
enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,
  kUnavailable = 3,
  kTimedOut = 4,
  kAborted = 5,
  kCorruption = 6,
  kInternal = 7,
  kNotSupported = 8,
  kFailedPrecondition = 9,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status TimedOut(std::string m) { return {StatusCode::kTimedOut, std::move(m)}; }
  static Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status NotSupported(std::string m) { return {StatusCode::kNotSupported, std::move(m)}; }
  static Status FailedPrecondition(std::string m) {
    return {StatusCode::kFailedPrecondition, std::move(m)};
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>"; ok stays ok.
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Holds either a value or a non-ok Status. Constructing from an ok Status is a programmer
// bug and aborts.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status);                     // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  // The error; Status::Ok() when a value is held.
  Status status() const { return ok() ? Status::Ok() : std::get<1>(v_); }

  // Precondition for the accessors: ok().
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

[[noreturn]] void AbortOnOkStatusInResult();

template <typename T>
Result<T>::Result(Status status) : v_(std::move(status)) {
  if (std::get<1>(v_).ok()) AbortOnOkStatusInResult();
}

}  // namespace parasync

#define PARASYNC_CONCAT_INNER_(a, b) a##b
#define PARASYNC_CONCAT_(a, b) PARASYNC_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status) is not ok.
#define PARASYNC_RETURN_IF_ERROR(expr)             \
  do {                                             \
    ::parasync::Status parasync_status_ = (expr);  \
    if (!parasync_status_.ok()) return parasync_status_; \
  } while (0)

// `lhs = value of expr` (a Result<T>), or returns its Status from the enclosing function.
#define PARASYNC_ASSIGN_OR_RETURN(lhs, expr) \
  PARASYNC_ASSIGN_OR_RETURN_IMPL_(PARASYNC_CONCAT_(parasync_result_, __LINE__), lhs, expr)
#define PARASYNC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                    \
  if (!tmp.ok()) return tmp.status();                   \
  lhs = std::move(tmp).value()
