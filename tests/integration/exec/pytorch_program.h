// The PyTorch program the exec tests run (examples/pytorch/train_ddp.py under Debian's
// /usr/bin/python3, torch 1.13), and whether that interpreter has torch: the torch tests skip
// without it. Needs LOCKSTEP_SOURCE_DIR (the repository root) and LOCKSTEP_BINARY defined by the
// test target.
//
// The GPU machine's check (scripts/gpu_check) runs these tests from its bundle, on that machine's
// PyTorch: LOCKSTEP_TEST_PYTHON names another interpreter, LOCKSTEP_TEST_SOURCE_DIR a folder
// holding examples/pytorch, and LOCKSTEP_TEST_LOCKSTEP another `lockstep` binary.
#pragma once

#include <cstdlib>
#include <string>

#include "tests/support/process/process.h"

namespace lockstep::testing {

// The environment variable's value, or `built_in` when it is unset or empty.
inline std::string FromEnvironment(const char* name, const std::string& built_in) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::string(value) : built_in;
}

inline const std::string kTestSourceDir =
    FromEnvironment("LOCKSTEP_TEST_SOURCE_DIR", LOCKSTEP_SOURCE_DIR);
inline const std::string kDdpScript = kTestSourceDir + "/examples/pytorch/train_ddp.py";
inline const std::string kPipelineScript = kTestSourceDir + "/examples/pytorch/train_pipeline.py";
inline const std::string kTestPython = FromEnvironment("LOCKSTEP_TEST_PYTHON", "/usr/bin/python3");
inline const std::string kLockstepBinary =
    FromEnvironment("LOCKSTEP_TEST_LOCKSTEP", LOCKSTEP_BINARY);

inline bool TorchAvailable() {
  return RunProcess({kTestPython, "-c", "import torch.distributed"}, {}, 60000).exit_code == 0;
}

}  // namespace lockstep::testing
