#include "common/termination_message.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <iostream>

#include "common/env.h"
#include "common/errno_check.h"
#include "common/utf8.h"

namespace lockstep {

Status WriteTerminationMessage(const std::string& path, const std::string& message) {
  const std::string text = Utf8Prefix(message, kMaxTerminationMessageBytes);
  int fd;
  LOCKSTEP_SYSCALL_RETRY(fd, open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd < 0) return ErrnoStatus("open " + path, errno);
  size_t written = 0;
  while (written < text.size()) {
    ssize_t n;
    LOCKSTEP_SYSCALL_RETRY(n, write(fd, text.data() + written, text.size() - written));
    if (n < 0) {
      const int error = errno;
      close(fd);
      return ErrnoStatus("write " + path, error);
    }
    written += static_cast<size_t>(n);
  }
  close(fd);
  return OkStatus();
}

std::string ReadTerminationMessage(const std::string& path) {
  if (path.empty()) return "";
  std::ifstream in(path, std::ios::binary);
  std::string message(kMaxTerminationMessageBytes, '\0');
  in.read(message.data(), static_cast<std::streamsize>(message.size()));
  message.resize(static_cast<size_t>(in.gcount()));
  return message;
}

int ReportFatalError(const std::string& program, int code, const std::string& message) {
  std::string line = message;
  for (char& c : line) {
    if (c == '\n') c = ';';
  }
  std::cerr << program << ": error: " << line << std::endl;
  if (const std::string path = EnvString(kTerminationLogEnv, ""); !path.empty()) {
    if (Status written = WriteTerminationMessage(path, line); !written.ok()) {
      std::cerr << program << ": " << written.message() << std::endl;
    }
  }
  return code;
}

}  // namespace lockstep
