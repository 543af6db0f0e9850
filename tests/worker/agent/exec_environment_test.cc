// The environment a command gets: what torch.distributed's env:// and torchrun-aware scripts read.
#include "worker/agent/exec_environment.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

namespace lockstep::agent {
namespace {

rendezvous::Assignment Assign(int32_t rank, const std::vector<std::string>& hosts) {
  rendezvous::Assignment a;
  a.generation = 3;
  a.rank = rank;
  a.world_size = static_cast<int32_t>(hosts.size());
  a.first_host = hosts[0];
  a.host = rendezvous::PlaceOnHosts(hosts)[rank];
  return a;
}

std::map<std::string, std::string> AsMap(const std::vector<std::string>& env) {
  std::map<std::string, std::string> map;
  for (const std::string& entry : env) {
    const size_t eq = entry.find('=');
    EXPECT_EQ(map.count(entry.substr(0, eq)), 0u) << "duplicate " << entry;
    map[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return map;
}

GenerationPlan Plan() {
  GenerationPlan plan;
  plan.master_addr = "10.0.0.1";
  plan.master_port = 29400;
  plan.restart_count = 2;
  return plan;
}

TEST(ExecEnvironment, SetsWhatTorchEnvInitNeeds) {
  ExecEnvironmentExtras extras{"default/ddp", 6, "/tmp/x/progress.jsonl", "/opt/lockstep/python", ""};
  auto env =
      AsMap(BuildExecEnvironment({"PATH=/usr/bin", "RANK=99"},
                                 Assign(2, {"10.0.0.1", "10.0.0.2", "10.0.0.2"}), Plan(), extras));
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "29400");
  EXPECT_EQ(env["RANK"], "2") << "the agent's value overrides an inherited one";
  EXPECT_EQ(env["WORLD_SIZE"], "3");
  EXPECT_EQ(env["GROUP_RANK"], "2");
  EXPECT_EQ(env["ROLE_RANK"], "2");
  EXPECT_EQ(env["ROLE_WORLD_SIZE"], "3");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "6");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "default/ddp");
  EXPECT_EQ(env["LOCKSTEP_PROGRESS_FILE"], "/tmp/x/progress.jsonl");
  EXPECT_EQ(env["LOCKSTEP_GENERATION"], "3");
  EXPECT_EQ(env["PATH"], "/usr/bin");
  EXPECT_EQ(env["PYTHONUNBUFFERED"], "1");
  EXPECT_EQ(env["PYTHONPATH"], "/opt/lockstep/python") << "import lockstep.progress works";
}

TEST(ExecEnvironment, TheHelpersComeAfterTheUsersOwnPythonPath) {
  ExecEnvironmentExtras extras;
  extras.python_path = "/opt/lockstep/python";
  auto env = AsMap(BuildExecEnvironment({"PYTHONPATH=/work/src:/work/lib"}, Assign(0, {"h"}),
                                        Plan(), extras));
  EXPECT_EQ(env["PYTHONPATH"], "/work/src:/work/lib:/opt/lockstep/python");
  env = AsMap(BuildExecEnvironment({"PYTHONPATH=/work/src"}, Assign(0, {"h"}), Plan(), {}));
  EXPECT_EQ(env["PYTHONPATH"], "/work/src") << "no helpers found: left as inherited";
}

TEST(ExecEnvironment, LocalRankCountsMembersOnTheSameHost) {
  const std::vector<std::string> hosts = {"a", "b", "a", "b", "a"};
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"0", "3"}, {"0", "2"}, {"1", "3"}, {"1", "2"}, {"2", "3"}};
  for (int32_t rank = 0; rank < 5; ++rank) {
    auto env = AsMap(BuildExecEnvironment({}, Assign(rank, hosts), Plan(), {}));
    EXPECT_EQ(env["LOCAL_RANK"], expected[rank].first) << "rank " << rank;
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], expected[rank].second) << "rank " << rank;
  }
}

TEST(ExecEnvironment, LoopbackMembersShareOneHost) {
  auto env = AsMap(BuildExecEnvironment({}, Assign(1, {"127.0.0.1", "127.0.0.1"}), Plan(), {}));
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
}

TEST(ExecEnvironment, JobTokenIsNotHandedToTheCommand) {
  auto env = BuildExecEnvironment({"LOCKSTEP_JOB_TOKEN=secret", "LOCKSTEP_JOB=default/ddp"},
                                  Assign(0, {"h"}), Plan(), {});
  for (const std::string& entry : env) EXPECT_EQ(entry.find("secret"), std::string::npos);
  EXPECT_NE(std::find(env.begin(), env.end(), "LOCKSTEP_JOB=default/ddp"), env.end());
}

TEST(ExecEnvironment, KeepsAUsersPythonUnbuffered) {
  auto env = AsMap(BuildExecEnvironment({"PYTHONUNBUFFERED=0"}, Assign(0, {"h"}), Plan(), {}));
  EXPECT_EQ(env["PYTHONUNBUFFERED"], "0");
}

TEST(ExecEnvironment, AProgramStartedAheadOfAPlaceHasTheJobsVariablesButNoIdentity) {
  ExecEnvironmentExtras extras{"default/ddp", 6, "/tmp/x/progress.jsonl", "/opt/lockstep/python", ""};
  auto env = AsMap(BuildAwaitingEnvironment(
      {"PATH=/usr/bin", "RANK=99", "MASTER_ADDR=stale", "LOCKSTEP_JOB_TOKEN=secret"}, extras));
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "default/ddp");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "6");
  EXPECT_EQ(env["LOCKSTEP_PROGRESS_FILE"], "/tmp/x/progress.jsonl");
  EXPECT_EQ(env["PYTHONPATH"], "/opt/lockstep/python");
  EXPECT_EQ(env["PATH"], "/usr/bin");
  EXPECT_EQ(env.count("LOCKSTEP_JOB_TOKEN"), 0u);
  // Every variable the assignment sets is withheld (an inherited one too) and named.
  std::string named = env[kAwaitIdentityEnv];
  for (const auto& [name, value] : IdentityVariables(Assign(0, {"h"}), Plan())) {
    EXPECT_EQ(env.count(name), 0u) << name << " is set before the place";
    EXPECT_NE(("," + named + ",").find("," + name + ","), std::string::npos)
        << name << " is not named in " << named;
  }
  EXPECT_NE(named.find("RANK"), std::string::npos);
  EXPECT_NE(named.find("MASTER_ADDR"), std::string::npos);
}

TEST(ExecEnvironment, TheImagesLoaderVariablesParkedByTheLauncherReachTheProgram) {
  const std::vector<std::string> restored = RestoreParkedLoaderVariables(
      {"PATH=/usr/bin", "LOCKSTEP_IMAGE_LD_PRELOAD=/usr/lib/libjemalloc.so.2",
       "LOCKSTEP_IMAGE_LD_LIBRARY_PATH=/usr/local/cuda/lib64", "LD_LIBRARY_PATH=/elsewhere",
       "LOCKSTEP_IMAGE_LD_EMPTY=", "LOCKSTEP_IMAGE_TAG=3"});
  EXPECT_EQ(restored,
            (std::vector<std::string>{"LD_PRELOAD=/usr/lib/libjemalloc.so.2",
                                      "LD_LIBRARY_PATH=/usr/local/cuda/lib64",
                                      "LD_EMPTY=", "PATH=/usr/bin", "LOCKSTEP_IMAGE_TAG=3"}))
      << "an image's own LOCKSTEP_IMAGE_TAG is no loader variable: it stays";
  EXPECT_EQ(RestoreParkedLoaderVariables({"A=1", "B=2"}), (std::vector<std::string>{"A=1", "B=2"}));
}

}  // namespace
}  // namespace lockstep::agent
