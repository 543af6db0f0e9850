// Installing the agent's bundle into a pod's volume (worker/agent/agent_install.h): what the
// operator's init container does before a user's image runs.
#include "worker/agent/agent_install.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "tests/support/process/scratch_files.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;

// A bundle as scripts/bundle/agent.sh lays it out, small.
std::string MakeBundle() {
  const std::string bundle = testing::MakeTempDir("bundle");
  fs::create_directories(bundle + "/bin");
  fs::create_directories(bundle + "/lib/lockstep/python/lockstep");
  testing::WriteFile(bundle + "/bin/lockstep-agent", "#!/bin/sh\n");
  chmod((bundle + "/bin/lockstep-agent").c_str(), 0755);
  testing::WriteFile(bundle + "/lib/libx.so.1.2", std::string(3 << 20, 'x'));
  fs::create_symlink("libx.so.1.2", bundle + "/lib/libx.so.1");
  testing::WriteFile(bundle + "/lib/lockstep/python/lockstep/__init__.py", "");
  testing::WriteFile(bundle + "/BUNDLE-INFO", "prefix=/lockstep\n");
  return bundle;
}

mode_t Mode(const std::string& path) {
  struct stat info {};
  EXPECT_EQ(lstat(path.c_str(), &info), 0) << path;
  return info.st_mode & 07777;
}

TEST(AgentInstall, CopiesTheWholeBundleWithItsModesAndLinksAndCanRunAgain) {
  const std::string bundle = MakeBundle();
  const std::string target = testing::MakeTempDir("volume") + "/agent";
  for (int round = 0; round < 2; ++round) {  // an init container run again finds its copy
    StatusOr<AgentInstallReport> report = InstallAgentBundle(bundle, target);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->files, 5);
    EXPECT_EQ(Mode(target + "/bin/lockstep-agent"), 0755u);
    EXPECT_EQ(testing::ReadFile(target + "/lib/libx.so.1.2").size(), size_t{3} << 20);
    EXPECT_EQ(fs::read_symlink(target + "/lib/libx.so.1"), "libx.so.1.2");
    EXPECT_TRUE(fs::exists(target + "/lib/lockstep/python/lockstep/__init__.py"));
    EXPECT_EQ(testing::ReadFile(target + "/BUNDLE-INFO"), "prefix=/lockstep\n");
    for (const auto& entry : fs::recursive_directory_iterator(target)) {
      EXPECT_EQ(entry.path().string().find(".partial"), std::string::npos) << entry.path();
    }
  }
}

TEST(AgentInstall, AVolumeThatCannotBeWrittenIsNamedWithTheCause) {
  const std::string bundle = MakeBundle();
  const std::string blocked = testing::MakeTempDir("volume") + "/not-a-folder";
  testing::WriteFile(blocked, "");
  StatusOr<AgentInstallReport> report = InstallAgentBundle(bundle, blocked + "/agent");
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().message(), "cannot create " + blocked + "/agent: Not a directory");
}

TEST(AgentInstall, OnlyABundlesOwnProgramKnowsWhereItsBundleIs) {
  const std::string bundle = MakeBundle();
  StatusOr<std::string> found = BundleOf(bundle + "/bin/lockstep-agent");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, fs::canonical(bundle).string());
  StatusOr<std::string> none = BundleOf("/bin/sh");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("is not part of an agent bundle"), std::string::npos)
      << none.status();
  EXPECT_FALSE(InstallAgentBundle(testing::MakeTempDir("empty"), "/tmp/x").ok());
}

}  // namespace
}  // namespace lockstep::agent
