// Status and StatusOr<T>: the one error type across Lockstep's module boundaries.
//
// A Status is either OK or carries a code and a message that names what went wrong (the field,
// file, value or peer). The message is for people and may be reworded in any release; where a
// caller must tell one error of a code from another (a full generation from a join that found too
// few members), the error carries a reason, a stable UPPER_SNAKE_CASE word (gRPC's ErrorInfo),
// and the caller reads that. Exceptions from third-party libraries (Gloo, cpprestsdk, yaml-cpp) are
// caught in the adapter that calls them and turned into a Status; they never cross a module or a
// thread.
//
//   StatusOr<TrainingJob> job = LoadTrainingJobFile(path);
//   if (!job.ok()) return job.status();
//   LOCKSTEP_ASSIGN_OR_RETURN(auto communicator, CreateGlooCommunicator(options));
//   LOCKSTEP_RETURN_IF_ERROR(communicator->Barrier(timeout_ms));
#pragma once

#include <cassert>
#include <optional>
#include <ostream>
#include <string>
#include <utility>

namespace lockstep {

// Codes follow absl/gRPC's canonical space so gRPC statuses map one to one.
enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "DEADLINE_EXCEEDED: rendezvous join: no generation formed within 30000 ms"
  std::string ToString() const;

  // Returns a copy whose message is "context: message"; OK stays OK. The reason is kept.
  Status WithContext(const std::string& context) const;

  // The error's stable machine-readable reason ("GENERATION_FULL"), empty when it has none.
  const std::string& reason() const { return reason_; }
  // Returns a copy carrying `reason`; OK stays OK.
  Status WithReason(std::string reason) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  std::string reason_;
};

std::ostream& operator<<(std::ostream& os, const Status& status);

inline Status OkStatus() { return Status(); }
inline Status CancelledError(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status UnknownError(std::string m) { return {StatusCode::kUnknown, std::move(m)}; }
inline Status InvalidArgumentError(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status DeadlineExceededError(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExistsError(std::string m) {
  return {StatusCode::kAlreadyExists, std::move(m)};
}
inline Status PermissionDeniedError(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}
inline Status ResourceExhaustedError(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status FailedPreconditionError(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status AbortedError(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status OutOfRangeError(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status UnimplementedError(std::string m) {
  return {StatusCode::kUnimplemented, std::move(m)};
}
inline Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status UnavailableError(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DataLossError(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status UnauthenticatedError(std::string m) {
  return {StatusCode::kUnauthenticated, std::move(m)};
}

// Holds either a T or a non-OK Status. Accessing the value of a non-OK StatusOr is a programming
// error (asserted in debug builds).
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const T& value) : value_(value) {}                  // NOLINT: implicit by design
  StatusOr(T&& value) : value_(std::move(value)) {}            // NOLINT
  StatusOr(Status status) : status_(std::move(status)) {       // NOLINT
    assert(!status_.ok() && "StatusOr built from an OK Status without a value");
    if (status_.ok()) status_ = InternalError("StatusOr built from OK status without a value");
  }
  template <typename U, typename = std::enable_if_t<std::is_convertible_v<U&&, T> &&
                                                    !std::is_same_v<std::decay_t<U>, Status> &&
                                                    !std::is_same_v<std::decay_t<U>, T>>>
  StatusOr(U&& value) : value_(T(std::forward<U>(value))) {}  // NOLINT

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
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace lockstep

#define LOCKSTEP_STATUS_CONCAT_INNER_(a, b) a##b
#define LOCKSTEP_STATUS_CONCAT_(a, b) LOCKSTEP_STATUS_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function if it is not OK.
#define LOCKSTEP_RETURN_IF_ERROR(expr)                            \
  do {                                                            \
    ::lockstep::Status lockstep_status_ = (expr);                 \
    if (!lockstep_status_.ok()) return lockstep_status_;          \
  } while (0)

// `lhs = value of expr`, or returns expr's Status from the enclosing function.
#define LOCKSTEP_ASSIGN_OR_RETURN(lhs, expr) \
  LOCKSTEP_ASSIGN_OR_RETURN_IMPL_(LOCKSTEP_STATUS_CONCAT_(lockstep_statusor_, __LINE__), lhs, expr)
#define LOCKSTEP_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                    \
  if (!statusor.ok()) return statusor.status();              \
  lhs = std::move(statusor).value()
