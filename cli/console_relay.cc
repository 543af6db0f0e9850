#include "cli/console_relay.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>

#include "common/errno_check.h"

namespace lockstep::cli {
namespace {

constexpr int64_t kMaxReadBytes = 1 << 20;       // from one log per Poll
constexpr int64_t kMaxPollBytes = 8 << 20;       // from all logs together per Poll
// The agent passes a line on in pieces of at most 64 KiB after its "[rank N] " prefix
// (worker/agent/child_process.cc); a longer run without a newline is cut here too.
constexpr size_t kMaxLineBytes = (64 << 10) + 32;

// "[rank 12] ...": the prefix the exec agent puts on its command's lines; the rank, or -1.
int64_t RankOfLine(const std::string& line) {
  static const std::string kPrefix = "[rank ";
  if (line.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
  size_t i = kPrefix.size();
  int64_t rank = 0;
  const size_t digits_start = i;
  while (i < line.size() && std::isdigit(static_cast<unsigned char>(line[i])) && i < 16) {
    rank = rank * 10 + (line[i] - '0');
    ++i;
  }
  if (i == digits_start || line.compare(i, 2, "] ") != 0) return -1;
  return rank;
}

}  // namespace

StatusOr<ConsoleRanks> ParseConsoleRanks(const std::string& text) {
  if (text == "all") return ConsoleRanks::kAll;
  if (text == "rank0") return ConsoleRanks::kRankZero;
  if (text == "none") return ConsoleRanks::kNone;
  return InvalidArgumentError("--console: expected all, rank0 or none, got \"" + text + "\"");
}

ConsoleRelay::ConsoleRelay(const std::vector<std::string>& log_paths, ConsoleRanks ranks)
    : ranks_(ranks) {
  for (const std::string& path : log_paths) {
    Log log;
    log.path = path;
    // Logs are appended to: what an earlier run with the same --log-dir wrote is not this run's.
    struct stat info {};
    if (stat(path.c_str(), &info) == 0) log.offset = info.st_size;
    logs_.push_back(std::move(log));
  }
}

bool ConsoleRelay::Wanted(const std::string& line) const {
  const int64_t rank = RankOfLine(line);
  switch (ranks_) {
    case ConsoleRanks::kAll:
      return rank >= 0;
    case ConsoleRanks::kRankZero:
      return rank == 0;
    case ConsoleRanks::kNone:
      return false;
  }
  return false;
}

void ConsoleRelay::Take(Log& log, std::string piece, bool complete,
                        std::vector<std::string>& out) const {
  const bool wanted = log.continuation ? log.relaying : Wanted(piece);
  // A cut that fell right before the newline leaves nothing to print.
  if (wanted && !(log.continuation && piece.empty())) out.push_back(std::move(piece));
  // A piece cut at the bound is followed by the rest of its line, relayed with it or not at all.
  log.continuation = !complete;
  log.relaying = !complete && wanted;
}

std::vector<std::string> ConsoleRelay::Poll() {
  std::vector<std::string> out;
  read_last_poll_ = false;
  if (ranks_ == ConsoleRanks::kNone) return out;
  int64_t budget = kMaxPollBytes;
  for (Log& log : logs_) {
    if (budget <= 0) break;
    int fd;
    LOCKSTEP_SYSCALL_RETRY(fd, open(log.path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd < 0) continue;  // not created yet
    struct stat info {};
    if (fstat(fd, &info) != 0 || info.st_size <= log.offset) {
      close(fd);
      continue;
    }
    const int64_t length =
        std::min({info.st_size - log.offset, kMaxReadBytes, budget});
    std::string chunk(static_cast<size_t>(length), '\0');
    ssize_t n;
    LOCKSTEP_SYSCALL_RETRY(n, pread(fd, chunk.data(), chunk.size(), log.offset));
    close(fd);
    if (n <= 0) continue;
    chunk.resize(static_cast<size_t>(n));
    log.offset += n;
    budget -= n;
    read_last_poll_ = true;
    log.partial += chunk;
    size_t start = 0;
    for (size_t newline; (newline = log.partial.find('\n', start)) != std::string::npos;) {
      Take(log, log.partial.substr(start, newline - start), /*complete=*/true, out);
      start = newline + 1;
    }
    log.partial.erase(0, start);
    while (log.partial.size() > kMaxLineBytes) {
      Take(log, log.partial.substr(0, kMaxLineBytes), /*complete=*/false, out);
      log.partial.erase(0, kMaxLineBytes);
    }
  }
  return out;
}

}  // namespace lockstep::cli
