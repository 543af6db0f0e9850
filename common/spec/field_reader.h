// ObjectReader: reads the fields of one map of a manifest (as nlohmann::json, whatever the input
// format was) into typed values, reporting every problem to a Problems list by field path.
//
//   ObjectReader spec(document["spec"], "spec", {"replicas", "elastic", ...}, &problems);
//   spec.Require("replicas");
//   spec.ReadInt("replicas", &job.spec.replicas, /*min=*/1);
//
// Typing is strict, as the API server's is for a CRD: "64" is not an integer, 3.5 is not an
// integer, "true" is not a boolean. A null value reads as absent, as in Kubernetes. A Read* call
// leaves its output (the default) untouched unless the value is present, well typed and in range,
// and returns whether it stored a value.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/spec/enum_names.h"
#include "common/spec/problems.h"

namespace lockstep::spec::internal {

// The known name closest to `name` by case-insensitive edit distance, or "" when none is close
// enough to be a likely typo.
std::string SuggestFieldName(std::string_view name, const std::vector<std::string_view>& known);

// One end of an allowed interval for a number.
struct Bound {
  double value;
  bool inclusive;
};

class ObjectReader {
 public:
  // `value` may be null (reads as an empty map). A value that is not a map is reported and reads
  // as empty (valid() is false). Keys not in `known_fields` are reported as unknown, with the
  // closest known name when one is close. `value` must outlive the reader.
  ObjectReader(const nlohmann::json& value, std::string path,
               std::vector<std::string_view> known_fields, Problems* problems);

  // False when the value was neither a map nor null; callers skip cross-field checks then.
  bool valid() const { return valid_; }
  const std::string& path() const { return path_; }
  Problems* problems() const { return problems_; }
  std::string PathOf(std::string_view key) const { return JoinPath(path_, std::string(key)); }

  // The value of `key`, or nullptr when absent or null.
  const nlohmann::json* Find(std::string_view key) const;
  bool Has(std::string_view key) const { return Find(key) != nullptr; }
  // Reports "<path>.<key>: required" when absent; returns whether it is present.
  bool Require(std::string_view key) const;

  // A child map; absent or null reads as an empty map.
  ObjectReader Child(std::string_view key, std::vector<std::string_view> known_fields) const;

  template <typename Int>
  bool ReadInt(std::string_view key, Int* out, int64_t min = std::numeric_limits<Int>::min(),
               int64_t max = std::numeric_limits<Int>::max()) const {
    int64_t value = 0;
    if (!ReadInt64(key, min, max, &value)) return false;
    *out = static_cast<Int>(value);
    return true;
  }
  bool ReadUint64(std::string_view key, uint64_t* out) const;
  // Finite numbers within the given bounds (either may be absent: pass nullptr).
  bool ReadDouble(std::string_view key, double* out, const Bound* lower = nullptr,
                  const Bound* upper = nullptr) const;
  bool ReadBool(std::string_view key, bool* out) const;
  bool ReadString(std::string_view key, std::string* out) const;
  // A string, or a number written as its decimal text (Kubernetes int-or-string quantities).
  bool ReadIntOrString(std::string_view key, std::string* out) const;
  bool ReadStringList(std::string_view key, std::vector<std::string>* out) const;
  bool ReadIntList(std::string_view key, int64_t min, int64_t max, std::vector<int64_t>* out) const;
  bool ReadStringMap(std::string_view key, std::map<std::string, std::string>* out) const;

  template <typename E>
  bool ReadEnum(std::string_view key, E* out) const {
    std::string name;
    if (!ReadString(key, &name)) return false;
    if (EnumFromString(name, out)) return true;
    problems_->Add(PathOf(key), "must be one of " + EnumChoices<E>() + " (got " +
                                    Describe(nlohmann::json(name)) + ")");
    return false;
  }

 private:
  bool ReadInt64(std::string_view key, int64_t min, int64_t max, int64_t* out) const;

  const nlohmann::json* object_ = nullptr;  // null when absent or invalid
  std::string path_;
  Problems* problems_;
  bool valid_ = true;
};

// Type checks shared with list elements: each reports "<path>: expected ..., got ..." and returns
// false when `value` has the wrong type or is out of range.
bool CheckInt64(const nlohmann::json& value, const std::string& path, int64_t min, int64_t max,
                Problems* problems, int64_t* out);
bool CheckString(const nlohmann::json& value, const std::string& path, Problems* problems,
                 std::string* out);

}  // namespace lockstep::spec::internal
