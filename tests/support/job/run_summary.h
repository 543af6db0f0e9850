// What a finished `lockstep run` left for a test to compare: its --summary file and the
// parameters rank 0 dumped (LOCKSTEP_DUMP_PARAMS, read with ReadFloats).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace lockstep::testing {

// The --summary JSON at `path`; an empty object when the file is missing or not JSON, so a
// test's expectations on its fields fail with the summary printed rather than crash.
nlohmann::json ReadRunSummary(const std::string& path);

// The largest parameter difference relative to the largest parameter (per element, values near
// zero have no meaningful relative error); infinity when the sizes differ or both are empty.
double RelativeParameterDifference(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace lockstep::testing
