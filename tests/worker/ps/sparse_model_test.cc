// The sparse click model (worker/ps/sparse_model.h): trained through parameter servers over real
// gRPC it ends where plain SGD on a table held here ends, and it learns the click log toward the
// log's known ceiling.
#include "worker/ps/sparse_model.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
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

std::vector<float> WholeTable(EmbeddingStore& store, int64_t rows) {
  std::vector<uint64_t> all(static_cast<size_t>(rows));
  for (size_t r = 0; r < all.size(); ++r) all[r] = r;
  std::vector<float> values(all.size() * static_cast<size_t>(store.dim()));
  EXPECT_TRUE(store.Pull(all, values.data()).ok());
  return values;
}

class SyncThroughServersTest : public ::testing::TestWithParam<int> {};

TEST_P(SyncThroughServersTest, OneWorkerEndsWithThePlainSgdParametersBitForBit) {
  const SparseModelSpec spec = SmallModel();
  const ClickLog log = Log(3200, spec.fields, 3000);

  auto here = SparseModel::Create(spec);
  ASSERT_TRUE(here.ok()) << here.status();
  auto table = LocalEmbeddings::Create(EmbeddingTable(spec));
  ASSERT_TRUE(table.ok()) << table.status();

  const int servers = GetParam();
  std::vector<std::unique_ptr<ShardServer>> shards;
  PsClientOptions client_options;
  client_options.job = "default/ctr";
  client_options.token = "token";
  for (int shard = 0; shard < servers; ++shard) {
    ShardServerOptions options;
    options.job = client_options.job;
    options.token = client_options.token;
    options.shard = shard;
    options.shards = servers;
    options.tables = {EmbeddingTable(spec)};
    auto server = ShardServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    client_options.servers.push_back("127.0.0.1:" + std::to_string((*server)->port()));
    shards.push_back(std::move(server).value());
  }
  auto client = PsClient::Connect(client_options);
  ASSERT_TRUE(client.ok()) << client.status();
  ServerEmbeddings remote(**client, EmbeddingTable(spec));
  auto there = SparseModel::Create(spec);
  ASSERT_TRUE(there.ok());

  for (int64_t first = 0; first < log.samples; first += spec.max_batch) {
    auto loss_here = (*here)->Step(log, first, spec.max_batch, **table);
    auto loss_there = (*there)->Step(log, first, spec.max_batch, remote);
    ASSERT_TRUE(loss_here.ok()) << loss_here.status();
    ASSERT_TRUE(loss_there.ok()) << loss_there.status();
    ASSERT_EQ(*loss_here, *loss_there) << "step at sample " << first;
  }
  EXPECT_EQ((*here)->mlp_params(), (*there)->mlp_params());
  EXPECT_EQ(WholeTable(**table, spec.table_rows), WholeTable(remote, spec.table_rows));
  // It trained: the table moved from where it started.
  auto fresh = LocalEmbeddings::Create(EmbeddingTable(spec));
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE(WholeTable(**fresh, spec.table_rows), WholeTable(**table, spec.table_rows));
}

INSTANTIATE_TEST_SUITE_P(Servers, SyncThroughServersTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "Servers";
                         });

TEST(SparseModelTest, LearnsTheClickLogToNearItsCeiling) {
  SparseModelSpec spec;
  spec.fields = 8;
  spec.dim = 8;
  spec.table_rows = 1 << 16;
  spec.hidden = {32};
  spec.learning_rate = 0.5f;
  spec.max_batch = 64;
  // 200 ids per field: with 50,000 training samples even the rarest id is seen tens of times,
  // so the true model's weights are learnable and its AUC is a ceiling a model can approach.
  const ClickLog log = Log(60000, spec.fields, 200);
  const int64_t train = 50000, test = log.samples - train;
  auto model = SparseModel::Create(spec);
  ASSERT_TRUE(model.ok());
  auto table = LocalEmbeddings::Create(EmbeddingTable(spec));
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

TEST(SparseModelTest, ABatchOutsideTheLogOrLargerThanTheModelTakesIsRefused) {
  const SparseModelSpec spec = SmallModel();
  auto model = SparseModel::Create(spec);
  ASSERT_TRUE(model.ok());
  auto table = LocalEmbeddings::Create(EmbeddingTable(spec));
  ASSERT_TRUE(table.ok());
  const ClickLog log = Log(100, spec.fields, 100);
  EXPECT_EQ((*model)->Step(log, 90, 20, **table).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ((*model)->Step(log, 0, 65, **table).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*model)->Step(Log(100, 3, 100), 0, 10, **table).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lockstep::ps
