#include "worker/agent/exec_environment.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <set>

#include "common/env.h"
#include "common/errno_check.h"
#include "worker/agent/parked_loader.h"

namespace lockstep::agent {

std::string FindPythonHelpers(const std::string& worker_binary) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path binary = fs::canonical(worker_binary, error);
  if (error) return "";
  const fs::path helpers = binary.parent_path().parent_path() / "lib" / "lockstep" / "python";
  return fs::is_directory(helpers / "lockstep", error) ? helpers.string() : "";
}

StatusOr<int32_t> PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus("master port: socket", errno);
  struct sockaddr_in address {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoStatus("master port: bind", error);
  }
  socklen_t length = sizeof(address);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoStatus("master port: getsockname", error);
  }
  close(fd);
  return static_cast<int32_t>(ntohs(address.sin_port));
}

std::vector<std::string> RestoreParkedLoaderVariables(const std::vector<std::string>& env) {
  const std::string prefix = std::string(kParkedLoaderPrefix) + kLoaderVariablePrefix;
  const size_t parked_size = std::string(kParkedLoaderPrefix).size();
  std::vector<std::string> restored;
  std::vector<std::string> names;  // of the variables given back
  for (const std::string& entry : env) {
    if (entry.compare(0, prefix.size(), prefix) == 0 && entry.find('=') != std::string::npos) {
      restored.push_back(entry.substr(parked_size));
      names.push_back(restored.back().substr(0, restored.back().find('=') + 1));
    }
  }
  for (const std::string& entry : env) {
    if (entry.compare(0, prefix.size(), prefix) == 0) continue;
    bool replaced = false;
    for (const std::string& name : names) replaced |= entry.compare(0, name.size(), name) == 0;
    if (!replaced) restored.push_back(entry);
  }
  return restored;
}

StatusOr<PrivateDirectory> PrivateDirectory::Create(const std::string& parent) {
  std::string pattern =
      (parent.empty() ? EnvString("TMPDIR", "/tmp") : parent) + "/lockstep-exec-XXXXXX";
  if (mkdtemp(pattern.data()) != nullptr) return PrivateDirectory(pattern);
  const int error = errno;
  // An image without /tmp (scratch, some distroless ones): every container has /dev/shm.
  std::string fallback = "/dev/shm/lockstep-exec-XXXXXX";
  if (parent.empty() && mkdtemp(fallback.data()) != nullptr) return PrivateDirectory(fallback);
  return ErrnoStatus("mkdtemp " + pattern, error);
}

PrivateDirectory::PrivateDirectory(PrivateDirectory&& other) noexcept
    : path_(std::move(other.path_)) {
  other.path_.clear();
}

PrivateDirectory::~PrivateDirectory() {
  if (path_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::vector<std::pair<std::string, std::string>> IdentityVariables(
    const rendezvous::Assignment& assignment, const GenerationPlan& plan) {
  // A pod of several ranks is torchrun's multi-process node: the local world is the pod and
  // the group is the pod. A pod of one rank is a node of its own, but several such pods may
  // share a machine (`lockstep run`), so the local world is the members on this host.
  const bool pod_of_ranks = assignment.local_world_size > 1;
  const int32_t local_rank = pod_of_ranks ? assignment.local_rank : assignment.host.local_rank;
  const int32_t local_world_size =
      pod_of_ranks ? assignment.local_world_size : assignment.host.local_size;
  const std::string rank = std::to_string(assignment.rank);
  const std::string world = std::to_string(assignment.world_size);
  const std::string group = pod_of_ranks ? std::to_string(assignment.pod_rank) : rank;
  const std::string groups = pod_of_ranks ? std::to_string(assignment.pod_count) : world;
  return {
      {"MASTER_ADDR", plan.master_addr},
      {"MASTER_PORT", std::to_string(plan.master_port)},
      {"RANK", rank},
      {"WORLD_SIZE", world},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(local_world_size)},
      {"GROUP_RANK", group},
      {"GROUP_WORLD_SIZE", groups},
      {"ROLE_RANK", rank},
      {"ROLE_WORLD_SIZE", world},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(plan.restart_count)},
      {"LOCKSTEP_RANK", rank},
      {"LOCKSTEP_WORLD_SIZE", world},
      {"LOCKSTEP_GENERATION", std::to_string(assignment.generation)},
  };
}

namespace {

// The variables of the job, the same in every generation.
std::vector<std::pair<std::string, std::string>> JobVariables(const ExecEnvironmentExtras& extras) {
  std::vector<std::pair<std::string, std::string>> variables = {
      {"ROLE_NAME", "default"},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(extras.max_restarts)},
      {"TORCHELASTIC_RUN_ID", extras.run_id},
  };
  if (!extras.progress_file.empty()) {
    variables.emplace_back("LOCKSTEP_PROGRESS_FILE", extras.progress_file);
  }
  if (!extras.state_snapshot.empty()) {
    variables.emplace_back("LOCKSTEP_STATE_SNAPSHOT", extras.state_snapshot);
  }
  return variables;
}

// `inherited` without LOCKSTEP_JOB_TOKEN, kAwaitIdentityEnv and the names in `withheld`, then
// `variables`.
std::vector<std::string> BuildEnvironment(
    const std::vector<std::string>& inherited,
    const std::vector<std::pair<std::string, std::string>>& variables,
    const std::set<std::string>& withheld, const ExecEnvironmentExtras& extras) {
  std::set<std::string> replaced = withheld;
  for (const auto& [name, value] : variables) replaced.insert(name);
  std::vector<std::string> env;
  bool python_unbuffered = false;
  std::string python_path;
  for (const std::string& entry : inherited) {
    const std::string name = entry.substr(0, entry.find('='));
    // An inherited kAwaitIdentityEnv would guard a program that is not forked ahead.
    if (name == "LOCKSTEP_JOB_TOKEN" || name == kAwaitIdentityEnv || replaced.count(name) != 0) {
      continue;
    }
    if (name == "PYTHONUNBUFFERED") python_unbuffered = true;
    if (name == "PYTHONPATH") {
      if (name.size() < entry.size()) python_path = entry.substr(name.size() + 1);
      continue;
    }
    env.push_back(entry);
  }
  if (!python_unbuffered) env.push_back("PYTHONUNBUFFERED=1");
  // The helpers come after the user's own entries: a module of the program's wins.
  if (!extras.python_path.empty()) {
    python_path += (python_path.empty() ? "" : ":") + extras.python_path;
  }
  if (!python_path.empty()) env.push_back("PYTHONPATH=" + python_path);
  for (const auto& [name, value] : variables) env.push_back(name + "=" + value);
  return env;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> ExecVariables(
    const rendezvous::Assignment& assignment, const GenerationPlan& plan,
    const ExecEnvironmentExtras& extras) {
  std::vector<std::pair<std::string, std::string>> variables = IdentityVariables(assignment, plan);
  for (auto& variable : JobVariables(extras)) variables.push_back(std::move(variable));
  return variables;
}

std::vector<std::string> BuildExecEnvironment(const std::vector<std::string>& inherited,
                                              const rendezvous::Assignment& assignment,
                                              const GenerationPlan& plan,
                                              const ExecEnvironmentExtras& extras) {
  return BuildEnvironment(inherited, ExecVariables(assignment, plan, extras), {}, extras);
}

std::vector<std::string> BuildAwaitingEnvironment(const std::vector<std::string>& inherited,
                                                  const ExecEnvironmentExtras& extras) {
  std::set<std::string> withheld;
  std::string names;
  for (const auto& [name, value] : IdentityVariables({}, {})) {
    withheld.insert(name);
    names += (names.empty() ? "" : ",") + name;
  }
  std::vector<std::string> env =
      BuildEnvironment(inherited, JobVariables(extras), withheld, extras);
  env.push_back(std::string(kAwaitIdentityEnv) + "=" + names);
  return env;
}

}  // namespace lockstep::agent
