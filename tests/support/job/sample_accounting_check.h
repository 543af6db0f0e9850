// Checks what a job's workers wrote to LOCKSTEP_SAMPLE_ACCOUNTING
// (worker/trainer/sample_accounting.h): for every epoch, the line of the trajectory that
// finished (the last one of that epoch) is exact: no sample trained twice, and for a full epoch
// none skipped. Failures are reported with `context`.
#pragma once

#include <string>

namespace lockstep::testing {

void ExpectExactSampleAccounting(const std::string& path, const std::string& context);

}  // namespace lockstep::testing
