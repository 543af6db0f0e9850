// Leveled logging with context.
//
// Every line carries the process's context (in the worker: job, rank and generation; in the
// operator: namespace/name per reconcile), so a line from a multi-worker run says who wrote it:
//
//   2026-11-21T21:50:03.120Z I [job=default/fashion rank=1 gen=2] joined generation 2 (world 4)
//
//   SetLogContext("job=default/fashion rank=1 gen=2");
//   LOCKSTEP_LOG(INFO) << "joined generation " << generation;
//
// The level comes from LOCKSTEP_LOG_LEVEL (debug|info|warning|error; default info). Each line is
// written with one write(2) so lines from threads and processes never interleave. Never log a
// secret (the job token).
#pragma once

#include <sstream>
#include <string>

namespace lockstep {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Thread-safe. The context appears in brackets on every line after the call.
void SetLogContext(const std::string& context);
std::string GetLogContext();
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
bool LogEnabled(LogLevel level);

namespace internal {
class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace internal

}  // namespace lockstep

#define LOCKSTEP_LOG_LEVEL_DEBUG ::lockstep::LogLevel::kDebug
#define LOCKSTEP_LOG_LEVEL_INFO ::lockstep::LogLevel::kInfo
#define LOCKSTEP_LOG_LEVEL_WARNING ::lockstep::LogLevel::kWarning
#define LOCKSTEP_LOG_LEVEL_ERROR ::lockstep::LogLevel::kError

// LOCKSTEP_LOG(INFO) << "message"; the stream is not evaluated when the level is disabled.
#define LOCKSTEP_LOG(severity)                                    \
  if (!::lockstep::LogEnabled(LOCKSTEP_LOG_LEVEL_##severity)) {   \
  } else                                                          \
    ::lockstep::internal::LogLine(LOCKSTEP_LOG_LEVEL_##severity, __FILE__, __LINE__).stream()
