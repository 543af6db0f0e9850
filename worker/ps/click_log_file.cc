#include "worker/ps/click_log_file.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "worker/trainer/random.h"

namespace lockstep::ps {
namespace {

constexpr uint64_t kIdMask = (uint64_t{1} << 40) - 1;

struct GzCloser {
  void operator()(gzFile file) const { gzclose(file); }
};
using GzHandle = std::unique_ptr<gzFile_s, GzCloser>;

// FNV-1a over the bytes, finished by the SplitMix64 output function.
uint64_t HashText(const char* text, size_t size) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; ++i) {
    hash ^= static_cast<unsigned char>(text[i]);
    hash *= 0x100000001b3ull;
  }
  return trainer::Mix64(hash);
}

}  // namespace

uint64_t ClickFeatureId(int32_t field, const std::string& text) {
  return (uint64_t{static_cast<uint32_t>(field)} << 40) |
         (HashText(text.data(), text.size()) & kIdMask);
}

StatusOr<ClickLog> ReadClickLogFile(const std::string& where, const std::string& path,
                                    int32_t fields) {
  const std::string prefix = where + ": " + path + ": ";
  if (fields < 1) return InvalidArgumentError(prefix + "fields must be 1 or more");
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return NotFoundError(prefix + "file not found");
    return InvalidArgumentError(prefix + std::strerror(errno));
  }
  if (!S_ISREG(info.st_mode)) return InvalidArgumentError(prefix + "not a regular file");
  GzHandle file(gzopen(path.c_str(), "rb"));
  if (file == nullptr) {
    if (errno == EACCES) return PermissionDeniedError(prefix + "cannot be read");
    return InvalidArgumentError(prefix + "cannot be opened");
  }
  gzbuffer(file.get(), 1u << 20);
  ClickLog log;
  log.fields = fields;
  std::vector<char> line(static_cast<size_t>(kMaxClickLogLineBytes) + 2);
  int64_t number = 0;
  while (gzgets(file.get(), line.data(), static_cast<int>(line.size())) != nullptr) {
    ++number;
    size_t length = std::strlen(line.data());
    const std::string at = prefix + "line " + std::to_string(number) + ": ";
    if (length > 0 && line[length - 1] == '\n') {
      --length;
    } else if (!gzeof(file.get())) {
      return InvalidArgumentError(at + "longer than " + std::to_string(kMaxClickLogLineBytes) +
                                  " bytes");
    }
    if (length > 0 && line[length - 1] == '\r') --length;
    if (length == 0) continue;
    const char* text = line.data();
    const char* end = text + length;
    const char* tab = static_cast<const char*>(std::memchr(text, '\t', length));
    const std::string label(text, tab == nullptr ? end : tab);
    if (label != "0" && label != "1") {
      return InvalidArgumentError(at + "label \"" + label.substr(0, 32) + "\" is not 0 or 1");
    }
    if (static_cast<int64_t>(log.ids.size()) + fields > kMaxClickLogIds) {
      return InvalidArgumentError(at + "more than " + std::to_string(kMaxClickLogIds / fields) +
                                  " samples of " + std::to_string(fields) +
                                  " features, the most one file may hold");
    }
    int32_t field = 0;
    for (const char* cursor = tab; cursor != nullptr && cursor < end; ++field) {
      const char* begin = cursor + 1;
      const char* next = static_cast<const char*>(std::memchr(begin, '\t', end - begin));
      const char* stop = next == nullptr ? end : next;
      if (field < fields) {
        log.ids.push_back((uint64_t{static_cast<uint32_t>(field)} << 40) |
                          (HashText(begin, static_cast<size_t>(stop - begin)) & kIdMask));
      }
      cursor = next;
    }
    if (field != fields) {
      return InvalidArgumentError(at + std::to_string(field) +
                                  " features, but model.embedding.fields is " +
                                  std::to_string(fields));
    }
    log.labels.push_back(label == "1" ? 1 : 0);
  }
  int error = Z_OK;
  const char* message = gzerror(file.get(), &error);
  if (error != Z_OK && error != Z_STREAM_END) {
    return InvalidArgumentError(prefix + "cannot be read: " + (message ? message : "zlib error"));
  }
  log.samples = static_cast<int64_t>(log.labels.size());
  if (log.samples == 0) return InvalidArgumentError(prefix + "holds no samples");
  return log;
}

Status WriteClickLogFile(const ClickLog& log, const std::string& path) {
  const std::string temporary = path + ".tmp";
  const bool gzip = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  GzHandle file(gzopen(temporary.c_str(), gzip ? "wb6" : "wbT"));
  if (file == nullptr) return InternalError("cannot create " + temporary);
  gzbuffer(file.get(), 1u << 20);
  std::string line;
  for (int64_t s = 0; s < log.samples; ++s) {
    line.assign(log.labels[static_cast<size_t>(s)] == 1 ? "1" : "0");
    for (int32_t f = 0; f < log.fields; ++f) {
      line.push_back('\t');
      line += std::to_string(log.ids[static_cast<size_t>(s) * static_cast<size_t>(log.fields) + f] &
                             kIdMask);
    }
    line.push_back('\n');
    if (gzwrite(file.get(), line.data(), static_cast<unsigned>(line.size())) !=
        static_cast<int>(line.size())) {
      unlink(temporary.c_str());
      return InternalError("cannot write " + temporary);
    }
  }
  if (gzclose(file.release()) != Z_OK || rename(temporary.c_str(), path.c_str()) != 0) {
    unlink(temporary.c_str());
    return InternalError("cannot write " + path);
  }
  return OkStatus();
}

}  // namespace lockstep::ps
