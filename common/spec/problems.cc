#include "common/spec/problems.h"

#include <cmath>
#include <cstdio>

namespace lockstep::spec::internal {
namespace {

// dump() throws on invalid UTF-8 unless told to replace it; a message must never throw.
std::string Dump(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Keeps a problem on one line whatever the user put in a key or value.
std::string EscapeControlCharacters(const std::string& text) {
  std::string escaped;
  escaped.reserve(text.size());
  for (unsigned char c : text) {
    if (c == '\n') {
      escaped += "\\n";
    } else if (c == '\r') {
      escaped += "\\r";
    } else if (c == '\t') {
      escaped += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buffer[8];
      std::snprintf(buffer, sizeof(buffer), "\\x%02x", c);
      escaped += buffer;
    } else {
      escaped += static_cast<char>(c);
    }
  }
  return escaped;
}

constexpr size_t kMaxShownStringChars = 60;

}  // namespace

void Problems::Add(const std::string& path, const std::string& problem) {
  if (lines_.size() >= kMaxLines) {
    ++dropped_;
    return;
  }
  lines_.push_back(EscapeControlCharacters(path.empty() ? problem : path + ": " + problem));
}

std::string Problems::Join(const std::string& source) const {
  std::string joined;
  for (const std::string& line : lines_) {
    if (!joined.empty()) joined += '\n';
    if (!source.empty()) joined += source + ": ";
    joined += line;
  }
  if (dropped_ > 0) {
    joined += '\n';
    if (!source.empty()) joined += source + ": ";
    joined += "... and " + std::to_string(dropped_) + " more problem" + (dropped_ == 1 ? "" : "s");
  }
  return joined;
}

std::string Describe(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::array:
      return "a list";
    case nlohmann::json::value_t::object:
      return "a map";
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::string: {
      const auto& text = value.get_ref<const std::string&>();
      if (text.size() <= kMaxShownStringChars) return Dump(value);
      return Dump(nlohmann::json(text.substr(0, kMaxShownStringChars))) + "...";
    }
    case nlohmann::json::value_t::number_float: {
      double number = value.get<double>();
      if (std::isnan(number)) return ".nan";
      if (std::isinf(number)) return number > 0 ? ".inf" : "-.inf";
      return Dump(value);
    }
    default:
      return Dump(value);
  }
}

std::string JoinPath(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

std::string IndexPath(const std::string& path, size_t index) {
  return path + "[" + std::to_string(index) + "]";
}

}  // namespace lockstep::spec::internal
