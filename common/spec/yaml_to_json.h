// Converts a YAML node tree (yaml-cpp) to nlohmann::json so that one walker reads both input
// formats with the same typing rules.
//
// Plain scalars are typed by the YAML 1.2 core schema (what the API server's YAML decoder does
// for a CRD): null/~/empty, true/false, decimal, 0o and 0x integers, floats with .inf and .nan;
// everything else, and every quoted or block scalar, is a string. So `replicas: "4"` stays a
// string and is reported as one, instead of being silently coerced.
#pragma once

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include "common/spec/problems.h"

namespace lockstep::spec::internal {

// Duplicate keys, non-scalar keys and documents nested or expanded (through aliases) past sane
// sizes are reported to `problems` by field path; the rest of the tree is still converted.
nlohmann::json YamlToJson(const YAML::Node& node, Problems* problems);

}  // namespace lockstep::spec::internal
