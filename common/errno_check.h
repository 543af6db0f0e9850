// Checks for the errno domain (NCCL's checks.h is the model): a failed system call becomes a
// Status that says what was called, on what, and why, and EINTR is retried.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

#include "common/status.h"

namespace lockstep {

// "open /data/x: No such file or directory"
inline Status ErrnoStatus(const std::string& what, int error_number) {
  StatusCode code = StatusCode::kInternal;
  switch (error_number) {
    case ENOENT: code = StatusCode::kNotFound; break;
    case EACCES:
    case EPERM: code = StatusCode::kPermissionDenied; break;
    case EEXIST: code = StatusCode::kAlreadyExists; break;
    case ETIMEDOUT: code = StatusCode::kDeadlineExceeded; break;
    case ENOSPC: code = StatusCode::kResourceExhausted; break;
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE: code = StatusCode::kUnavailable; break;
    default: break;
  }
  return Status(code, what + ": " + std::strerror(error_number));
}

}  // namespace lockstep

// Evaluates `call` (a system call returning -1 on failure) again while it fails with EINTR.
#define LOCKSTEP_SYSCALL_RETRY(result, call) \
  do {                                       \
    (result) = (call);                       \
  } while ((result) == -1 && errno == EINTR)
