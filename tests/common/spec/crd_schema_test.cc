// The CRD's schema (crds/trainingjob.yaml) against the spec model: both have the same fields, so
// the API server neither prunes a field `lockstep validate` accepts nor keeps one the operator
// would refuse as unknown; and every field is documented, so `kubectl explain trainingjob.spec...`
// says what it means. The model's fields come from the parser's own table (manifest_fields.h).
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/spec/manifest_fields.h"
#include "common/spec/problems.h"
#include "common/spec/yaml_to_json.h"

namespace lockstep::spec {
namespace {

using json = nlohmann::json;

const std::string kCrdPath = std::string(LOCKSTEP_SOURCE_DIR) + "/crds/trainingjob.yaml";

json LoadCrd() {
  YAML::Node node;
  try {
    node = YAML::LoadFile(kCrdPath);
  } catch (const YAML::Exception& error) {
    ADD_FAILURE() << kCrdPath << ": " << error.what();
    return json{{"spec", {{"versions", json::array()}}}};
  }
  internal::Problems problems;
  json crd = internal::YamlToJson(node, &problems);
  EXPECT_TRUE(problems.empty()) << problems.Join(kCrdPath);
  EXPECT_FALSE(crd["spec"].value("versions", json::array()).empty()) << kCrdPath << ": no versions";
  return crd;
}

// Every property of `schema` by dotted path; a list's item properties continue the list's path
// (status.conditions.type), as kubectl explain names them. The branches of oneOf/anyOf only
// restrict properties declared here (a structural schema's rule), so they add none.
void CollectProperties(const json& schema, const std::string& path,
                       std::map<std::string, json>* out) {
  if (schema.contains("properties")) {
    for (const auto& [name, property] : schema["properties"].items()) {
      const std::string property_path = internal::JoinPath(path, name);
      (*out)[property_path] = property;
      CollectProperties(property, property_path, out);
    }
  }
  if (schema.contains("items")) CollectProperties(schema["items"], path, out);
}

// The properties of one version of the CRD.
std::map<std::string, json> PropertiesOf(const json& version) {
  std::map<std::string, json> properties;
  CollectProperties(version["schema"]["openAPIV3Schema"], "", &properties);
  return properties;
}

bool IsUnder(const std::string& path, const std::string& root) {
  return path.rfind(root + ".", 0) == 0;
}

std::string Lines(const std::vector<std::string>& lines) {
  std::ostringstream out;
  for (const std::string& line : lines) out << "\n  " << line;
  return out.str();
}

// Beneath metadata the fields are the API server's ObjectMeta (the CRD may only restrict name and
// generateName), and beneath status the operator's (the model reads status as a whole).
bool OwnedByTheModel(const std::string& path) {
  return !IsUnder(path, "metadata") && !IsUnder(path, "status");
}

TEST(CrdSchema, DeclaresExactlyTheFieldsTheModelReads) {
  std::set<std::string> model;
  for (const std::string& path : ManifestFieldPaths()) {
    if (OwnedByTheModel(path)) model.insert(path);
  }
  ASSERT_TRUE(model.count("spec.trainer.optimizer.learningRate")) << "the table lost a field";
  const json crd = LoadCrd();
  for (const json& version : crd.at("spec").at("versions")) {
    SCOPED_TRACE("version " + version["name"].get<std::string>());
    std::map<std::string, json> properties = PropertiesOf(version);
    std::vector<std::string> only_crd, only_model, metadata_unknown;
    for (const auto& [path, property] : properties) {
      if (OwnedByTheModel(path) && !model.count(path)) only_crd.push_back(path);
    }
    for (const std::string& path : model) {
      if (!properties.count(path)) only_model.push_back(path);
    }
    // What the CRD restricts of metadata, the model must read too.
    const std::vector<std::string_view>& metadata = ManifestFields("metadata");
    for (const auto& [path, property] : properties) {
      if (!IsUnder(path, "metadata")) continue;
      const std::string field = path.substr(std::string("metadata.").size());
      if (std::find(metadata.begin(), metadata.end(), field) == metadata.end()) {
        metadata_unknown.push_back(path);
      }
    }
    EXPECT_TRUE(only_crd.empty())
        << "in crds/trainingjob.yaml but not read by the model (common/spec/manifest_fields.cc, "
           "which `lockstep validate` and the operator would refuse as unknown):"
        << Lines(only_crd);
    EXPECT_TRUE(only_model.empty())
        << "read by the model (common/spec/manifest_fields.cc) but not in crds/trainingjob.yaml "
           "(the API server would prune it):"
        << Lines(only_model);
    EXPECT_TRUE(metadata_unknown.empty())
        << "metadata fields the CRD restricts and the model does not read:"
        << Lines(metadata_unknown);
  }
}

// kubectl explain prints a property's description. metadata is exempt: the API server refuses a
// CRD that sets anything on it but restrictions of name and generateName, and publishes
// ObjectMeta's own documentation in its place.
TEST(CrdSchema, EveryFieldIsDocumentedWithItsDefault) {
  const json crd = LoadCrd();
  for (const json& version : crd.at("spec").at("versions")) {
    SCOPED_TRACE("version " + version["name"].get<std::string>());
    EXPECT_FALSE(version["schema"]["openAPIV3Schema"].value("description", "").empty())
        << "the TrainingJob itself";
    std::map<std::string, json> properties = PropertiesOf(version);
    std::vector<std::string> undocumented, default_unsaid;
    for (const auto& [path, property] : properties) {
      if (path == "metadata" || IsUnder(path, "metadata")) continue;
      const std::string description = property.value("description", "");
      if (description.empty()) {
        undocumented.push_back(path);
        continue;
      }
      // A default written by the server is stated too ({} for an object only lets its
      // fields' defaults apply, which they state themselves).
      if (property.contains("default") && !property["default"].is_object() &&
          description.find("Default") == std::string::npos) {
        default_unsaid.push_back(path + " (default " + property["default"].dump() + ")");
      }
    }
    EXPECT_GT(properties.size(), 100u);
    EXPECT_TRUE(undocumented.empty()) << "properties without a description:" << Lines(undocumented);
    EXPECT_TRUE(default_unsaid.empty())
        << "properties whose description does not state their default (\"Default ...\"):"
        << Lines(default_unsaid);
  }
}

// What `kubectl get tj` and `kubectl scale` read of status is documented: every .status path of
// the printer columns and the scale subresource names a described property.
TEST(CrdSchema, StatusFieldsThatColumnsAndScaleReadAreDocumented) {
  const json crd = LoadCrd();
  for (const json& version : crd.at("spec").at("versions")) {
    SCOPED_TRACE("version " + version["name"].get<std::string>());
    std::map<std::string, json> properties = PropertiesOf(version);
    ASSERT_TRUE(properties.count("status"));
    std::vector<std::string> read;
    for (const json& column : version.value("additionalPrinterColumns", json::array())) {
      read.push_back(column["jsonPath"]);
    }
    const json scale = version["subresources"].value("scale", json::object());
    for (const char* key : {"statusReplicasPath", "labelSelectorPath"}) {
      if (scale.contains(key)) read.push_back(scale[key]);
    }
    int status_paths = 0;
    for (const std::string& json_path : read) {
      if (json_path.rfind(".status.", 0) != 0) continue;
      ++status_paths;
      const std::string path = json_path.substr(1);
      ASSERT_TRUE(properties.count(path)) << json_path << " is not a property of the schema";
      EXPECT_FALSE(properties[path].value("description", "").empty()) << path;
    }
    EXPECT_GE(status_paths, 8);
  }
}

// The table is one tree: each map below the document is a field of its parent map, so
// ManifestFieldPaths names every map and the parser reaches each through its parent.
TEST(ManifestFields, EveryMapIsAFieldOfItsParent) {
  for (const ManifestMap& map : ManifestMaps()) {
    if (map.path.empty()) continue;
    const size_t dot = map.path.rfind('.');
    const std::string_view parent = dot == std::string_view::npos ? "" : map.path.substr(0, dot);
    const std::string_view name =
        dot == std::string_view::npos ? map.path : map.path.substr(dot + 1);
    const std::vector<std::string_view>& fields = ManifestFields(parent);
    EXPECT_NE(std::find(fields.begin(), fields.end(), name), fields.end())
        << map.path << " is not a field of \"" << parent << "\"";
  }
  EXPECT_TRUE(ManifestFields("spec.nothing").empty());
}

}  // namespace
}  // namespace lockstep::spec
