// The field names of every map of a TrainingJob manifest, in one table. The parser reads each map
// with exactly these names (any other key is reported as an unknown field), and tests compare
// them with the CRD's schema (crds/trainingjob.yaml), so a field added to one and not the other
// fails a test instead of being pruned by the API server or refused by `lockstep validate`.
//
//   for (const std::string& path : ManifestFieldPaths()) std::cout << path << "\n";
//   // apiVersion, kind, metadata, metadata.annotations, ..., spec.trainer.optimizer.beta1, ...
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lockstep::spec {

// One map of the manifest that the parser reads field by field.
struct ManifestMap {
  std::string_view path;                 // dotted from the document: "" (itself), "spec.trainer"
  std::vector<std::string_view> fields;  // its keys, as the manifest spells them
};

// Every map the parser reads field by field, each parent before its children. A field that is
// not itself a map of this table is a leaf: a scalar, a list, or a map read as a whole whose keys
// are free (metadata.labels, spec.template, spec.network.ncclEnv, and status, the operator's).
const std::vector<ManifestMap>& ManifestMaps();

// The fields of the map at `path` ("spec.trainer.optimizer"); empty when no map of the table has
// that path.
const std::vector<std::string_view>& ManifestFields(std::string_view path);

// Every field path of the manifest, maps and leaves alike, dotted and sorted: "apiVersion", ...,
// "spec", "spec.checkpoint", "spec.checkpoint.async", ...
std::vector<std::string> ManifestFieldPaths();

}  // namespace lockstep::spec
