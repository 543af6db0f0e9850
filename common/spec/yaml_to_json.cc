#include "common/spec/yaml_to_json.h"

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <string>

namespace lockstep::spec::internal {
namespace {

using json = nlohmann::json;

// A manifest is a few hundred nodes; these only stop hostile input (alias bombs, deep nesting).
constexpr int kMaxDepth = 64;
constexpr size_t kMaxNodes = 1'000'000;

bool AllOf(const std::string& text, size_t from, bool (*accept)(char)) {
  if (from >= text.size()) return false;
  for (size_t i = from; i < text.size(); ++i) {
    if (!accept(text[i])) return false;
  }
  return true;
}
bool IsDecimalDigit(char c) { return c >= '0' && c <= '9'; }
bool IsOctalDigit(char c) { return c >= '0' && c <= '7'; }
bool IsHexDigit(char c) {
  return IsDecimalDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
bool IsCoreFloat(const std::string& text) {
  size_t i = 0;
  if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
  size_t integer_digits = 0, fraction_digits = 0;
  while (i < text.size() && IsDecimalDigit(text[i])) ++i, ++integer_digits;
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && IsDecimalDigit(text[i])) ++i, ++fraction_digits;
  }
  if (integer_digits == 0 && fraction_digits == 0) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
    size_t exponent_digits = 0;
    while (i < text.size() && IsDecimalDigit(text[i])) ++i, ++exponent_digits;
    if (exponent_digits == 0) return false;
  }
  return i == text.size();
}

// Unsigned digits in `base`: int64 when it fits, else uint64, else (too large for 64 bits) a
// float, which integer fields then reject as not an integer.
json UnsignedIntegerOrFloat(const std::string& digits, int base) {
  errno = 0;
  unsigned long long value = std::strtoull(digits.c_str(), nullptr, base);
  if (errno == ERANGE) return json(std::strtod(digits.c_str(), nullptr));
  if (value <= static_cast<unsigned long long>(std::numeric_limits<int64_t>::max())) {
    return json(static_cast<int64_t>(value));
  }
  return json(static_cast<uint64_t>(value));
}

json ResolvePlainScalar(const std::string& text) {
  if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL") {
    return json(nullptr);
  }
  if (text == "true" || text == "True" || text == "TRUE") return json(true);
  if (text == "false" || text == "False" || text == "FALSE") return json(false);
  bool has_sign = text[0] == '-' || text[0] == '+';
  if (AllOf(text, has_sign ? 1 : 0, IsDecimalDigit)) {
    if (text[0] == '-') {
      errno = 0;
      long long value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) return json(std::strtod(text.c_str(), nullptr));
      return json(static_cast<int64_t>(value));
    }
    return UnsignedIntegerOrFloat(text.substr(has_sign ? 1 : 0), 10);
  }
  if (text.size() > 2 && text[0] == '0' && text[1] == 'o' && AllOf(text, 2, IsOctalDigit)) {
    return UnsignedIntegerOrFloat(text.substr(2), 8);
  }
  if (text.size() > 2 && text[0] == '0' && text[1] == 'x' && AllOf(text, 2, IsHexDigit)) {
    return UnsignedIntegerOrFloat(text.substr(2), 16);
  }
  if (IsCoreFloat(text)) return json(std::strtod(text.c_str(), nullptr));
  std::string unsigned_text = has_sign ? text.substr(1) : text;
  if (unsigned_text == ".inf" || unsigned_text == ".Inf" || unsigned_text == ".INF") {
    double infinity = std::numeric_limits<double>::infinity();
    return json(text[0] == '-' ? -infinity : infinity);
  }
  if (text == ".nan" || text == ".NaN" || text == ".NAN") {
    return json(std::numeric_limits<double>::quiet_NaN());
  }
  return json(text);
}

class Converter {
 public:
  explicit Converter(Problems* problems) : problems_(problems) {}

  json Convert(const YAML::Node& node, const std::string& path, int depth) {
    if (++nodes_ > kMaxNodes) {
      if (nodes_ == kMaxNodes + 1) {
        problems_->Add(path, "document too large (more than " + std::to_string(kMaxNodes) +
                                 " values, aliases expanded)");
      }
      return json(nullptr);
    }
    if (depth > kMaxDepth) {
      problems_->Add(path, "nested deeper than " + std::to_string(kMaxDepth) + " levels");
      return json(nullptr);
    }
    switch (node.Type()) {
      case YAML::NodeType::Undefined:
      case YAML::NodeType::Null:
        return json(nullptr);
      case YAML::NodeType::Scalar:
        // "?" is a plain scalar; "!" a quoted or block one; an explicit !!str is a string too.
        if (node.Tag() == "?" || node.Tag().empty()) return ResolvePlainScalar(node.Scalar());
        if (node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str") return json(node.Scalar());
        return ResolvePlainScalar(node.Scalar());
      case YAML::NodeType::Sequence: {
        json list = json::array();
        size_t index = 0;
        for (const YAML::Node& item : node) {
          list.push_back(Convert(item, IndexPath(path, index++), depth + 1));
        }
        return list;
      }
      case YAML::NodeType::Map: {
        json map = json::object();
        for (const auto& entry : node) {
          if (!entry.first.IsScalar()) {
            problems_->Add(path, "map keys must be plain strings, got a " +
                                     std::string(entry.first.IsMap() ? "map" : "list") +
                                     " as a key");
            continue;
          }
          const std::string& key = entry.first.Scalar();
          std::string child_path = JoinPath(path, key);
          if (map.contains(key)) {
            problems_->Add(child_path, "duplicate key");
            continue;
          }
          map[key] = Convert(entry.second, child_path, depth + 1);
        }
        return map;
      }
    }
    return json(nullptr);
  }

 private:
  Problems* problems_;
  size_t nodes_ = 0;
};

}  // namespace

json YamlToJson(const YAML::Node& node, Problems* problems) {
  Converter converter(problems);
  return converter.Convert(node, "", 0);
}

}  // namespace lockstep::spec::internal
