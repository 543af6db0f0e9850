// The PyTorch program the exec tests run (examples/pytorch/train_ddp.py under Debian's
// /usr/bin/python3, torch 1.13), and whether that interpreter has torch: the torch tests skip
// without it. Needs LOCKSTEP_SOURCE_DIR (the repository root) defined by the test target.
#pragma once

#include <string>

#include "tests/support/process/process.h"

namespace lockstep::testing {

inline const std::string kDdpScript =
    std::string(LOCKSTEP_SOURCE_DIR) + "/examples/pytorch/train_ddp.py";
inline const std::string kPipelineScript =
    std::string(LOCKSTEP_SOURCE_DIR) + "/examples/pytorch/train_pipeline.py";
inline const std::string kTestPython = "/usr/bin/python3";

inline bool TorchAvailable() {
  return RunProcess({kTestPython, "-c", "import torch.distributed"}, {}, 60000).exit_code == 0;
}

}  // namespace lockstep::testing
