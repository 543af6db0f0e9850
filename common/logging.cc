#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

namespace lockstep {
namespace {

std::mutex& ContextMutex() {
  static std::mutex mu;
  return mu;
}
std::string& Context() {
  static std::string context;
  return context;
}

LogLevel LevelFromEnv() {
  const char* value = std::getenv("LOCKSTEP_LOG_LEVEL");
  if (value == nullptr) return LogLevel::kInfo;
  if (std::strcmp(value, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(value, "warning") == 0) return LogLevel::kWarning;
  if (std::strcmp(value, "error") == 0) return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int>& Level() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnv())};
  return level;
}

char LevelLetter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return 'D';
    case LogLevel::kInfo: return 'I';
    case LogLevel::kWarning: return 'W';
    case LogLevel::kError: return 'E';
  }
  return '?';
}

}  // namespace

void SetLogContext(const std::string& context) {
  std::lock_guard<std::mutex> lock(ContextMutex());
  Context() = context;
}

std::string GetLogContext() {
  std::lock_guard<std::mutex> lock(ContextMutex());
  return Context();
}

void SetLogLevel(LogLevel level) { Level().store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(Level().load()); }
bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= Level().load(); }

namespace internal {

LogLine::LogLine(LogLevel level, const char* file, int line) : level_(level) {
  auto now = std::chrono::system_clock::now();
  std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm utc;
  gmtime_r(&seconds, &utc);
  char stamp[40];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);
  char millis_text[8];
  std::snprintf(millis_text, sizeof(millis_text), ".%03dZ", millis);
  stream_ << stamp << millis_text << ' ' << LevelLetter(level) << ' ';
  std::string context = GetLogContext();
  if (!context.empty()) stream_ << '[' << context << "] ";
  if (level_ == LogLevel::kDebug) {
    const char* base = std::strrchr(file, '/');
    stream_ << (base ? base + 1 : file) << ':' << line << ' ';
  }
}

LogLine::~LogLine() {
  stream_ << '\n';
  const std::string text = stream_.str();
  // One write per line: lines of concurrent threads and processes stay whole.
  const char* data = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t written = ::write(STDERR_FILENO, data, left);
    if (written < 0) {
      if (errno == EINTR) continue;
      break;
    }
    data += written;
    left -= static_cast<size_t>(written);
  }
}

}  // namespace internal
}  // namespace lockstep
