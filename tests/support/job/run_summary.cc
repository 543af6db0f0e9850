#include "tests/support/job/run_summary.h"

#include <algorithm>
#include <cmath>

#include "tests/support/process/scratch_files.h"

namespace lockstep::testing {

nlohmann::json ReadRunSummary(const std::string& path) {
  nlohmann::json summary =
      nlohmann::json::parse(ReadFile(path), nullptr, /*allow_exceptions=*/false);
  return summary.is_discarded() ? nlohmann::json::object() : summary;
}

double RelativeParameterDifference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double difference = 0, magnitude = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference = std::max(difference, std::fabs(double{a[i]} - double{b[i]}));
    magnitude = std::max(magnitude, std::fabs(double{a[i]}));
  }
  return difference / magnitude;
}

}  // namespace lockstep::testing
