// The sparse click model (worker/ps/sparse_model.h): trained through parameter servers over real
// gRPC it ends where plain SGD on a table held here ends, and it learns the click log toward the
// log's known ceiling.
#include "worker/ps/sparse_model.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "worker/ps/ps_server.h"

namespace lockstep::ps {
namespace {

SparseModelSpec SmallModel() {
  SparseModelSpec spec;
  spec.fields = 4;
  spec.dim = 4;
  spec.table_rows = 5000;
  spec.hidden = {16};
  spec.learning_rate = 0.1f;
  spec.seed = 5;
  spec.max_batch = 64;
  return spec;
}

ClickLog Log(int64_t samples, int32_t fields, int64_t vocabulary) {
  ClickLogSpec spec;
  spec.samples = samples;
  spec.fields = fields;
  spec.vocabulary = vocabulary;
  spec.seed = 21;
  return GenerateClickLog(spec);
}

std::vector<float> WholeTable(TableRows& store, int64_t rows) {
  std::vector<uint64_t> all(static_cast<size_t>(rows));
  for (size_t r = 0; r < all.size(); ++r) all[r] = r;
  std::vector<float> values(all.size() * static_cast<size_t>(store.dim()));
  EXPECT_TRUE(store.Pull(all, values.data()).ok());
  return values;
}

// `count` parameter servers of job default/ctr holding `tables`, and the options a client of
// them needs.
struct Servers {
  std::vector<std::unique_ptr<ShardServer>> shards;
  PsClientOptions client;
};

Servers StartServers(const std::vector<TableSpec>& tables, int count) {
  Servers servers;
  servers.client.job = "default/ctr";
  servers.client.token = "token";
  for (int shard = 0; shard < count; ++shard) {
    ShardServerOptions options;
    options.job = servers.client.job;
    options.token = servers.client.token;
    options.shard = shard;
    options.shards = count;
    options.tables = tables;
    auto server = ShardServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) break;
    servers.client.servers.push_back("127.0.0.1:" + std::to_string((*server)->port()));
    servers.shards.push_back(std::move(server).value());
  }
  return servers;
}

// (servers, whether the MLP is a dense table on them as asynchronous training keeps it)
class SyncThroughServersTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(SyncThroughServersTest, OneWorkerEndsWithThePlainSgdParametersBitForBit) {
  const auto [server_count, dense_on_servers] = GetParam();
  const SparseModelSpec spec = SmallModel();
  const ClickLog log = Log(3200, spec.fields, 3000);

  auto here = SparseModel::Create(spec);
  ASSERT_TRUE(here.ok()) << here.status();
  auto table = LocalTable::Create(EmbeddingTable(spec));
  ASSERT_TRUE(table.ok()) << table.status();
  const std::vector<float> initial_mlp = (*here)->mlp_params();

  const TableSpec dense_spec = DenseTable(spec, static_cast<int64_t>(initial_mlp.size()));
  Servers servers = StartServers({EmbeddingTable(spec), dense_spec}, server_count);
  ASSERT_EQ(servers.shards.size(), static_cast<size_t>(server_count));
  auto client = PsClient::Connect(servers.client);
  ASSERT_TRUE(client.ok()) << client.status();
  ServerTable remote(**client, EmbeddingTable(spec));
  ServerTable remote_dense(**client, dense_spec);
  auto there = SparseModel::Create(spec);
  ASSERT_TRUE(there.ok());
  TableRows* dense = nullptr;
  if (dense_on_servers) {
    ASSERT_TRUE((*there)->InitializeDense(remote_dense).ok());
    dense = &remote_dense;
  }

  for (int64_t first = 0; first < log.samples; first += spec.max_batch) {
    auto loss_here = (*here)->Step(log, first, spec.max_batch, **table);
    auto loss_there = (*there)->Step(log, first, spec.max_batch, remote, dense);
    ASSERT_TRUE(loss_here.ok()) << loss_here.status();
    ASSERT_TRUE(loss_there.ok()) << loss_there.status();
    ASSERT_EQ(*loss_here, *loss_there) << "step at sample " << first;
  }
  std::vector<float> mlp_there = (*there)->mlp_params();
  if (dense_on_servers) {  // the last step's update is on the servers
    mlp_there = WholeTable(remote_dense, dense_spec.rows);
    mlp_there.resize(initial_mlp.size());
  }
  EXPECT_EQ((*here)->mlp_params(), mlp_there);
  EXPECT_NE((*here)->mlp_params(), initial_mlp);  // it trained
  EXPECT_EQ(WholeTable(**table, spec.table_rows), WholeTable(remote, spec.table_rows));
  auto fresh = LocalTable::Create(EmbeddingTable(spec));
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(WholeTable(**fresh, spec.table_rows), WholeTable(**table, spec.table_rows));
}

INSTANTIATE_TEST_SUITE_P(Servers, SyncThroughServersTest,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool>>& info) {
                           return std::to_string(std::get<0>(info.param)) + "Servers" +
                                  (std::get<1>(info.param) ? "MlpOnServers" : "MlpHere");
                         });

// The model the click log is learned with.
SparseModelSpec ClickModel() {
  SparseModelSpec spec;
  spec.fields = 8;
  spec.dim = 8;
  spec.table_rows = 1 << 16;
  spec.hidden = {32};
  spec.learning_rate = 0.5f;
  spec.max_batch = 64;
  return spec;
}

TEST(SparseModelTest, LearnsTheClickLogToNearItsCeiling) {
  const SparseModelSpec spec = ClickModel();
  // 200 ids per field: with 50,000 training samples even the rarest id is seen tens of times,
  // so the true model's weights are learnable and its AUC is a ceiling a model can approach.
  const ClickLog log = Log(60000, spec.fields, 200);
  const int64_t train = 50000, test = log.samples - train;
  auto model = SparseModel::Create(spec);
  ASSERT_TRUE(model.ok());
  auto table = LocalTable::Create(EmbeddingTable(spec));
  ASSERT_TRUE(table.ok());
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int64_t first = 0; first + spec.max_batch <= train; first += spec.max_batch) {
      ASSERT_TRUE((*model)->Step(log, first, spec.max_batch, **table).ok());
    }
  }
  auto predicted = (*model)->Predict(log, train, test, **table);
  ASSERT_TRUE(predicted.ok()) << predicted.status();
  const std::vector<int32_t> labels(log.labels.begin() + train, log.labels.end());
  const std::vector<double> truth(log.probabilities.begin() + train, log.probabilities.end());
  const double ceiling = Auc(truth, labels);
  const double learned = Auc(*predicted, labels);
  std::printf("held-out AUC %.4f against the ceiling %.4f\n", learned, ceiling);
  // Measured here: 0.745 against 0.769. A model whose embeddings never learned stays near 0.6.
  EXPECT_GT(learned, ceiling - 0.04);
  EXPECT_LE(learned, ceiling + 0.01);
}

// The held-out AUC of `model` on samples [train, end) of `log`.
double HeldOutAuc(SparseModel& model, const ClickLog& log, int64_t train, TableRows& embeddings,
                  TableRows* dense) {
  auto predicted = model.Predict(log, train, log.samples - train, embeddings, dense);
  EXPECT_TRUE(predicted.ok()) << predicted.status();
  const std::vector<int32_t> labels(log.labels.begin() + train, log.labels.end());
  return predicted.ok() ? Auc(*predicted, labels) : 0.0;
}

// One worker, plain SGD here, 3 epochs of samples [0, train): the reference.
double OneWorkerAuc(const SparseModelSpec& spec, const ClickLog& log, int64_t train) {
  auto model = SparseModel::Create(spec);
  auto table = LocalTable::Create(EmbeddingTable(spec));
  EXPECT_TRUE(model.ok() && table.ok());
  if (!model.ok() || !table.ok()) return 0.0;
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int64_t first = 0; first + spec.max_batch <= train; first += spec.max_batch) {
      EXPECT_TRUE((*model)->Step(log, first, spec.max_batch, **table).ok());
    }
  }
  return HeldOutAuc(**model, log, train, **table, nullptr);
}

struct DistributedRun {
  double auc = 0;
  uint64_t pushes = 0;  // both servers'
  bool mlp_trained = false;  // the dense table moved from the chief's initial MLP
};

// Four workers (threads here) on two servers that hold both tables, each training 3 epochs of
// its quarter of samples [0, train) at its own pace: asynchronously (geo_interval 0: each step
// pulls what it uses and pushes its gradients), or with Geo-SGD (each trains copies of what it
// uses and sends their changes every geo_interval steps).
DistributedRun TrainFourWorkers(const SparseModelSpec& spec, const ClickLog& log, int64_t train,
                                int geo_interval) {
  auto sizing = SparseModel::Create(spec);
  EXPECT_TRUE(sizing.ok());
  if (!sizing.ok()) return {};
  const std::vector<float> initial_mlp = (*sizing)->mlp_params();
  const TableSpec dense_spec =
      DenseTable(spec, static_cast<int64_t>((*sizing)->mlp_params().size()));
  Servers servers = StartServers({EmbeddingTable(spec), dense_spec}, 2);
  EXPECT_EQ(servers.shards.size(), 2u);
  auto chief_client = PsClient::Connect(servers.client);
  EXPECT_TRUE(chief_client.ok());
  if (servers.shards.size() != 2 || !chief_client.ok()) return {};
  ServerTable chief_embeddings(**chief_client, EmbeddingTable(spec));
  ServerTable chief_dense(**chief_client, dense_spec);
  EXPECT_TRUE((*sizing)->InitializeDense(chief_dense).ok());

  constexpr int kWorkers = 4;
  std::vector<std::thread> workers;
  std::vector<Status> outcomes(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      auto client = PsClient::Connect(servers.client);
      auto model = SparseModel::Create(spec);
      if (!client.ok() || !model.ok()) {
        outcomes[w] = InternalError("worker could not start");
        return;
      }
      ServerTable remote_embeddings(**client, EmbeddingTable(spec));
      ServerTable remote_dense(**client, dense_spec);
      GeoTable geo_embeddings(remote_embeddings, spec.learning_rate, /*share=*/1.0f);
      GeoTable geo_dense(remote_dense, spec.learning_rate, /*share=*/1.0f / kWorkers);
      const bool geo = geo_interval > 0;
      TableRows& embeddings = geo ? static_cast<TableRows&>(geo_embeddings) : remote_embeddings;
      TableRows& dense = geo ? static_cast<TableRows&>(geo_dense) : remote_dense;
      const int64_t begin = w * train / kWorkers, end = (w + 1) * train / kWorkers;
      int64_t steps = 0;
      Status status;
      for (int epoch = 0; epoch < 3 && status.ok(); ++epoch) {
        for (int64_t first = begin; first + spec.max_batch <= end && status.ok();
             first += spec.max_batch) {
          status = (*model)->Step(log, first, spec.max_batch, embeddings, &dense).status();
          if (status.ok() && geo && ++steps % geo_interval == 0) {
            status = geo_embeddings.Sync();
            if (status.ok()) status = geo_dense.Sync();
          }
        }
      }
      if (status.ok() && geo) status = geo_embeddings.Sync();
      if (status.ok() && geo) status = geo_dense.Sync();
      outcomes[w] = status;
    });
  }
  for (std::thread& worker : workers) worker.join();
  for (const Status& outcome : outcomes) EXPECT_TRUE(outcome.ok()) << outcome;
  DistributedRun run;
  std::vector<float> trained = WholeTable(chief_dense, dense_spec.rows);
  trained.resize(initial_mlp.size());
  run.mlp_trained = trained != initial_mlp;
  run.auc = HeldOutAuc(**sizing, log, train, chief_embeddings, &chief_dense);
  run.pushes = servers.shards[0]->stats().pushes + servers.shards[1]->stats().pushes;
  return run;
}

TEST(SparseModelTest, FourAsynchronousWorkersOnTwoServersLearnAsWellAsOneWorker) {
  const SparseModelSpec spec = ClickModel();
  const ClickLog log = Log(60000, spec.fields, 200);
  const double reference = OneWorkerAuc(spec, log, 50000);
  const DistributedRun run = TrainFourWorkers(spec, log, 50000, /*geo_interval=*/0);
  std::printf("held-out AUC: one worker %.4f, four asynchronous workers on two servers %.4f\n",
              reference, run.auc);
  EXPECT_GT(run.auc, reference - 0.02);
  EXPECT_TRUE(run.mlp_trained);
}

TEST(SparseModelTest, FourGeoSgdWorkersLearnAsWellAsOneWorkerWithAnEighthOfThePushes) {
  const SparseModelSpec spec = ClickModel();
  const ClickLog log = Log(60000, spec.fields, 200);
  const double reference = OneWorkerAuc(spec, log, 50000);
  const DistributedRun geo = TrainFourWorkers(spec, log, 50000, /*geo_interval=*/8);
  const DistributedRun asynchronous = TrainFourWorkers(spec, log, 50000, /*geo_interval=*/0);
  std::printf(
      "held-out AUC: one worker %.4f, four Geo-SGD workers (every 8 steps) %.4f; pushes "
      "%llu against asynchronous training's %llu\n",
      reference, geo.auc, static_cast<unsigned long long>(geo.pushes),
      static_cast<unsigned long long>(asynchronous.pushes));
  EXPECT_GT(geo.auc, reference - 0.02);
  EXPECT_TRUE(geo.mlp_trained);
  // A push per table per 8 steps instead of per step (and the last one of each worker).
  EXPECT_LT(geo.pushes * 7, asynchronous.pushes);
}

TEST(SparseModelTest, ABatchOutsideTheLogOrLargerThanTheModelTakesIsRefused) {
  const SparseModelSpec spec = SmallModel();
  auto model = SparseModel::Create(spec);
  ASSERT_TRUE(model.ok());
  auto table = LocalTable::Create(EmbeddingTable(spec));
  ASSERT_TRUE(table.ok());
  const ClickLog log = Log(100, spec.fields, 100);
  EXPECT_EQ((*model)->Step(log, 90, 20, **table).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ((*model)->Step(log, 0, 65, **table).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*model)->Step(Log(100, 3, 100), 0, 10, **table).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lockstep::ps
