#include "worker/trainer/sample_accounting.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/logging.h"

namespace lockstep::trainer {

void CountGlobalBatch(const std::vector<int64_t>& order, int64_t begin, int64_t end,
                      std::vector<int32_t>& counts) {
  for (int64_t position = begin; position < end; ++position) {
    int32_t& count = counts[static_cast<size_t>(order[static_cast<size_t>(position)])];
    if (count < INT32_MAX) ++count;
  }
}

EpochAccount SummariseEpoch(const std::vector<int64_t>& order, size_t consumed,
                            const std::vector<int32_t>& counts) {
  EpochAccount account;
  account.samples = static_cast<int64_t>(counts.size());
  for (int32_t count : counts) {
    if (count == 0) {
      ++account.never;
    } else if (count == 1) {
      ++account.trained_once;
    } else {
      ++account.more_than_once;
    }
  }
  // Exact when the consumed prefix of the order was trained once each and nothing else was: with
  // trained_once == consumed and none more than once, every other id is then untrained.
  bool prefix_once = consumed <= order.size();
  for (size_t position = 0; prefix_once && position < consumed; ++position) {
    prefix_once = counts[static_cast<size_t>(order[position])] == 1;
  }
  account.complete = prefix_once && account.more_than_once == 0 &&
                     account.trained_once == static_cast<int64_t>(consumed);
  return account;
}

std::string FormatEpochAccount(int64_t epoch, int64_t step, bool partial, size_t consumed,
                               const EpochAccount& account) {
  std::ostringstream line;
  line << "{\"epoch\": " << epoch << ", \"samples\": " << account.samples
       << ", \"trained_once\": " << account.trained_once << ", \"never\": " << account.never
       << ", \"more_than_once\": " << account.more_than_once
       << ", \"complete\": " << (account.complete ? "true" : "false")
       << ", \"partial\": " << (partial ? "true" : "false") << ", \"consumed\": " << consumed
       << ", \"step\": " << step << "}";
  return line.str();
}

bool EpochAccounted(const std::string& path, int64_t epoch) {
  std::ifstream in(path);
  const std::string prefix = "{\"epoch\": " + std::to_string(epoch) + ",";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0 && line.find("\"partial\": false") != std::string::npos) {
      return true;
    }
  }
  return false;
}

void AppendEpochAccounting(const std::string& path, int64_t epoch, int64_t step, bool partial,
                           const std::vector<int64_t>& order, size_t consumed,
                           const std::vector<int32_t>& counts) {
  const EpochAccount account = SummariseEpoch(order, consumed, counts);
  const std::string line = FormatEpochAccount(epoch, step, partial, consumed, account) + "\n";
  if (!account.complete) {
    LOCKSTEP_LOG(ERROR) << "sample accounting: epoch " << epoch << " is not exact: " << line;
  }
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    LOCKSTEP_LOG(WARNING) << "sample accounting: cannot open " << path << ": "
                          << std::strerror(errno);
    return;
  }
  ssize_t written = 0;
  do {
    written = write(fd, line.data(), line.size());
  } while (written < 0 && errno == EINTR);
  if (written != static_cast<ssize_t>(line.size())) {
    LOCKSTEP_LOG(WARNING) << "sample accounting: short write to " << path;
  }
  close(fd);
}

}  // namespace lockstep::trainer
