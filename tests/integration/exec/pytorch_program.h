// The PyTorch program the exec tests run (examples/pytorch/train_ddp.py under Debian's
// /usr/bin/python3, torch 1.13), and whether that interpreter has torch: the torch tests skip
// without it. Needs LOCKSTEP_SOURCE_DIR (the repository root) and LOCKSTEP_BINARY defined by the
// test target.
//
// The GPU machine's check (scripts/gpu_check) runs these tests from its bundle, on that machine's
// PyTorch: LOCKSTEP_TEST_PYTHON names another interpreter, LOCKSTEP_TEST_SOURCE_DIR a folder
// holding examples/pytorch, and LOCKSTEP_TEST_LOCKSTEP another `lockstep` binary. The torch 2.6
// variants (tests/integration/exec/CMakeLists.txt) name Debian trixie's python3 the same way.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

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

// Whether kTestPython imports torch.distributed; the torch tests skip when it does not. Where
// LOCKSTEP_TEST_REQUIRE_TORCH is set (the torch 2.6 variants) and this runs as root (where
// scripts/test.sh makes their interpreter), a missing torch is a failure instead: a variant that
// skipped would prove nothing.
inline bool TorchAvailable() {
  const ProcessResult result =
      RunProcess({kTestPython, "-c", "import torch.distributed"}, {}, 60000);
  if (result.exit_code != 0 && !FromEnvironment("LOCKSTEP_TEST_REQUIRE_TORCH", "").empty() &&
      geteuid() == 0) {
    ADD_FAILURE() << kTestPython
                  << " cannot import torch (scripts/trixie-torch.sh makes it): " << result.err;
  }
  return result.exit_code == 0;
}

}  // namespace lockstep::testing
