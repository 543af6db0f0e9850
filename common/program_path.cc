#include "common/program_path.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace lockstep {

StatusOr<std::string> ResolveProgram(const std::string& name, const std::string& path_env) {
  if (name.empty()) return InvalidArgumentError("empty command");
  if (name.find('/') != std::string::npos) return name;
  std::string first_existing;
  size_t start = 0;
  while (start <= path_env.size()) {
    size_t end = path_env.find(':', start);
    if (end == std::string::npos) end = path_env.size();
    std::string dir = path_env.substr(start, end - start);
    if (dir.empty()) dir = ".";  // POSIX: an empty PATH entry is the current directory
    const std::string candidate = dir + "/" + name;
    struct stat info {};
    if (stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode)) {
      if (access(candidate.c_str(), X_OK) == 0) return candidate;
      if (first_existing.empty()) first_existing = candidate;
    }
    start = end + 1;
  }
  if (!first_existing.empty()) return first_existing;
  return NotFoundError("command not found: " + name + " (searched PATH=" + path_env + ")");
}

namespace {

bool Exists(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0;
}

// The PT_INTERP of a 64-bit ELF file whose first `size` bytes are `head`; "" when it has none
// within them. Every offset is compared with what is left, never added to: a file's header may
// hold any number.
std::string ElfInterpreter(const char* head, size_t size) {
  if (size < sizeof(Elf64_Ehdr)) return "";
  Elf64_Ehdr header;
  std::memcpy(&header, head, sizeof(header));
  if (header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_phentsize != sizeof(Elf64_Phdr)) {
    return "";
  }
  for (uint64_t i = 0; i < header.e_phnum; ++i) {
    if (header.e_phoff > size || (size - header.e_phoff) / sizeof(Elf64_Phdr) <= i) return "";
    Elf64_Phdr program;
    std::memcpy(&program, head + header.e_phoff + i * sizeof(Elf64_Phdr), sizeof(program));
    if (program.p_type != PT_INTERP) continue;
    if (program.p_filesz == 0 || program.p_offset > size ||
        program.p_filesz > size - program.p_offset) {
      return "";
    }
    return std::string(head + program.p_offset, strnlen(head + program.p_offset, program.p_filesz));
  }
  return "";
}

}  // namespace

std::string MissingInterpreter(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char head[4096];
  size_t size = 0;
  while (size < sizeof(head)) {
    const ssize_t got = read(fd, head + size, sizeof(head) - size);
    if (got <= 0) break;
    size += static_cast<size_t>(got);
  }
  close(fd);
  std::string interpreter;
  if (size > 2 && head[0] == '#' && head[1] == '!') {
    const std::string line(head + 2, strnlen(head + 2, size - 2));
    const size_t begin = line.find_first_not_of(" \t");
    if (begin == std::string::npos) return "";
    const size_t end = line.find_first_of(" \t\r\n", begin);
    interpreter = line.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  } else if (size > 4 && std::memcmp(head, ELFMAG, SELFMAG) == 0) {
    interpreter = ElfInterpreter(head, size);
  }
  return !interpreter.empty() && !Exists(interpreter) ? interpreter : "";
}

}  // namespace lockstep
