// Behaviour of the TrainingJob spec model as users of `lockstep validate`, `lockstep run` and the
// operator see it: defaults, messages, JSON input, round trips and data paths.
#include "common/spec/training_job.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace lockstep::spec {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kSourceDir = LOCKSTEP_SOURCE_DIR;
const std::string kFullManifest = kSourceDir + "/tests/common/spec/testdata/full.yaml";

constexpr char kMinimal[] = R"(apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: mini}
spec:
  replicas: 3
  trainer:
    data:
      train: [images.gz, labels.gz]
    steps: 100
)";

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

std::string ParseError(const std::string& yaml) {
  StatusOr<TrainingJob> job = ParseTrainingJobYaml(yaml, "job.yaml");
  EXPECT_FALSE(job.ok()) << "parsed although it should not have";
  return job.ok() ? "" : job.status().message();
}

TEST(TrainingJobSpec, MinimalManifestGetsTheDocumentedDefaults) {
  StatusOr<TrainingJob> job = ParseTrainingJobYaml(kMinimal, "mini.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->metadata.namespace_, "default");
  EXPECT_EQ(job->spec.replicas, 3);
  EXPECT_FALSE(job->spec.elastic_set);
  EXPECT_EQ(job->spec.elastic.min_replicas, 3);
  EXPECT_EQ(job->spec.elastic.max_replicas, 3);
  ASSERT_TRUE(job->spec.trainer.has_value());
  const TrainerSpec& trainer = *job->spec.trainer;
  EXPECT_EQ(trainer.model.type, "mlp");
  EXPECT_THAT(trainer.model.hidden, ElementsAre(256));
  EXPECT_EQ(trainer.model.activation, Activation::kRelu);
  EXPECT_EQ(trainer.data.format, DataFormat::kIdx);
  EXPECT_TRUE(trainer.data.test.empty());
  EXPECT_EQ(trainer.batch_size, 64);
  EXPECT_EQ(trainer.steps, 100);
  EXPECT_EQ(trainer.epochs, 0);
  EXPECT_EQ(trainer.optimizer.type, OptimizerType::kSgd);
  EXPECT_DOUBLE_EQ(trainer.optimizer.learning_rate, 0.05);
  EXPECT_DOUBLE_EQ(trainer.optimizer.momentum, 0.9);
  EXPECT_EQ(trainer.seed, 1u);
  EXPECT_EQ(trainer.device, Device::kCpu);
  EXPECT_EQ(trainer.precision, Precision::kFp32);
  EXPECT_DOUBLE_EQ(trainer.allreduce.bucket_mib, 25);
  EXPECT_EQ(trainer.allreduce.compression, Compression::kNone);
  EXPECT_EQ(trainer.allreduce.timeout_seconds, 300);
  EXPECT_EQ(trainer.log_interval_steps, 50);
  EXPECT_EQ(job->spec.checkpoint.keep, 3);
  EXPECT_TRUE(job->spec.checkpoint.async);
  EXPECT_EQ(job->spec.network.mode, NetworkMode::kTcp);
  EXPECT_EQ(job->spec.run_policy.restart_policy, RestartPolicy::kOnFailure);
  EXPECT_EQ(job->spec.run_policy.backoff_limit, 6);
  EXPECT_FALSE(job->spec.run_policy.active_deadline_seconds.has_value());
  EXPECT_EQ(job->spec.run_policy.scheduling.gang, GangScheduler::kNone);
  EXPECT_EQ(job->spec.metrics.port, 9400);
  EXPECT_TRUE(job->spec.template_.is_null());
}

TEST(TrainingJobSpec, RanksPerWorkerDefaultsToOneAndAutoIsOnePerRequestedGpu) {
  StatusOr<TrainingJob> plain = ParseTrainingJobYaml(kMinimal, "job.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->spec.ranks_per_worker, 1);

  std::string yaml = kMinimal;
  yaml.replace(yaml.find("  replicas: 3\n"), 13,
               "  replicas: 3\n  ranksPerWorker: auto\n  resources: {gpus: 8}\n");
  StatusOr<TrainingJob> job = ParseTrainingJobYaml(yaml, "job.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.ranks_per_worker, 8);
  // The worker gets the resolved number.
  EXPECT_EQ(ToJson(*job)["spec"]["ranksPerWorker"], 8);
  StatusOr<TrainingJob> again = ParseTrainingJobJson(ToJson(*job), "job.json");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->spec, job->spec);

  yaml = kMinimal;
  yaml.replace(yaml.find("  replicas: 3\n"), 13, "  replicas: 3\n  ranksPerWorker: auto\n");
  job = ParseTrainingJobYaml(yaml, "job.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.ranks_per_worker, 1);  // no GPUs requested: one rank
}

TEST(TrainingJobSpec, ElasticEndLeftOutDefaultsToReplicas) {
  std::string yaml = kMinimal;
  yaml.replace(yaml.find("  replicas: 3\n"), 13, "  replicas: 3\n  elastic: {minReplicas: 2}\n");
  StatusOr<TrainingJob> job = ParseTrainingJobYaml(yaml, "job.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->spec.elastic_set);
  EXPECT_EQ(job->spec.elastic.min_replicas, 2);
  EXPECT_EQ(job->spec.elastic.max_replicas, 3);
}

TEST(TrainingJobSpec, StandbyWorkersRunBesideReplicasAndCapTheWorldAtReplicas) {
  std::string yaml = kMinimal;
  yaml.replace(yaml.find("  replicas: 3\n"), 13,
               "  replicas: 3\n  elastic: {minReplicas: 2, maxReplicas: 5, standby: 2}\n");
  StatusOr<TrainingJob> job = ParseTrainingJobYaml(yaml, "job.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.elastic.standby, 2);
  EXPECT_EQ(WorkersToRun(job->spec), 5);
  EXPECT_EQ(MaxWorld(job->spec), 3) << "a standby waits rather than trains";
  StatusOr<TrainingJob> again = ParseTrainingJobJson(ToJson(*job), "job.json");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->spec, job->spec);

  StatusOr<TrainingJob> plain = ParseTrainingJobYaml(kMinimal, "job.yaml");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(WorkersToRun(plain->spec), 3);
  EXPECT_EQ(MaxWorld(plain->spec), 3);
  EXPECT_FALSE(ToJson(*plain)["spec"].contains("elastic"));

  yaml = kMinimal;
  yaml.replace(yaml.find("  replicas: 3\n"), 13, "  replicas: 3\n  elastic: {standby: 49998}\n");
  StatusOr<TrainingJob> too_many = ParseTrainingJobYaml(yaml, "job.yaml");
  ASSERT_FALSE(too_many.ok());
  EXPECT_THAT(too_many.status().message(),
              HasSubstr("spec.elastic.standby: replicas + standby must be <= 50000 (got 3 + 49998)"));
}

TEST(TrainingJobSpec, FullManifestRoundTripsThroughToJson) {
  StatusOr<TrainingJob> job = LoadTrainingJobFile(kFullManifest);
  ASSERT_TRUE(job.ok()) << job.status();
  // Every field of the fixture differs from its default, so a dropped field shows here.
  EXPECT_EQ(job->spec.trainer->allreduce.compression, Compression::kBf16);
  EXPECT_EQ(job->spec.trainer->precision, Precision::kBf16);
  EXPECT_EQ(job->spec.run_policy.ttl_seconds_after_finished, 3600);
  EXPECT_EQ(job->spec.template_["spec"]["nodeSelector"]["gpu"], "h100");

  nlohmann::json json = ToJson(*job);
  StatusOr<TrainingJob> again = ParseTrainingJobJson(json, "round-trip");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << json.dump(2);
  again->base_dir = job->base_dir;
  EXPECT_TRUE(*again == *job) << json.dump(2) << "\nvs\n" << ToJson(*again).dump(2);
  EXPECT_EQ(ToJson(*again), json);
}

TEST(TrainingJobSpec, MinimalAndExecManifestsRoundTripThroughToJson) {
  for (const std::string& yaml :
       {std::string(kMinimal), std::string("apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\n"
                                           "metadata: {name: exec}\n"
                                           "spec: {replicas: 1, command: [sleep, \"1\"]}\n")}) {
    StatusOr<TrainingJob> job = ParseTrainingJobYaml(yaml, "job.yaml");
    ASSERT_TRUE(job.ok()) << job.status();
    StatusOr<TrainingJob> again = ParseTrainingJobJson(ToJson(*job), "round-trip");
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << ToJson(*job).dump(2);
    EXPECT_TRUE(*again == *job) << ToJson(*job).dump(2);
  }
}

TEST(TrainingJobSpec, JsonTextIsAcceptedByTheYamlParser) {
  StatusOr<TrainingJob> job = LoadTrainingJobFile(kFullManifest);
  ASSERT_TRUE(job.ok()) << job.status();
  StatusOr<TrainingJob> from_text = ParseTrainingJobYaml(ToJson(*job).dump(), "job.json");
  ASSERT_TRUE(from_text.ok()) << from_text.status();
  from_text->base_dir = job->base_dir;
  EXPECT_TRUE(*from_text == *job);
}

TEST(TrainingJobSpec, JsonDocumentIsValidatedWithTheSameRules) {
  nlohmann::json document = {
      {"apiVersion", "lockstep.io/v1alpha1"},
      {"kind", "TrainingJob"},
      {"metadata", {{"name", "from-json"}, {"resourceVersion", "12"}, {"uid", "abc"}}},
      {"spec", {{"replicas", 2}, {"command", {"python3", "train.py"}}}},
      {"status", {{"phase", "Running"}}}};
  StatusOr<TrainingJob> job = ParseTrainingJobJson(document, "watch");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->metadata.uid, "abc");
  EXPECT_THAT(job->spec.command, ElementsAre("python3", "train.py"));
  EXPECT_FALSE(job->spec.trainer.has_value());

  document["spec"]["replicas"] = "two";
  document["spec"]["trainer"] = {{"bachSize", 3}};
  StatusOr<TrainingJob> bad = ParseTrainingJobJson(document, "watch");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("watch: spec.replicas: expected an integer, got \"two\""));
  EXPECT_THAT(
      bad.status().message(),
      HasSubstr("watch: spec.trainer.bachSize: unknown field (did you mean \"batchSize\"?)"));
  EXPECT_THAT(bad.status().message(),
              HasSubstr("watch: spec: exactly one of trainer and command must be set (got both)"));
}

TEST(TrainingJobSpec, MisspelledFieldSuggestsTheClosestName) {
  std::string yaml = kMinimal;
  yaml += "    optimizer: {learning_rate: 0.1, momentun: 0.5, flux: 1}\n";
  std::string message = ParseError(yaml);
  EXPECT_THAT(message, HasSubstr("job.yaml: spec.trainer.optimizer.learning_rate: unknown field "
                                 "(did you mean \"learningRate\"?)"));
  EXPECT_THAT(message, HasSubstr("spec.trainer.optimizer.momentun: unknown field (did you mean "
                                 "\"momentum\"?)"));
  EXPECT_THAT(message, HasSubstr("spec.trainer.optimizer.flux: unknown field\n"));
}

TEST(TrainingJobSpec, EveryProblemIsReportedAtOnceOnePerLine) {
  std::string message = ParseError(R"(apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: three}
spec:
  replicas: 0
  trainer:
    data: {train: [a.gz, b.gz]}
    steps: 10
    batchSize: sixty-four
    optimizer: {type: adam}
)");
  EXPECT_THAT(Lines(message),
              ElementsAre("job.yaml: spec.replicas: must be within 1..50000 (got 0)",
                          "job.yaml: spec.trainer.batchSize: expected an integer, got "
                          "\"sixty-four\"",
                          "job.yaml: spec.trainer.optimizer.type: must be one of sgd, adamw "
                          "(got \"adam\")"));
}

TEST(TrainingJobSpec, MalformedYamlNamesLineAndColumn) {
  std::string message = ParseError("apiVersion: lockstep.io/v1alpha1\nspec: [1, 2\n");
  EXPECT_THAT(message, HasSubstr("job.yaml:"));
  EXPECT_THAT(message, HasSubstr(": malformed YAML: "));
  EXPECT_EQ(Lines(message).size(), 1u);
}

TEST(TrainingJobSpec, QuotedNumbersAndBooleansAreStringsNotValues) {
  std::string yaml = kMinimal;
  yaml += "  checkpoint: {keep: \"2\", async: \"true\"}\n";
  std::string message = ParseError(yaml);
  EXPECT_THAT(message, HasSubstr("spec.checkpoint.keep: expected an integer, got \"2\""));
  EXPECT_THAT(message, HasSubstr("spec.checkpoint.async: expected a boolean"));
}

TEST(TrainingJobSpec, ValueWithNewlinesStaysOnOneLine) {
  std::string yaml = kMinimal;
  yaml += "  image: [1]\n  metrics: {port: \"a\\nb\"}\n";
  std::string message = ParseError(yaml);
  EXPECT_THAT(Lines(message), ElementsAre("job.yaml: spec.image: expected a string, got a list",
                                          "job.yaml: spec.metrics.port: expected an integer, "
                                          "got \"a\\nb\""));
}

TEST(TrainingJobSpec, TheWorkersImageIsNamedOnceAndItsCommandIsTheSpecs) {
  const std::string exec = R"(apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: ddp}
spec:
  replicas: 2
  command: [python3, train.py]
)";
  // Named in the template, as Kubernetes users name an image: that is the worker's image.
  StatusOr<TrainingJob> job =
      ParseTrainingJobYaml(exec +
                               "  template: {spec: {containers: [{name: sidecar, image: a}, "
                               "{name: worker, image: \"my/train:1\"}]}}\n",
                           "job.yaml");
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_EQ(NamedWorkerImage(job->spec), "my/train:1");
  job = ParseTrainingJobYaml(exec + "  image: my/train:2\n", "job.yaml");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(NamedWorkerImage(job->spec), "my/train:2");

  // Two different names, or a command the operator would not run: refused, naming the field.
  EXPECT_THAT(Lines(ParseError(exec + "  image: my/train:2\n  template: {spec: {containers: "
                                      "[{name: worker, image: \"my/train:1\", "
                                      "args: [--lr, \"1\"]}]}}\n")),
              ElementsAre("job.yaml: spec.template.spec.containers[0].image: names my/train:1 but "
                          "spec.image names my/train:2: name the worker's image once",
                          "job.yaml: spec.template.spec.containers[0].args: the worker runs the "
                          "Lockstep agent, which runs spec.command: put the program and its "
                          "arguments in spec.command"));
  EXPECT_THAT(ParseError(std::string(kMinimal) +
                         "  template: {spec: {containers: [{name: worker, command: [x]}]}}\n"),
              HasSubstr("job.yaml: spec.template.spec.containers[0].command: the worker runs the "
                        "built-in trainer (lockstep-worker train); to run a program of yours, "
                        "use spec.command instead of spec.trainer"));
}

TEST(TrainingJobSpec, MissingManifestFileIsNotFoundNamingIt) {
  StatusOr<TrainingJob> job = LoadTrainingJobFile("/nonexistent/dir/job.yaml");
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(job.status().message(), HasSubstr("/nonexistent/dir/job.yaml"));
}

class DataPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("lockstep_spec_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "data");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Write(const std::filesystem::path& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }

  std::filesystem::path dir_;
};

TEST_F(DataPathTest, RelativeDataPathsResolveAgainstTheManifestDirectory) {
  Write(dir_ / "data" / "images.gz", "x");
  Write(dir_ / "job.yaml", std::string(kMinimal).replace(std::string(kMinimal).find("images.gz"), 9,
                                                         "data/images.gz"));
  StatusOr<TrainingJob> job = LoadTrainingJobFile((dir_ / "job.yaml").string());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->base_dir, dir_.lexically_normal().string());
  EXPECT_EQ(ResolveDataPath(*job, job->spec.trainer->data.train[0]),
            (dir_ / "data" / "images.gz").string());
  EXPECT_EQ(ResolveDataPath(*job, "file:///abs/x.gz"), "/abs/x.gz");
  EXPECT_EQ(ResolveDataPath(*job, "file://rel/x.gz"), (dir_ / "rel" / "x.gz").string());
  EXPECT_THAT(CheckDataFiles(*job), ElementsAre("spec.trainer.data.train[1]: file not found: " +
                                                (dir_ / "labels.gz").string()));
}

TEST_F(DataPathTest, DirectoryGivenAsDataFileIsReported) {
  Write(dir_ / "job.yaml", R"(apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: csv}
spec:
  replicas: 1
  trainer:
    data: {format: csv, train: [data], test: [file:///usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz]}
    epochs: 1
)");
  StatusOr<TrainingJob> job = LoadTrainingJobFile((dir_ / "job.yaml").string());
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<std::string> problems = CheckDataFiles(*job);
  ASSERT_FALSE(problems.empty());
  EXPECT_EQ(problems[0],
            "spec.trainer.data.train[0]: not a regular file: " + (dir_ / "data").string());
}

TEST_F(DataPathTest, AFifoGivenAsTheManifestIsRefusedWithoutWaitingForAWriter) {
  const std::string fifo = (dir_ / "job.yaml").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Before the fix the open blocked for ever; nothing writes to this FIFO.
  StatusOr<TrainingJob> job = LoadTrainingJobFile(fifo);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr(fifo + ": not a regular file"));
}

TEST(TrainingJobSpec, ADeviceGivenAsTheManifestIsRefusedBeforeAnythingIsRead) {
  StatusOr<TrainingJob> job = LoadTrainingJobFile("/dev/zero");
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().message(), HasSubstr("/dev/zero: not a regular file"));
}

TEST_F(DataPathTest, AManifestLargerThanTheApiServerTakesIsRefusedNamingTheLimit) {
  // A valid manifest padded with a comment past the limit: refused for its size, not parsed.
  Write(dir_ / "job.yaml", std::string(kMinimal) + "# " + std::string(kMaxManifestBytes, 'x'));
  StatusOr<TrainingJob> job = LoadTrainingJobFile((dir_ / "job.yaml").string());
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("larger than 1536 KiB"));
  // At the limit it is read and parsed.
  Write(dir_ / "job.yaml", std::string(kMinimal) + "# " +
                               std::string(kMaxManifestBytes - sizeof(kMinimal) - 2, 'x'));
  EXPECT_TRUE(LoadTrainingJobFile((dir_ / "job.yaml").string()).ok());
}

TEST(TrainingJobSpec, AThousandBadValuesGiveABoundedListOfProblems) {
  std::string yaml = std::string(kMinimal) + "  runPolicy:\n    retryableExitCodes: [";
  for (int i = 0; i < 1000; ++i) yaml += (i ? ", " : "") + std::string("x");
  yaml += "]\n";
  std::vector<std::string> lines = Lines(ParseError(yaml));
  ASSERT_EQ(lines.size(), 51u);
  EXPECT_EQ(lines.back(), "job.yaml: ... and 950 more problems");
}

TEST(TrainingJobSpec, QuantityValueReadsKubernetesSuffixes) {
  EXPECT_EQ(QuantityValue("64Gi"), 64.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(QuantityValue("512Mi"), 512.0 * 1024 * 1024);
  EXPECT_EQ(QuantityValue("2G"), 2e9);
  EXPECT_EQ(QuantityValue("1e3"), 1000);
  EXPECT_EQ(QuantityValue("500m"), 0.5);
  EXPECT_EQ(QuantityValue("1.5Ki"), 1536);
  EXPECT_TRUE(std::isnan(QuantityValue("12 apples")));
  EXPECT_TRUE(std::isnan(QuantityValue("")));
}

// spec.rendezvous.store: the job's own store limits, as numbers or quantities of bytes; what
// cannot be one is refused naming the field; unset is 0 (the ranks' default) and stays unset
// through the JSON the operator hands the workers.
TEST(TrainingJobSpec, RendezvousStoreLimitsReadAsKeysAndBytes) {
  StatusOr<TrainingJob> set = ParseTrainingJobYaml(
      std::string(kMinimal) + "  rendezvous:\n    store: {maxKeys: 100000, maxBytes: 64Mi}\n",
      "job.yaml");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->spec.rendezvous.store.max_keys, 100000);
  EXPECT_EQ(set->spec.rendezvous.store.max_bytes, int64_t{64} << 20);
  StatusOr<TrainingJob> again = ParseTrainingJobJson(ToJson(*set), "");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->spec.rendezvous.store.max_bytes, int64_t{64} << 20);

  StatusOr<TrainingJob> plain = ParseTrainingJobYaml(kMinimal, "job.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->spec.rendezvous.store.max_keys, 0);
  EXPECT_FALSE(ToJson(*plain)["spec"].contains("rendezvous"));

  for (const char* bad : {"500m", "0", "17Gi", "lots", "-1"}) {
    const std::string message = ParseError(std::string(kMinimal) +
                                           "  rendezvous:\n    store: {maxBytes: \"" + bad +
                                           "\"}\n");
    EXPECT_NE(message.find("spec.rendezvous.store.maxBytes"), std::string::npos)
        << bad << ": " << message;
  }
  EXPECT_NE(ParseError(std::string(kMinimal) + "  rendezvous:\n    store: {maxKeys: 0}\n")
                .find("spec.rendezvous.store.maxKeys"),
            std::string::npos);
  EXPECT_NE(ParseError(std::string(kMinimal) + "  rendezvous:\n    store: {maxKeyz: 1}\n")
                .find("spec.rendezvous.store.maxKeyz"),
            std::string::npos);
}

TEST(TrainingJobSpec, RealDatasetFilesPassTheFileCheck) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed on this machine";
  }
  StatusOr<TrainingJob> job = LoadTrainingJobFile(kFullManifest);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT(CheckDataFiles(*job), ElementsAre());
}

TEST(TrainingJobSpec, ExecModeNeedsNoTrainerAndChecksNoDataFiles) {
  StatusOr<TrainingJob> job = ParseTrainingJobYaml(R"(apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: exec}
spec:
  replicas: 2
  command: ["python3", "train.py", "--lr", "0.1"]
)",
                                                   "exec.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FALSE(job->spec.trainer.has_value());
  EXPECT_THAT(CheckDataFiles(*job), ElementsAre());
}

TEST(TrainingJobSpec, TotalStepsConvertsEpochsWithTheGlobalBatch) {
  TrainingJobSpec spec;
  spec.replicas = 4;
  spec.trainer.emplace();
  TrainerSpec& trainer = *spec.trainer;
  trainer.batch_size = 64;
  trainer.steps = 500;
  EXPECT_EQ(TotalSteps(spec, 60000, 4), 500);
  trainer.steps = 0;
  trainer.epochs = 2;
  // 60000 samples / (64 * 4) = 234.375 -> 235 steps an epoch, the last one partial.
  EXPECT_EQ(TotalSteps(spec, 60000, 4), 470);
  EXPECT_EQ(TotalSteps(spec, 256, 4), 2);
  EXPECT_EQ(TotalSteps(spec, 0, 4), 0);
  // A fixed global batch does not change with the world; one that scales does.
  EXPECT_EQ(TotalSteps(spec, 60000, 3), 470);
  spec.elastic.global_batch = GlobalBatch::kScaleWithWorld;
  EXPECT_EQ(TotalSteps(spec, 60000, 3), 2 * 313);  // 60000 / 192 = 312.5
}

TEST(TrainingJobSpec, FixedSizeJobKeepsItsGlobalBatchWhenTheWorldShrinks) {
  std::string yaml = kMinimal;
  yaml.replace(yaml.find("  replicas: 3\n"), 13, "  replicas: 3\n  ranksPerWorker: 2\n");
  StatusOr<TrainingJob> job = ParseTrainingJobYaml(yaml, "job.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.elastic.global_batch, GlobalBatch::kFixed);
  // replicas 3 x ranksPerWorker 2 x batchSize 64, at 6 ranks and at 5 while one is replaced.
  EXPECT_EQ(GlobalBatchSize(job->spec, 6), 384);
  EXPECT_EQ(GlobalBatchSize(job->spec, 5), 384);
  EXPECT_EQ(GlobalBatchSize(job->spec, 1), 384);
}

TEST(TrainingJobSpec, ElasticJobScalesItsGlobalBatchWithTheWorldUnlessItAsksForAFixedOne) {
  std::string yaml = kMinimal;
  yaml.replace(yaml.find("  replicas: 3\n"), 13,
               "  replicas: 3\n  elastic: {minReplicas: 2, maxReplicas: 4}\n");
  StatusOr<TrainingJob> elastic = ParseTrainingJobYaml(yaml, "job.yaml");
  ASSERT_TRUE(elastic.ok()) << elastic.status();
  EXPECT_EQ(elastic->spec.elastic.global_batch, GlobalBatch::kScaleWithWorld);
  EXPECT_EQ(GlobalBatchSize(elastic->spec, 2), 128);
  EXPECT_EQ(GlobalBatchSize(elastic->spec, 4), 256);

  yaml.replace(yaml.find("maxReplicas: 4}"), 15, "maxReplicas: 4, globalBatch: fixed}");
  StatusOr<TrainingJob> fixed = ParseTrainingJobYaml(yaml, "job.yaml");
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(fixed->spec.elastic.global_batch, GlobalBatch::kFixed);
  EXPECT_EQ(GlobalBatchSize(fixed->spec, 2), 192);
  EXPECT_EQ(GlobalBatchSize(fixed->spec, 4), 192);
  StatusOr<TrainingJob> again = ParseTrainingJobJson(ToJson(*fixed), "round-trip");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->spec.elastic.global_batch, GlobalBatch::kFixed);

  // A fixed-size job may ask for today's scaling too.
  yaml = kMinimal;
  yaml.replace(yaml.find("  replicas: 3\n"), 13,
               "  replicas: 3\n  elastic: {globalBatch: scaleWithWorld}\n");
  StatusOr<TrainingJob> scaling = ParseTrainingJobYaml(yaml, "job.yaml");
  ASSERT_TRUE(scaling.ok()) << scaling.status();
  EXPECT_EQ(GlobalBatchSize(scaling->spec, 2), 128);
}

TEST(TrainingJobSpec, UnknownGlobalBatchPolicyIsRefusedNamingTheFieldAndTheChoices) {
  std::string yaml = kMinimal;
  yaml.replace(yaml.find("  replicas: 3\n"), 13,
               "  replicas: 3\n  elastic: {globalBatch: constant}\n");
  EXPECT_THAT(ParseError(yaml),
              HasSubstr("spec.elastic.globalBatch: must be one of fixed, scaleWithWorld (got "
                        "\"constant\")"));
}

TEST(TrainingJobSpec, ReplaceStragglersIsOffUnlessAskedForTheTrainerAndACommandJobAlike) {
  StatusOr<TrainingJob> plain = ParseTrainingJobYaml(kMinimal, "job.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->spec.elastic.replace_stragglers);

  std::string yaml = kMinimal;
  yaml.replace(yaml.find("  replicas: 3\n"), 13,
               "  replicas: 3\n  elastic: {replaceStragglers: true}\n");
  StatusOr<TrainingJob> asked = ParseTrainingJobYaml(yaml, "job.yaml");
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_TRUE(asked->spec.elastic.replace_stragglers);
  // The operator hands the spec to its workers as JSON: the field survives it.
  StatusOr<TrainingJob> again = ParseTrainingJobJson(ToJson(*asked), "env");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->spec.elastic.replace_stragglers);

  const std::string exec = R"(apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: mini}
spec:
  replicas: 3
  elastic: {replaceStragglers: true}
  command: [python3, train.py]
)";
  // A command job's program is paced by what it reports of its compute time (docs/exec.md).
  EXPECT_TRUE(ParseTrainingJobYaml(exec, "job.yaml").ok());
}

TEST(TrainingJobSpec, PlacementNamesANodeLabelLevelAndSurvivesTheRoundTrip) {
  StatusOr<TrainingJob> plain = ParseTrainingJobYaml(kMinimal, "job.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->spec.placement.topology.empty());

  std::string yaml = kMinimal;
  yaml.replace(yaml.find("  replicas: 3\n"), 13,
               "  replicas: 3\n  placement: {topology: topology.lockstep.io/rack, mode: "
               "preferred}\n");
  StatusOr<TrainingJob> asked = ParseTrainingJobYaml(yaml, "job.yaml");
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->spec.placement.topology, "topology.lockstep.io/rack");
  EXPECT_EQ(asked->spec.placement.mode, PlacementMode::kPreferred);
  StatusOr<TrainingJob> again = ParseTrainingJobJson(ToJson(*asked), "env");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->spec.placement == asked->spec.placement);
}

TEST(TrainingJobSpec, APlacementThatIsNoLevelIsRefusedNamingTheField) {
  auto with = [](const std::string& placement) {
    std::string yaml = kMinimal;
    yaml.replace(yaml.find("  replicas: 3\n"), 13, "  replicas: 3\n  placement: " + placement + "\n");
    return ParseError(yaml);
  };
  EXPECT_THAT(with("{mode: required}"), HasSubstr("spec.placement.topology: required"));
  EXPECT_THAT(with("{topology: \"rack a\"}"),
              HasSubstr("spec.placement.topology: must be a node label key"));
  EXPECT_THAT(with("{topology: example.com/}"),
              HasSubstr("spec.placement.topology: must be a node label key"));
  EXPECT_THAT(with("{topology: example..com/rack}"),
              HasSubstr("spec.placement.topology: must be a node label key"));
  EXPECT_THAT(with("{topology: rack, mode: always}"),
              HasSubstr("spec.placement.mode: must be one of required, preferred"));
  EXPECT_THAT(with("{topology: rack, volcanoTier: 2}"),
              HasSubstr("spec.placement.volcanoTier: only Volcano reads it"));
}

TEST(TrainingJobSpec, EnumNamesAreTheManifestSpellings) {
  EXPECT_STREQ(ToString(OptimizerType::kAdamW), "adamw");
  EXPECT_STREQ(ToString(RestartPolicy::kOnFailure), "OnFailure");
  EXPECT_STREQ(ToString(GangScheduler::kNone), "");
  EXPECT_STREQ(ToString(GangScheduler::kSchedulerPlugins), "scheduler-plugins");
  EXPECT_STREQ(ToString(NetworkMode::kInfiniband), "infiniband");
  EXPECT_STREQ(ToString(GlobalBatch::kScaleWithWorld), "scaleWithWorld");
}

// kMinimal with a pipeline: 4 hidden layers (5 layers), 2 replicas of 2 ranks, batch 64.
std::string PipelineJob(const std::string& pipeline, const std::string& extra = "") {
  return "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: pipe}\n"
         "spec:\n  replicas: 2\n  ranksPerWorker: 2\n" +
         extra +
         "  trainer:\n    model: {hidden: [64, 64, 64, 64]}\n    data:\n"
         "      train: [images.gz, labels.gz]\n    batchSize: 64\n    steps: 10\n"
         "    pipeline: " +
         pipeline + "\n";
}

TEST(TrainingJobSpec, PipelineIsReadWithItsDefaultsAndRoundTrips) {
  StatusOr<TrainingJob> job = ParseTrainingJobYaml(PipelineJob("{stages: 2}"), "job.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  const PipelineSpec& pipeline = job->spec.trainer->pipeline;
  EXPECT_EQ(pipeline.stages, 2);
  EXPECT_EQ(pipeline.micro_batches, 1);
  EXPECT_EQ(pipeline.schedule, PipelineSchedule::k1F1B);
  EXPECT_FALSE(pipeline.recompute);
  EXPECT_TRUE(pipeline.stage_layers.empty());

  job = ParseTrainingJobYaml(
      PipelineJob("{stages: 4, microBatches: 8, schedule: gpipe, recompute: true, "
                  "stageLayers: [2, 1, 1, 1]}"),
      "job.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.trainer->pipeline.schedule, PipelineSchedule::kGpipe);
  EXPECT_THAT(job->spec.trainer->pipeline.stage_layers, ElementsAre(2, 1, 1, 1));
  nlohmann::json json = ToJson(*job);
  EXPECT_EQ(json["spec"]["trainer"]["pipeline"]["schedule"], "gpipe");
  StatusOr<TrainingJob> again = ParseTrainingJobJson(json, "round-trip");
  ASSERT_TRUE(again.ok()) << again.status();
  again->base_dir = job->base_dir;
  EXPECT_TRUE(*again == *job) << json.dump(2);
}

TEST(TrainingJobSpec, APipelineTheModelOrWorldCannotHaveIsRefusedNamingTheField) {
  EXPECT_THAT(ParseError(PipelineJob("{stages: 6}")),
              HasSubstr("spec.trainer.pipeline.stages: 6 stages, but the model has 5 layers (4 "
                        "hidden and the output layer): a stage holds at least one layer"));
  EXPECT_THAT(ParseError(PipelineJob("{stages: 2, microBatches: 3}")),
              HasSubstr("spec.trainer.pipeline.microBatches: must divide batchSize 64 (got 3)"));
  EXPECT_THAT(ParseError(PipelineJob("{stages: 2, stageLayers: [2, 2]}")),
              HasSubstr("spec.trainer.pipeline.stageLayers: must add up to the model's layers: "
                        "the model has 5 layers"));
  EXPECT_THAT(ParseError(PipelineJob("{stages: 2, stageLayers: [5]}")),
              HasSubstr("spec.trainer.pipeline.stageLayers: must have one entry per stage: 2 "
                        "(got 1)"));
  EXPECT_THAT(ParseError(PipelineJob("{stages: 2, stageLayers: [5, 0]}")),
              HasSubstr("spec.trainer.pipeline.stageLayers[1]"));
  EXPECT_THAT(ParseError(PipelineJob("{stages: 0}")), HasSubstr("spec.trainer.pipeline.stages"));
  EXPECT_THAT(ParseError(PipelineJob("{stages: 2, schedule: interleaved}")),
              HasSubstr("spec.trainer.pipeline.schedule: must be one of gpipe, 1f1b"));
  EXPECT_THAT(ParseError(PipelineJob("{stages: 1, microBatches: 4}")),
              HasSubstr("spec.trainer.pipeline.microBatches: applies to a pipeline of 2 or more "
                        "stages (stages is 1)"));
  // 2 replicas x 2 ranks = 4 ranks: not 3 stages per replica.
  EXPECT_THAT(ParseError(PipelineJob("{stages: 3}")),
              HasSubstr("spec.replicas: replicas x ranksPerWorker (4) must be a multiple of the "
                        "pipeline's stages"));
  // 2 ranks per worker: a replica of 4 stages is 2 workers, one of 2 stages is 1.
  EXPECT_THAT(ParseError(PipelineJob("{stages: 4}", "  elastic: {minReplicas: 1}\n")),
              HasSubstr("spec.elastic.minReplicas: a pipeline's generations hold whole replicas "
                        "of it (2 workers of 2 rank(s) each): must be a multiple of 2 (got 1)"));
  EXPECT_TRUE(
      ParseTrainingJobYaml(PipelineJob("{stages: 2}", "  elastic: {minReplicas: 1}\n"), "job.yaml")
          .ok());
  EXPECT_THAT(ParseError(PipelineJob("{stages: 2}", "  elastic: {standby: 1}\n")),
              HasSubstr("spec.elastic.standby: a pipeline job keeps no standbys"));
  // batchSize 64 x 2 workers / 16 workers: 8 samples per replica, for 16 micro-batches.
  EXPECT_THAT(
      ParseError(PipelineJob("{stages: 2, microBatches: 16}",
                             "  elastic: {minReplicas: 2, maxReplicas: 16, globalBatch: fixed}\n")),
      HasSubstr("spec.elastic.maxReplicas: with globalBatch fixed, 16 workers give each pipeline "
                "replica 8 samples of the global batch, fewer than microBatches (16)"));
  EXPECT_THAT(ParseError(PipelineJob("{stages: 2}\n    sync: {strategy: localSGD}")),
              HasSubstr("spec.trainer.sync.strategy: a pipeline's stages all-reduce their "
                        "gradients among their replicas: only allreduce (got localSGD)"));
  EXPECT_THAT(ParseError(PipelineJob("{stages: 2}\n    device: cuda")),
              HasSubstr("spec.trainer.device: pipeline stages run on device cpu (got cuda)"));
}

}  // namespace
}  // namespace lockstep::spec

namespace lockstep::spec {
namespace {

std::string ParameterServerJob(const std::string& mode_and_more) {
  return R"(apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: ctr}
spec:
  replicas: 4
  parameterServers: {replicas: 2, resources: {cpu: "4", memory: 8Gi}}
  trainer:
    model: {hidden: [64], embedding: {fields: 26, dim: 16, rows: 10000000}}
    data: {format: clickLog, train: [train.tsv.gz], test: [test.tsv.gz]}
    batchSize: 512
    steps: 1000
    optimizer: {type: sgd, learningRate: 0.1, momentum: 0}
    sync: {strategy: parameterServer, parameterServer: )" +
         mode_and_more + "}\n";
}

TEST(TrainingJobSpec, AParameterServerJobIsReadWithItsServersModelAndModeAndRoundTrips) {
  StatusOr<TrainingJob> job = ParseTrainingJobYaml(ParameterServerJob("{mode: geo}"), "job.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.parameter_servers.replicas, 2);
  EXPECT_EQ(job->spec.parameter_servers.resources.memory, "8Gi");
  ASSERT_TRUE(job->spec.trainer->model.embedding.has_value());
  EXPECT_EQ(job->spec.trainer->model.embedding->fields, 26);
  EXPECT_EQ(job->spec.trainer->model.embedding->rows, 10000000);
  const ParameterServerSyncSpec& sync = job->spec.trainer->sync.parameter_server;
  EXPECT_EQ(sync.mode, ParameterServerMode::kGeo);
  EXPECT_EQ(sync.geo_interval, 8);
  EXPECT_EQ(sync.staleness, -1);
  nlohmann::json json = ToJson(*job);
  EXPECT_EQ(json["spec"]["trainer"]["sync"]["parameterServer"]["mode"], "geo");
  StatusOr<TrainingJob> again = ParseTrainingJobJson(json, "round-trip");
  ASSERT_TRUE(again.ok()) << again.status();
  again->base_dir = job->base_dir;
  EXPECT_TRUE(*again == *job) << json.dump(2);

  job = ParseTrainingJobYaml(ParameterServerJob("{mode: async, staleness: 3}"), "job.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.trainer->sync.parameter_server.staleness, 3);
}

TEST(TrainingJobSpec, WhatParameterServersCannotDoIsRefusedNamingTheField) {
  std::string yaml = ParameterServerJob("{mode: async}");
  auto with = [&](const std::string& from, const std::string& to) {
    std::string changed = yaml;
    changed.replace(changed.find(from), from.size(), to);
    return changed;
  };
  EXPECT_THAT(ParseError(with("momentum: 0", "momentum: 0.9")),
              HasSubstr("spec.trainer.optimizer: the parameter servers apply plain SGD"));
  EXPECT_THAT(ParseError(with("steps: 1000", "steps: 1000\n    device: cuda")),
              HasSubstr("spec.trainer.device: the sparse model trains on device cpu"));
  EXPECT_THAT(ParseError(with("format: clickLog", "format: csv")),
              HasSubstr("spec.trainer.data.format: sync.strategy parameterServer trains on "
                        "format clickLog (got csv)"));
  EXPECT_THAT(ParseError(with("  parameterServers: {replicas: 2, resources: {cpu: \"4\", "
                              "memory: 8Gi}}\n",
                              "")),
              HasSubstr("spec.parameterServers: required by sync.strategy parameterServer"));
  EXPECT_THAT(
      ParseError(with("embedding: {fields: 26, dim: 16, rows: 10000000}", "embedding: {dim: 16}")),
      HasSubstr("spec.trainer.model.embedding.fields: required"));
  EXPECT_THAT(ParseError(with("  replicas: 4\n", "  replicas: 4\n  elastic: {minReplicas: 2}\n")),
              HasSubstr("spec.elastic: a parameter-server job runs a fixed number of workers"));
  EXPECT_THAT(
      ParseError(with("  replicas: 4\n", "  replicas: 4\n  checkpoint: {uri: file:///c}\n")),
      HasSubstr("spec.checkpoint.intervalSteps: the parameter servers checkpoint their shards "
                "every intervalSteps steps of the slowest worker: 1 or more (got 0)"));
  EXPECT_THAT(ParseError(with("rows: 10000000", "rows: 1073741824")),
              HasSubstr("spec.trainer.model.embedding.rows: 1073741824 rows of 16 floats are "
                        "32768 MiB per parameter server, more than one holds (4 GiB): use at "
                        "least 16 spec.parameterServers.replicas or fewer rows"));
  EXPECT_THAT(ParseError(ParameterServerJob("{mode: sync, staleness: 1}")),
              HasSubstr("spec.trainer.sync.parameterServer.staleness: bounds mode async"));
  EXPECT_THAT(ParseError(ParameterServerJob("{mode: bulk}")),
              HasSubstr("spec.trainer.sync.parameterServer.mode: must be one of sync, async, geo "
                        "(got \"bulk\")"));
  // A command job's servers are TensorFlow ps tasks: one process per pod, a fixed cluster.
  const std::string tensorflow = R"(apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {name: tf}
spec:
  replicas: 2
  parameterServers: {replicas: 1}
  command: [python3, train.py]
)";
  EXPECT_TRUE(ParseTrainingJobYaml(tensorflow, "job.yaml").ok());
  EXPECT_THAT(ParseError(tensorflow + "  ranksPerWorker: 2\n"),
              HasSubstr("spec.ranksPerWorker: a TensorFlow task is one process per pod (got 2)"));
}

}  // namespace
}  // namespace lockstep::spec
