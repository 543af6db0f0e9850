// Problems: the list of everything wrong with one manifest, one line per problem.
//
// Every line names the field by its path ("spec.trainer.data.train[1]") and says what is wrong
// with the offending value, so `lockstep validate` can print the list as it stands. Lines are
// guaranteed to be single lines: control characters that come from user input (keys, values)
// are escaped when a line is added. The list keeps the first kMaxLines problems and counts the
// rest, so a hostile manifest (a list of a million bad values) costs bounded memory and output.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace lockstep::spec::internal {

class Problems {
 public:
  static constexpr size_t kMaxLines = 50;

  // Adds "path: problem" ("problem" alone when `path` is empty).
  void Add(const std::string& path, const std::string& problem);

  bool empty() const { return lines_.empty(); }
  // The first kMaxLines problems; `dropped()` more were found after them.
  const std::vector<std::string>& lines() const { return lines_; }
  size_t dropped() const { return dropped_; }

  // The lines joined by '\n', each prefixed by "source: " when `source` is not empty, and a last
  // line "... and N more problems" when some were dropped.
  std::string Join(const std::string& source) const;

 private:
  std::vector<std::string> lines_;
  size_t dropped_ = 0;
};

// How a value is shown in a message: strings quoted and escaped (and shortened past 60
// characters), numbers and booleans as written, containers by their kind ("a list", "a map").
std::string Describe(const nlohmann::json& value);

// "path.key", or "key" at the top level.
std::string JoinPath(const std::string& path, const std::string& key);
// "path[index]".
std::string IndexPath(const std::string& path, size_t index);

}  // namespace lockstep::spec::internal
