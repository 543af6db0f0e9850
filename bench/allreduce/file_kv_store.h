// FileKeyValueStore: a KeyValueStore over files in one directory, so that benchmark processes
// on one host can bootstrap a communicator without the rendezvous service. A value is written to
// a temporary file and renamed into place (readers never see half a value); Get polls every
// millisecond until its deadline. Add serialises through flock(2). Benchmarks only.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "common/errno_check.h"
#include "common/rendezvous/kv_store.h"

namespace lockstep::bench {

class FileKeyValueStore : public rendezvous::KeyValueStore {
 public:
  explicit FileKeyValueStore(std::string dir) : dir_(std::move(dir)) {}

  Status Set(const std::string& key, const std::string& value, int64_t timeout_ms) override {
    const std::string path = PathOf(key);
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << value;
      if (!out) return ErrnoStatus("write " + tmp, errno);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoStatus("rename " + tmp, errno);
    return OkStatus();
  }

  StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                         int64_t timeout_ms) override {
    const Deadline deadline = Deadline::AfterMs(timeout_ms);
    std::vector<std::string> values;
    for (const auto& key : keys) {
      for (;;) {
        std::ifstream in(PathOf(key), std::ios::binary);
        if (in) {
          std::ostringstream contents;
          contents << in.rdbuf();
          values.push_back(contents.str());
          break;
        }
        if (deadline.expired()) {
          return DeadlineExceededError("file store: key " + key + " not set within " +
                                       std::to_string(timeout_ms) + " ms");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    return values;
  }

  StatusOr<int64_t> Add(const std::string& key, int64_t delta, int64_t timeout_ms) override {
    const std::string lock_path = dir_ + "/.lock";
    int fd = open(lock_path.c_str(), O_CREAT | O_RDWR, 0644);
    if (fd < 0) return ErrnoStatus("open " + lock_path, errno);
    flock(fd, LOCK_EX);
    int64_t value = delta;
    {
      std::ifstream in(PathOf(key));
      int64_t old = 0;
      if (in >> old) value += old;
    }
    Status status = Set(key, std::to_string(value), timeout_ms);
    flock(fd, LOCK_UN);
    close(fd);
    if (!status.ok()) return status;
    return value;
  }

 private:
  std::string PathOf(const std::string& key) const {
    std::string name;
    for (char c : key) name += (c == '/' ? '_' : c);
    return dir_ + "/" + name;
  }

  std::string dir_;
};

}  // namespace lockstep::bench
