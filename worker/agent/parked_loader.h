// The loader variables of a user's image, parked while the exec agent loads: the static launcher
// (worker/agent_launcher.cc) renames each LD_* variable NAME to kParkedLoaderPrefix + NAME before
// it executes the agent, whose own loader would otherwise obey what the image set for its own
// programs; the agent gives them back to the programs it starts (RestoreParkedLoaderVariables,
// exec_environment.h). Only names that begin with LD_ are parked, and only they come back.
#pragma once

namespace lockstep::agent {

inline constexpr char kParkedLoaderPrefix[] = "LOCKSTEP_IMAGE_";
inline constexpr char kLoaderVariablePrefix[] = "LD_";

}  // namespace lockstep::agent
