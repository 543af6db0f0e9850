// The corpus of broken manifests in tests/data/bad_manifests: each file names, in its leading
// comments, the layer that must catch it and a substring of the message a user sees.
//
//   # expect: spec.replicas: must be within 1..50000 (got 0)
//   # layer: spec       (spec: the parser rejects it; files: CheckDataFiles does;
//                        dataset: both pass, and the dataset loader's tests take it)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/spec/training_job.h"

namespace lockstep::spec {
namespace {

using ::testing::HasSubstr;

const std::filesystem::path kCorpusDir =
    std::filesystem::path(LOCKSTEP_SOURCE_DIR) / "tests" / "data" / "bad_manifests";

struct BadManifest {
  std::string file;    // path of the manifest
  std::string expect;  // substring of the one-line message
  std::string layer;   // spec | files | dataset
};

std::string Trim(std::string text) {
  text.erase(0, text.find_first_not_of(" \t"));
  text.erase(text.find_last_not_of(" \t\r") + 1);
  return text;
}

std::vector<BadManifest> LoadCorpus() {
  std::vector<BadManifest> corpus;
  if (!std::filesystem::is_directory(kCorpusDir)) return corpus;
  for (const auto& entry : std::filesystem::directory_iterator(kCorpusDir)) {
    if (entry.path().extension() != ".yaml") continue;
    BadManifest manifest{entry.path().string(), "", ""};
    std::ifstream in(entry.path());
    std::string line;
    while (std::getline(in, line) && line.rfind("#", 0) == 0) {
      std::string comment = Trim(line.substr(1));
      if (comment.rfind("expect:", 0) == 0) manifest.expect = Trim(comment.substr(7));
      if (comment.rfind("layer:", 0) == 0) manifest.layer = Trim(comment.substr(6));
    }
    corpus.push_back(manifest);
  }
  std::sort(corpus.begin(), corpus.end(),
            [](const BadManifest& a, const BadManifest& b) { return a.file < b.file; });
  return corpus;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

class BadManifestTest : public ::testing::TestWithParam<BadManifest> {};

TEST(BadManifestCorpus, HoldsAtLeast35Manifests) { EXPECT_GE(LoadCorpus().size(), 35u); }

TEST_P(BadManifestTest, IsCaughtByItsLayerWithTheExpectedMessage) {
  const BadManifest& manifest = GetParam();
  ASSERT_FALSE(manifest.expect.empty()) << manifest.file << ": no `# expect:` line";
  ASSERT_THAT(manifest.layer, ::testing::AnyOf("spec", "files", "dataset"))
      << manifest.file << ": `# layer:` must be spec, files or dataset";

  StatusOr<TrainingJob> job = LoadTrainingJobFile(manifest.file);
  if (manifest.layer == "spec") {
    ASSERT_FALSE(job.ok()) << manifest.file << " parsed, but should not have";
    EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
    const std::string& message = job.status().message();
    EXPECT_THAT(message, HasSubstr(manifest.expect));
    // One problem a line, each naming the file first, so the message reads line by line.
    for (const std::string& line : Lines(message)) {
      EXPECT_EQ(line.rfind(manifest.file + ":", 0), 0u) << line;
    }
    return;
  }
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<std::string> problems = CheckDataFiles(*job);
  if (manifest.layer == "files") {
    ASSERT_FALSE(problems.empty()) << manifest.file << ": CheckDataFiles found nothing";
    bool found = false;
    for (const std::string& problem : problems) {
      EXPECT_EQ(problem.find('\n'), std::string::npos) << problem;
      found |= problem.find(manifest.expect) != std::string::npos;
    }
    EXPECT_TRUE(found) << "no problem contains \"" << manifest.expect << "\"; got "
                       << ::testing::PrintToString(problems);
  } else {
    EXPECT_TRUE(problems.empty()) << ::testing::PrintToString(problems);
  }
}

std::string TestName(const ::testing::TestParamInfo<BadManifest>& info) {
  std::string name = std::filesystem::path(info.param.file).stem().string();
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return "m" + name;
}

INSTANTIATE_TEST_SUITE_P(Corpus, BadManifestTest, ::testing::ValuesIn(LoadCorpus()), TestName);

}  // namespace
}  // namespace lockstep::spec
