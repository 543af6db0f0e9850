// A parameter-server job's training (worker/ps/ps_job.h) over real servers and clients on
// loopback, its workers as threads: the modes against each other and against plain SGD, the
// staleness bound, and a worker that starts again where its predecessor stopped.
#include "worker/ps/ps_job.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/spec/training_job.h"
#include "worker/ps/click_log.h"
#include "worker/ps/ps_server.h"

namespace lockstep::ps {
namespace {

constexpr char kToken[] = "job-token";

struct JobOptions {
  int workers = 1;
  int servers = 1;
  std::string mode = "sync";
  std::string extra;  // more of sync.parameterServer, e.g. ", staleness: 2"
  int64_t batch = 64;
  int64_t steps = 0;
  int64_t epochs = 3;
  double learning_rate = 0.5;
};

spec::TrainingJob Job(const JobOptions& options) {
  std::string yaml =
      "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\n"
      "metadata: {name: ctr}\nspec:\n  replicas: " +
      std::to_string(options.workers) +
      "\n  parameterServers: {replicas: " + std::to_string(options.servers) +
      "}\n  trainer:\n    model: {hidden: [32], embedding: {fields: 8, dim: 8, "
      "rows: 65536}}\n    data: {format: clickLog, train: [t.tsv]}\n"
      "    batchSize: " +
      std::to_string(options.batch) + "\n    " +
      (options.steps > 0 ? "steps: " + std::to_string(options.steps)
                         : "epochs: " + std::to_string(options.epochs)) +
      "\n    optimizer: {type: sgd, learningRate: " + std::to_string(options.learning_rate) +
      ", momentum: 0}\n    seed: 3\n    logIntervalSteps: 1\n"
      "    sync: {strategy: parameterServer, parameterServer: {mode: " +
      options.mode + options.extra + "}}\n";
  StatusOr<spec::TrainingJob> job = spec::ParseTrainingJobYaml(yaml, "job.yaml");
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : spec::TrainingJob();
}

ClickLog Log(int64_t samples, uint64_t seed = 5) {
  ClickLogSpec spec;
  spec.samples = samples;
  spec.fields = 8;
  spec.vocabulary = 200;  // every id seen often enough to be learned
  spec.seed = seed;
  return GenerateClickLog(spec);
}

// A job's servers, on loopback.
class Servers {
 public:
  explicit Servers(const spec::TrainingJob& job) {
    StatusOr<std::vector<TableSpec>> tables = JobTables(job);
    EXPECT_TRUE(tables.ok()) << tables.status();
    for (int s = 0; s < job.spec.parameter_servers.replicas && tables.ok(); ++s) {
      ShardServerOptions options;
      options.job = "default/ctr";
      options.token = kToken;
      options.shard = s;
      options.shards = job.spec.parameter_servers.replicas;
      options.workers = job.spec.replicas;
      options.tables = *tables;
      StatusOr<std::unique_ptr<ShardServer>> server = ShardServer::Start(options);
      EXPECT_TRUE(server.ok()) << server.status();
      if (!server.ok()) return;
      addresses_.push_back("127.0.0.1:" + std::to_string((*server)->port()));
      servers_.push_back(std::move(*server));
    }
  }

  std::unique_ptr<PsClient> Client() const {
    PsClientOptions options;
    options.servers = addresses_;
    options.job = "default/ctr";
    options.token = kToken;
    StatusOr<std::unique_ptr<PsClient>> client = PsClient::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // Rows [0, rows) of `table`, read from the servers' shards.
  std::vector<float> Table(const std::string& table, int64_t rows) const {
    const int32_t dim = servers_[0]->table(table)->spec().dim;
    std::vector<float> out(static_cast<size_t>(rows * dim));
    for (int64_t r = 0; r < rows; ++r) {
      const uint64_t row = static_cast<uint64_t>(r);
      const ShardTable* shard =
          servers_[static_cast<size_t>(ShardOfRow(row, static_cast<int>(servers_.size())))]->table(
              table);
      EXPECT_TRUE(shard->Pull(&row, 1, out.data() + r * dim).ok());
    }
    return out;
  }

 private:
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<ShardServer>> servers_;
};

// Every worker of `job` as a thread; the chief's result.
PsTrainingResult TrainAll(const spec::TrainingJob& job, const Servers& servers,
                          const ClickLog& train, const ClickLog* test) {
  const int workers = job.spec.replicas;
  std::vector<StatusOr<PsTrainingResult>> results(workers, InternalError("not run"));
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      std::unique_ptr<PsClient> client = servers.Client();
      PsTrainingOptions options;
      options.job = job;
      options.worker = w;
      options.wait_timeout_ms = 60000;
      results[w] = TrainThroughServers(options, train, test, *client);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int w = 0; w < workers; ++w) {
    EXPECT_TRUE(results[w].ok()) << "worker " << w << ": " << results[w].status();
  }
  return results[0].ok() ? *results[0] : PsTrainingResult();
}

int64_t DenseRows(const spec::TrainingJob& job) {
  StatusOr<std::vector<TableSpec>> tables = JobTables(job);
  return tables.ok() ? (*tables)[1].rows : 0;
}

TEST(PsJobTest, SyncWithOneWorkerAndOneServerEndsBitForBitWherePlainSgdEnds) {
  JobOptions options;
  options.steps = 120;
  const spec::TrainingJob job = Job(options);
  const ClickLog log = Log(3000);  // 47 batches: the steps wrap around the log twice
  Servers servers(job);
  TrainAll(job, servers, log, nullptr);

  // Plain SGD here on the same batches, in the same order.
  StatusOr<SparseModelSpec> spec = SparseModelSpecOf(job);
  ASSERT_TRUE(spec.ok());
  auto model = SparseModel::Create(*spec);
  auto table = LocalTable::Create(EmbeddingTable(*spec));
  ASSERT_TRUE(model.ok() && table.ok());
  const int64_t batches = (log.samples + options.batch - 1) / options.batch;
  for (int64_t step = 0; step < options.steps; ++step) {
    const int64_t first = (step % batches) * options.batch;
    ASSERT_TRUE(
        (*model)->Step(log, first, std::min(options.batch, log.samples - first), **table).ok());
  }
  std::vector<float> mlp = servers.Table("dense", DenseRows(job));
  mlp.resize((*model)->mlp_params().size());
  EXPECT_EQ(mlp, (*model)->mlp_params());
  std::vector<float> local(static_cast<size_t>(spec->table_rows * spec->dim));
  std::vector<uint64_t> all(static_cast<size_t>(spec->table_rows));
  for (size_t r = 0; r < all.size(); ++r) all[r] = r;
  ASSERT_TRUE((*table)->Pull(all, local.data()).ok());
  EXPECT_TRUE(servers.Table("embeddings", spec->table_rows) == local)
      << "the embedding tables differ";
}

TEST(PsJobTest, SyncWithTwoWorkersTrainsAsOneWorkerOnTheirGlobalBatch) {
  JobOptions two;
  two.workers = 2;
  two.servers = 2;
  two.steps = 60;
  JobOptions one = two;
  one.workers = 1;
  one.servers = 1;
  one.batch = 2 * two.batch;
  const ClickLog log = Log(2 * 64 * 20);  // whole global batches
  const spec::TrainingJob job_two = Job(two), job_one = Job(one);
  Servers servers_two(job_two), servers_one(job_one);
  TrainAll(job_two, servers_two, log, nullptr);
  TrainAll(job_one, servers_one, log, nullptr);
  // The same sums of the same gradients, added in another order.
  const std::vector<float> a = servers_two.Table("dense", DenseRows(job_two));
  const std::vector<float> b = servers_one.Table("dense", DenseRows(job_one));
  ASSERT_EQ(a.size(), b.size());
  float largest = 0, difference = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    largest = std::max(largest, std::fabs(b[i]));
    difference = std::max(difference, std::fabs(a[i] - b[i]));
  }
  EXPECT_LT(difference, 1e-4f * largest) << "largest parameter " << largest;
  EXPECT_GT(largest, 0.0f);
}

TEST(PsJobTest, AsyncAndGeoWithFourWorkersAndTwoServersReachTheSyncModesAuc) {
  const ClickLog log = Log(60000);
  ClickLog train = log, test;
  const int64_t cut = 50000;
  train.samples = cut;
  train.ids.resize(static_cast<size_t>(cut * log.fields));
  train.labels.resize(static_cast<size_t>(cut));
  test.samples = log.samples - cut;
  test.fields = log.fields;
  test.ids.assign(log.ids.begin() + cut * log.fields, log.ids.end());
  test.labels.assign(log.labels.begin() + cut, log.labels.end());
  double auc[3] = {0, 0, 0};
  const char* modes[3] = {"sync", "async", "geo"};
  for (int m = 0; m < 3; ++m) {
    JobOptions options;
    options.workers = 4;
    options.servers = 2;
    options.mode = modes[m];
    // Synchronous steps train 4 batches at once: the linear scaling rule's 4x rate matches their
    // progress to the asynchronous workers' 4 updates.
    if (m == 0) options.learning_rate *= 4;
    const spec::TrainingJob job = Job(options);
    Servers servers(job);
    auc[m] = TrainAll(job, servers, train, &test).test_auc;
  }
  std::printf("test AUC: sync %.4f, async %.4f, geo %.4f\n", auc[0], auc[1], auc[2]);
  EXPECT_GT(auc[0], 0.72);  // the ceiling of this log is about 0.77
  EXPECT_GT(auc[1], auc[0] - 0.01);
  EXPECT_GT(auc[2], auc[0] - 0.015);
}

TEST(PsJobTest, StalenessBoundsHowFarAWorkerRunsAheadOfTheSlowest) {
  const ClickLog log = Log(2000);
  for (const auto& [extra, mode, reached] :
       {std::tuple<std::string, std::string, int64_t>{", staleness: 2", "async", 3},
        {", staleness: 0", "async", 1},
        {"", "sync", 1}}) {
    JobOptions options;
    options.workers = 2;
    options.mode = mode;
    options.extra = extra;
    options.steps = 20;
    const spec::TrainingJob job = Job(options);
    Servers servers(job);
    // Worker 1 never starts: worker 0 trains until the bound stops it.
    std::unique_ptr<PsClient> client = servers.Client();
    PsTrainingOptions training;
    training.job = job;
    training.worker = 0;
    training.wait_timeout_ms = 1000;
    StatusOr<PsTrainingResult> result = TrainThroughServers(training, log, nullptr, *client);
    ASSERT_FALSE(result.ok()) << mode << extra;
    EXPECT_EQ(result.status().code(), StatusCode::kDeadlineExceeded) << result.status();
    EXPECT_NE(result.status().message().find("worker 1 is at 0"), std::string::npos)
        << result.status();
    ClockOptions ask;
    ask.workers = 2;
    StatusOr<PsClock> clock = client->Clock(ask);
    ASSERT_TRUE(clock.ok());
    EXPECT_EQ(clock->clock, reached) << mode << extra;
  }
}

TEST(PsJobTest, AWorkerThatStartsAgainGoesOnFromItsClockAndEndsWhereAnUnbrokenRunEnds) {
  JobOptions options;
  options.mode = "async";
  options.steps = 40;
  const spec::TrainingJob job = Job(options);
  const ClickLog log = Log(1600);
  Servers broken(job), whole(job);
  std::atomic<bool> stop{false};
  PsTrainingOptions training;
  training.job = job;
  training.stop = &stop;
  std::unique_ptr<PsClient> first = broken.Client();
  StatusOr<PsTrainingResult> stopped =
      TrainThroughServers(training, log, nullptr, *first, [&](const PsProgress& progress) {
        if (progress.step == 15) stop = true;
      });
  ASSERT_EQ(stopped.status().code(), StatusCode::kCancelled) << stopped.status();
  stop = false;
  std::unique_ptr<PsClient> second = broken.Client();
  StatusOr<PsTrainingResult> resumed = TrainThroughServers(training, log, nullptr, *second);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->resumed_from_step, 15);
  EXPECT_EQ(resumed->steps, 40);
  TrainAll(job, whole, log, nullptr);
  EXPECT_EQ(broken.Table("dense", DenseRows(job)), whole.Table("dense", DenseRows(job)));
}

}  // namespace
}  // namespace lockstep::ps
