// lockstep-agent: the exec agent alone, the program the operator brings into a user's own image
// (docs/exec.md, "Your own image"). It links no trainer, kernel, communicator or CUDA library, so
// that its bundle (scripts/bundle/agent.sh: the agent, its libraries, glibc and its loader) is
// small and runs in any image.
//
//   lockstep-agent exec [--manifest FILE] [--] COMMAND [ARG...]
//       as `lockstep-worker exec` (worker/agent/exec_agent.h): runs COMMAND as one member of
//       the job, with a pod of spec.ranksPerWorker N > 1 supervised as N ranks
//   lockstep-agent install DIR
//       copies the bundle this program is part of into DIR (worker/agent/agent_install.h): the
//       operator's init container, from the agent image, into the volume the pod shares
//
// Exit status: exec's (exec_agent.h); install: 0 copied, 1 it could not (the reason on stderr and,
// as "lockstep: gave up: ...", in the termination message file LOCKSTEP_TERMINATION_LOG names,
// so that the operator fails the job naming the pod and the cause instead of replacing the pod
// for ever), 2 bad usage.
#include <iostream>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/termination_message.h"
#include "worker/agent/agent_install.h"
#include "worker/agent/exec_agent.h"
#include "worker/agent/pod_supervisor.h"

namespace lockstep {
namespace {

constexpr char kProgram[] = "lockstep-agent";

void Usage() {
  std::cerr << "usage: lockstep-agent exec [--manifest FILE] [--] COMMAND [ARG...]\n"
               "       lockstep-agent install DIR\n"
               "  exec runs COMMAND under the rendezvous and restart rules, as lockstep-worker\n"
               "  exec does (docs/exec.md); install copies the agent's bundle (this program, its\n"
               "  libraries and loader, the Python helpers) into DIR\n";
}

int Install(const std::vector<std::string>& args) {
  if (args.size() != 1 || args[0].empty() || args[0][0] == '-') {
    Usage();
    return ReportFatalError(kProgram, 2, "install takes one argument, the folder to install into");
  }
  const std::string& target = args[0];
  const double started = MonotonicSeconds();
  StatusOr<std::string> bundle = agent::BundleOf("/proc/self/exe");
  StatusOr<agent::AgentInstallReport> report =
      bundle.ok() ? agent::InstallAgentBundle(*bundle, target)
                  : StatusOr<agent::AgentInstallReport>(bundle.status());
  if (!report.ok()) {
    // Every pod of the job would meet the same volume: the job fails now, naming the cause.
    return ReportFatalError(kProgram, 1,
                            std::string(kGaveUpPrefix) +
                                "cannot install the Lockstep agent into the pod's volume (" +
                                target + "): " + report.status().message());
  }
  std::cout << kProgram << ": installed the agent into " << target << ": " << report->files
            << " files, " << report->bytes / 1024 << " KiB in "
            << static_cast<int64_t>((MonotonicSeconds() - started) * 1000) << " ms" << std::endl;
  return 0;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    lockstep::Usage();
    return argc < 2 ? 2 : 0;
  }
  lockstep::agent::SetAgentProgramName(lockstep::kProgram);
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "install") return lockstep::Install(args);
  if (command != "exec") {
    lockstep::Usage();
    return lockstep::ReportFatalError(lockstep::kProgram, 2, "unknown command \"" + command + "\"");
  }
  const std::vector<std::string> worker_args(argv + 1, argv + argc);
  if (const int32_t ranks = lockstep::agent::RanksToSupervise(worker_args); ranks > 1) {
    std::vector<std::string> rank_argv = {"/proc/self/exe"};
    rank_argv.insert(rank_argv.end(), worker_args.begin(), worker_args.end());
    return lockstep::agent::RunPod(rank_argv, ranks, {});
  }
  return lockstep::agent::RunExecAgent(args);
}
