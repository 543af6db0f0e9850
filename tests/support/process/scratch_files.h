// Files of a test: fresh temporary directories, and whole-file reads and writes that fail the
// test rather than throw.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace lockstep::testing {

// A fresh empty directory $TMPDIR/<prefix>-XXXXXX (or under /tmp). Removed when the test program
// exits with no failed test; kept, with everything in it, when one failed. Fails the test
// (ADD_FAILURE) when it cannot be made.
std::string MakeTempDir(const std::string& prefix);
// The whole file; "" when it cannot be read.
std::string ReadFile(const std::string& path);
// The file as raw float32 values (a parameter dump: LOCKSTEP_DUMP_PARAMS); empty when unreadable.
std::vector<float> ReadFloats(const std::string& path);
// Replaces the file's content; fails the test when it cannot.
void WriteFile(const std::string& path, const std::string& text);

// A test's scratch directory (manifests, worker logs, dumps), lockstep-<name>-XXXXXX under the
// temporary directory. Removed at the end unless the test failed, so that the logs of a failure
// stay for reading.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  operator const std::filesystem::path&() const { return path_; }  // NOLINT: used where a path is

 private:
  std::filesystem::path path_;
};

}  // namespace lockstep::testing
