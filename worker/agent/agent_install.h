// The exec agent's bundle (scripts/bundle/agent.sh: the agent, every library it links, glibc and
// its loader, the Python helpers) copied into a volume a pod shares: what `lockstep-agent install
// DIR` does in the init container the operator adds to a job that runs in a user's own image
// (docs/exec.md, "Your own image").
//
//   StatusOr<std::string> bundle = BundleOf("/proc/self/exe");         // "/lockstep"
//   StatusOr<AgentInstallReport> copied = InstallAgentBundle(*bundle, "/agent-volume");
//
// Runs before the user's container starts and never concurrently with a reader of the target.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace lockstep::agent {

// The file a bundle holds at its top (key=value lines; scripts/bundle/agent.sh writes it last).
inline constexpr char kBundleInfoFile[] = "BUNDLE-INFO";

struct AgentInstallReport {
  int64_t files = 0;
  int64_t bytes = 0;
};

// The bundle `program` is part of: the folder above the folder holding it (program is
// BUNDLE/bin/lockstep-agent; symbolic links, /proc/self/exe included, are resolved), when that
// folder holds kBundleInfoFile. NotFound naming the folder otherwise (a program of a build
// folder or of an image's /usr/bin is no bundle).
StatusOr<std::string> BundleOf(const std::string& program);

// Copies every file, folder and symbolic link below `bundle` to the same place below `target`
// (made when missing), with their permission bits; kBundleInfoFile comes last, so a target that
// has it holds the whole bundle. What `target` already holds is replaced file by file, each file
// written beside its place and renamed over it: a second install (an init container run again)
// never leaves half a file. Blocks for the copy (tens of MiB on a local disk: well under a
// second). Errors name the path and the cause: "cannot write /agent-volume/bin/lockstep-agent:
// Permission denied"; the target may then hold part of the bundle, without kBundleInfoFile.
StatusOr<AgentInstallReport> InstallAgentBundle(const std::string& bundle,
                                                const std::string& target);

}  // namespace lockstep::agent
