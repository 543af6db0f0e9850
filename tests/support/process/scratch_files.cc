#include "tests/support/process/scratch_files.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

namespace lockstep::testing {
namespace {

// The directories MakeTempDir made in this process. At exit, when no test of the program failed,
// they go: a suite run leaves nothing in /tmp (a CI machine that keeps its caches between runs
// would otherwise fill its disk), while a failure keeps every log to read. Only the process that
// made them removes them: a forked child that exits must not take its parent's files.
struct MadeDirs {
  std::mutex mu;
  std::vector<std::string> paths;
};

// The test program's own process, taken when it loads, before any test can fork.
const pid_t g_program_pid = getpid();

MadeDirs& Made() {
  static MadeDirs* made = new MadeDirs;  // never destroyed: the exit handler reads it
  return *made;
}

void RemoveMadeDirsUnlessAFailure() {
  if (getpid() != g_program_pid) return;
  MadeDirs& made = Made();
  const ::testing::UnitTest* unit = ::testing::UnitTest::GetInstance();
  if (unit == nullptr || unit->Failed()) return;
  // A thread still in MakeTempDir at exit: nothing is removed rather than waiting on it.
  std::unique_lock<std::mutex> lock(made.mu, std::try_to_lock);
  if (!lock.owns_lock()) return;
  for (const std::string& path : made.paths) {
    std::error_code ignored;  // a child still writing there: what is left stays
    std::filesystem::remove_all(path, ignored);
  }
  made.paths.clear();
}

}  // namespace

std::string MakeTempDir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << pattern << ": " << std::strerror(errno);
    return pattern;
  }
  MadeDirs& made = Made();
  std::lock_guard<std::mutex> lock(made.mu);
  if (getpid() == g_program_pid) {
    static const bool registered = std::atexit(RemoveMadeDirsUnlessAFailure) == 0;
    (void)registered;
    made.paths.push_back(pattern);
  }
  return pattern;
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

std::vector<float> ReadFloats(const std::string& path) {
  const std::string bytes = ReadFile(path);
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::trunc);
  file << text;
  if (!file) ADD_FAILURE() << "cannot write " << path;
}

ScratchDir::ScratchDir(const std::string& name) : path_(MakeTempDir("lockstep-" + name)) {}

ScratchDir::~ScratchDir() {
  if (!::testing::Test::HasFailure()) {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
}

}  // namespace lockstep::testing
