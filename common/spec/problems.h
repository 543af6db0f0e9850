// Problems: the list of everything wrong with one manifest, one line per problem.
//
// Every line names the field by its path ("spec.trainer.data.train[1]") and says what is wrong
// with the offending value, so `lockstep validate` can print the list as it stands. Lines are
// guaranteed to be single lines: control characters that come from user input (keys, values)
// are escaped when a line is added.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace lockstep::spec::internal {

class Problems {
 public:
  // Adds "path: problem" ("problem" alone when `path` is empty).
  void Add(const std::string& path, const std::string& problem);

  bool empty() const { return lines_.empty(); }
  const std::vector<std::string>& lines() const { return lines_; }

  // The lines joined by '\n', each prefixed by "source: " when `source` is not empty.
  std::string Join(const std::string& source) const;

 private:
  std::vector<std::string> lines_;
};

// How a value is shown in a message: strings quoted and escaped (and shortened past 60
// characters), numbers and booleans as written, containers by their kind ("a list", "a map").
std::string Describe(const nlohmann::json& value);

// "path.key", or "key" at the top level.
std::string JoinPath(const std::string& path, const std::string& key);
// "path[index]".
std::string IndexPath(const std::string& path, size_t index);

}  // namespace lockstep::spec::internal
