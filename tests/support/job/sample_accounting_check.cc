#include "tests/support/job/sample_accounting_check.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/support/process/scratch_files.h"

namespace lockstep::testing {

void ExpectExactSampleAccounting(const std::string& path, const std::string& context) {
  const std::string text = ReadFile(path);
  ASSERT_FALSE(text.empty()) << context << ": no sample accounting in " << path;
  std::map<int64_t, nlohmann::json> last_line_of_epoch;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    nlohmann::json entry = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(entry.is_discarded()) << context << ": torn accounting line: " << line;
    last_line_of_epoch[entry["epoch"].get<int64_t>()] = entry;
  }
  ASSERT_FALSE(last_line_of_epoch.empty()) << context;
  for (const auto& [epoch, entry] : last_line_of_epoch) {
    EXPECT_TRUE(entry["complete"].get<bool>()) << context << ": " << entry.dump();
    EXPECT_EQ(entry["more_than_once"].get<int64_t>(), 0) << context << ": " << entry.dump();
    if (!entry.value("partial", false)) {
      EXPECT_EQ(entry["never"].get<int64_t>(), 0) << context << ": " << entry.dump();
      EXPECT_EQ(entry["trained_once"], entry["samples"]) << context << ": " << entry.dump();
    }
  }
}

}  // namespace lockstep::testing
