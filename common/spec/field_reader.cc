#include "common/spec/field_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

namespace lockstep::spec::internal {
namespace {

using json = nlohmann::json;

std::string Lower(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> previous(b.size() + 1), current(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t substitution = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitution});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::string FormatNumber(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

bool IsInteger(const json& value) { return value.is_number_integer(); }

}  // namespace

std::string SuggestFieldName(std::string_view name, const std::vector<std::string_view>& known) {
  // Typos of short names are too ambiguous to guess at; long names tolerate more slips.
  const size_t max_distance = name.size() <= 4 ? 1 : name.size() <= 8 ? 2 : 3;
  const std::string lower_name = Lower(name);
  std::string best;
  size_t best_distance = max_distance + 1;
  for (std::string_view candidate : known) {
    size_t distance = EditDistance(lower_name, Lower(candidate));
    // snake_case for camelCase ("learning_rate") is a common slip worth catching too.
    std::string without_underscores;
    for (char c : lower_name) {
      if (c != '_' && c != '-') without_underscores += c;
    }
    distance = std::min(distance, EditDistance(without_underscores, Lower(candidate)));
    if (distance < best_distance) {
      best_distance = distance;
      best = std::string(candidate);
    }
  }
  return best;
}

bool CheckInt64(const json& value, const std::string& path, int64_t min, int64_t max,
                Problems* problems, int64_t* out) {
  if (!IsInteger(value)) {
    problems->Add(path, "expected an integer, got " + Describe(value));
    return false;
  }
  bool too_big = value.is_number_unsigned() &&
                 value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  int64_t number = too_big ? std::numeric_limits<int64_t>::max() : value.get<int64_t>();
  if (too_big || number < min || number > max) {
    // A bound at a type's limit is the type's, not the field's rule, and not worth showing.
    auto is_type_limit = [](int64_t bound) {
      return bound == std::numeric_limits<int64_t>::min() ||
             bound == std::numeric_limits<int64_t>::max() ||
             bound == std::numeric_limits<int32_t>::min() ||
             bound == std::numeric_limits<int32_t>::max();
    };
    std::string rule;
    if (!is_type_limit(min) && !is_type_limit(max)) {
      rule = "must be within " + std::to_string(min) + ".." + std::to_string(max);
    } else if (!too_big && number < min) {
      rule = "must be >= " + std::to_string(min);
    } else {
      rule = "must be <= " + std::to_string(max);
    }
    problems->Add(path, rule + " (got " + Describe(value) + ")");
    return false;
  }
  *out = number;
  return true;
}

bool CheckString(const json& value, const std::string& path, Problems* problems, std::string* out) {
  if (!value.is_string()) {
    problems->Add(path, "expected a string, got " + Describe(value));
    return false;
  }
  *out = value.get<std::string>();
  return true;
}

ObjectReader::ObjectReader(const json& value, std::string path,
                           std::vector<std::string_view> known_fields, Problems* problems)
    : path_(std::move(path)), problems_(problems) {
  if (value.is_null()) return;
  if (!value.is_object()) {
    problems_->Add(path_, "expected a map, got " + Describe(value));
    valid_ = false;
    return;
  }
  object_ = &value;
  for (const auto& [key, unused] : value.items()) {
    if (std::find(known_fields.begin(), known_fields.end(), key) != known_fields.end()) continue;
    std::string suggestion = SuggestFieldName(key, known_fields);
    problems_->Add(PathOf(key), suggestion.empty()
                                    ? "unknown field"
                                    : "unknown field (did you mean \"" + suggestion + "\"?)");
  }
}

const json* ObjectReader::Find(std::string_view key) const {
  if (object_ == nullptr) return nullptr;
  auto it = object_->find(std::string(key));
  if (it == object_->end() || it->is_null()) return nullptr;
  return &*it;
}

bool ObjectReader::Require(std::string_view key) const {
  if (Has(key)) return true;
  // A map of the wrong type was reported already; "required" beneath it would be noise.
  if (valid_) problems_->Add(PathOf(key), "required");
  return false;
}

ObjectReader ObjectReader::Child(std::string_view key,
                                 std::vector<std::string_view> known_fields) const {
  static const json kNull;
  const json* value = Find(key);
  ObjectReader child(value == nullptr ? kNull : *value, PathOf(key), std::move(known_fields),
                     problems_);
  return child;
}

bool ObjectReader::ReadInt64(std::string_view key, int64_t min, int64_t max, int64_t* out) const {
  const json* value = Find(key);
  if (value == nullptr) return false;
  return CheckInt64(*value, PathOf(key), min, max, problems_, out);
}

bool ObjectReader::ReadUint64(std::string_view key, uint64_t* out) const {
  const json* value = Find(key);
  if (value == nullptr) return false;
  if (!IsInteger(*value)) {
    problems_->Add(PathOf(key), "expected an integer, got " + Describe(*value));
    return false;
  }
  if (!value->is_number_unsigned() && value->get<int64_t>() < 0) {
    problems_->Add(PathOf(key), "must be >= 0 (got " + Describe(*value) + ")");
    return false;
  }
  *out = value->get<uint64_t>();
  return true;
}

bool ObjectReader::ReadDouble(std::string_view key, double* out, const Bound* lower,
                              const Bound* upper) const {
  const json* value = Find(key);
  if (value == nullptr) return false;
  if (!value->is_number()) {
    problems_->Add(PathOf(key), "expected a number, got " + Describe(*value));
    return false;
  }
  double number = value->get<double>();
  if (!std::isfinite(number)) {
    problems_->Add(PathOf(key), "must be a finite number (got " + Describe(*value) + ")");
    return false;
  }
  bool below =
      lower != nullptr && (lower->inclusive ? number < lower->value : number <= lower->value);
  bool above =
      upper != nullptr && (upper->inclusive ? number > upper->value : number >= upper->value);
  if (below || above) {
    std::string rule;
    if (lower != nullptr && upper != nullptr) {
      rule = std::string("must be in ") + (lower->inclusive ? "[" : "(") +
             FormatNumber(lower->value) + ", " + FormatNumber(upper->value) +
             (upper->inclusive ? "]" : ")");
    } else if (lower != nullptr) {
      rule =
          std::string("must be ") + (lower->inclusive ? ">= " : "> ") + FormatNumber(lower->value);
    } else {
      rule =
          std::string("must be ") + (upper->inclusive ? "<= " : "< ") + FormatNumber(upper->value);
    }
    problems_->Add(PathOf(key), rule + " (got " + Describe(*value) + ")");
    return false;
  }
  *out = number;
  return true;
}

bool ObjectReader::ReadBool(std::string_view key, bool* out) const {
  const json* value = Find(key);
  if (value == nullptr) return false;
  if (!value->is_boolean()) {
    problems_->Add(PathOf(key), "expected a boolean (true or false), got " + Describe(*value));
    return false;
  }
  *out = value->get<bool>();
  return true;
}

bool ObjectReader::ReadString(std::string_view key, std::string* out) const {
  const json* value = Find(key);
  if (value == nullptr) return false;
  return CheckString(*value, PathOf(key), problems_, out);
}

bool ObjectReader::ReadIntOrString(std::string_view key, std::string* out) const {
  const json* value = Find(key);
  if (value == nullptr) return false;
  if (value->is_string()) {
    *out = value->get<std::string>();
    return true;
  }
  if (value->is_number()) {
    *out = Describe(*value);
    return true;
  }
  problems_->Add(PathOf(key), "expected a string or a number, got " + Describe(*value));
  return false;
}

bool ObjectReader::ReadStringList(std::string_view key, std::vector<std::string>* out) const {
  const json* value = Find(key);
  if (value == nullptr) return false;
  if (!value->is_array()) {
    problems_->Add(PathOf(key), "expected a list of strings, got " + Describe(*value));
    return false;
  }
  std::vector<std::string> items(value->size());
  bool ok = true;
  for (size_t i = 0; i < value->size(); ++i) {
    ok &= CheckString((*value)[i], IndexPath(PathOf(key), i), problems_, &items[i]);
  }
  if (ok) *out = std::move(items);
  return ok;
}

bool ObjectReader::ReadIntList(std::string_view key, int64_t min, int64_t max,
                               std::vector<int64_t>* out) const {
  const json* value = Find(key);
  if (value == nullptr) return false;
  if (!value->is_array()) {
    problems_->Add(PathOf(key), "expected a list of integers, got " + Describe(*value));
    return false;
  }
  std::vector<int64_t> items(value->size());
  bool ok = true;
  for (size_t i = 0; i < value->size(); ++i) {
    ok &= CheckInt64((*value)[i], IndexPath(PathOf(key), i), min, max, problems_, &items[i]);
  }
  if (ok) *out = std::move(items);
  return ok;
}

bool ObjectReader::ReadStringMap(std::string_view key,
                                 std::map<std::string, std::string>* out) const {
  const json* value = Find(key);
  if (value == nullptr) return false;
  if (!value->is_object()) {
    problems_->Add(PathOf(key), "expected a map of strings, got " + Describe(*value));
    return false;
  }
  std::map<std::string, std::string> items;
  bool ok = true;
  for (const auto& [name, item] : value->items()) {
    ok &= CheckString(item, JoinPath(PathOf(key), name), problems_, &items[name]);
  }
  if (ok) *out = std::move(items);
  return ok;
}

}  // namespace lockstep::spec::internal
