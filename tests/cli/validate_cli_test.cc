// `lockstep validate` as a user runs it: the binary, its exit code and what it prints.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/process/process.h"
#include "tests/support/process/scratch_files.h"

namespace lockstep::cli {
namespace {

using lockstep::testing::ProcessResult;
using lockstep::testing::ReadFile;
using lockstep::testing::RunProcess;
using lockstep::testing::ScratchDir;
using lockstep::testing::WriteFile;

constexpr int64_t kTimeoutMs = 60000;

ProcessResult Validate(const std::string& path) {
  return RunProcess({LOCKSTEP_BINARY, "validate", path}, {}, kTimeoutMs);
}

// The `# expect: <substring>` lines at the top of a bad manifest.
std::vector<std::string> ExpectedSubstrings(const std::string& path) {
  std::vector<std::string> expected;
  std::istringstream lines(ReadFile(path));
  std::string line;
  const std::string marker = "# expect:";
  while (std::getline(lines, line)) {
    if (line.rfind(marker, 0) != 0) {
      if (line.rfind("#", 0) == 0) continue;
      break;
    }
    std::string value = line.substr(marker.size());
    value.erase(0, value.find_first_not_of(" \t"));
    value.erase(value.find_last_not_of(" \t\r") + 1);
    if (!value.empty()) expected.push_back(value);
  }
  return expected;
}

bool SomeLineContains(const std::string& text, const std::string& needle) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find(needle) != std::string::npos) return true;
  }
  return false;
}

std::vector<std::string> BadManifests() {
  std::vector<std::string> paths;
  const std::string dir = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/data/bad_manifests";
  DIR* listing = opendir(dir.c_str());
  if (listing == nullptr) return paths;
  while (dirent* entry = readdir(listing)) {
    const std::string path = dir + "/" + entry->d_name;
    struct stat info {};
    if (entry->d_name[0] == '.' || stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) {
      continue;
    }
    paths.push_back(path);
  }
  closedir(listing);
  std::sort(paths.begin(), paths.end());
  return paths;
}

TEST(ValidateCommandTest, EveryBadManifestExits2WithItsExpectedMessage) {
  const std::vector<std::string> paths = BadManifests();
  if (paths.empty()) GTEST_SKIP() << "tests/data/bad_manifests has no files yet";
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    const std::vector<std::string> expected = ExpectedSubstrings(path);
    EXPECT_FALSE(expected.empty()) << "no '# expect:' line";
    ProcessResult result = Validate(path);
    ASSERT_FALSE(result.timed_out);
    EXPECT_FALSE(result.signaled) << "crashed with signal " << result.signal;
    EXPECT_LT(result.exit_code, 128);
    EXPECT_EQ(result.exit_code, 2) << result.out << result.err;
    for (const std::string& needle : expected) {
      EXPECT_TRUE(SomeLineContains(result.out + "\n" + result.err, needle))
          << "expected a line containing \"" << needle << "\"; got:\n"
          << result.out << result.err;
    }
  }
}

// Every TrainingJob the repository offers as an example (examples/*.yaml; examples/kueue/ holds
// Kueue's own objects) is valid as shipped. The click log's manifest reads data its page says to
// write first: written here, small, beside a copy of it.
TEST(ValidateCommandTest, EveryExampleManifestIsValid) {
  const std::filesystem::path examples = std::filesystem::path(LOCKSTEP_SOURCE_DIR) / "examples";
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(examples)) {
    if (entry.is_regular_file() && entry.path().extension() == ".yaml") {
      paths.push_back(entry.path().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  ASSERT_GE(paths.size(), 8u) << "examples/ lost its manifests";
  ScratchDir scratch("validate-examples");
  for (std::string path : paths) {
    if (std::filesystem::path(path).filename() == "click-log.yaml") {
      const ProcessResult written =
          RunProcess({LOCKSTEP_CLICK_LOG_BINARY, "--samples", "2000", "--test-samples", "500",
                      (scratch / "data" / "click-log").string()},
                     {}, kTimeoutMs);
      ASSERT_EQ(written.exit_code, 0) << written.out << written.err;
      const std::string copy = (scratch / "click-log.yaml").string();
      WriteFile(copy, ReadFile(path));
      path = copy;
    }
    ProcessResult result = Validate(path);
    EXPECT_EQ(result.exit_code, 0) << path << "\n" << result.out << result.err;
    EXPECT_TRUE(SomeLineContains(result.out, path + ": ")) << result.out;
  }
}

TEST(ValidateCommandTest, APipelineJobIsToldItsMemoryPerRankWithAndWithoutThePipeline) {
  const std::string path = std::string(LOCKSTEP_SOURCE_DIR) + "/examples/pipeline.yaml";
  ProcessResult result = Validate(path);
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  // 784-512-256-256-128-10 in 2 balanced stages: the first holds the 784 x 512 layer.
  EXPECT_TRUE(SomeLineContains(result.out, "estimated memory per rank: "));
  EXPECT_TRUE(SomeLineContains(result.out, "(stage 0 of 2: model 6.1 MiB for 401920 parameters"))
      << result.out;
  EXPECT_TRUE(SomeLineContains(result.out,
                               "with the pipeline; 220 MiB (model 9.7 MiB for 633226 "
                               "parameters"))
      << result.out;
}

TEST(ValidateCommandTest, MissingFileExits2NamingIt) {
  ProcessResult result = Validate("/nonexistent/job.yaml");
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("/nonexistent/job.yaml"), std::string::npos) << result.err;
}

TEST(ValidateCommandTest, UsageErrorsExit2WithUsage) {
  for (const std::vector<std::string>& argv :
       std::vector<std::vector<std::string>>{{LOCKSTEP_BINARY},
                                             {LOCKSTEP_BINARY, "validate"},
                                             {LOCKSTEP_BINARY, "validate", "a.yaml", "b.yaml"},
                                             {LOCKSTEP_BINARY, "frobnicate"},
                                             {LOCKSTEP_BINARY, "run"},
                                             {LOCKSTEP_BINARY, "run", "x.yaml", "--bogus"}}) {
    ProcessResult result = RunProcess(argv, {}, kTimeoutMs);
    EXPECT_EQ(result.exit_code, 2) << argv.back();
    // "usage:" (lockstep's own) or CLI11's "Usage:" (a command's).
    std::string lower = result.err;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    EXPECT_NE(lower.find("usage:"), std::string::npos) << argv.back() << ": " << result.err;
  }
}

TEST(ValidateCommandTest, HelpExits0) {
  ProcessResult result = RunProcess({LOCKSTEP_BINARY, "--help"}, {}, kTimeoutMs);
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_NE(result.out.find("run FILE"), std::string::npos) << result.out;
}

}  // namespace
}  // namespace lockstep::cli
