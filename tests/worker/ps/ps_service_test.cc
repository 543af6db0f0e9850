// Parameter servers and their client over real gRPC on loopback (worker/ps/ps_server.h,
// worker/ps/ps_client.h): two shards of a job's tables, as a job with two parameter servers has.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "proto/parameter_server.grpc.pb.h"
#include "worker/ps/ps_client.h"
#include "worker/ps/ps_server.h"

namespace lockstep::ps {
namespace {

namespace v1 = ::lockstep::ps::v1;

constexpr char kJob[] = "default/ctr";
constexpr char kToken[] = "secret-token";

TableSpec Table(const std::string& name, int64_t rows, int32_t dim) {
  TableSpec spec;
  spec.name = name;
  spec.rows = rows;
  spec.dim = dim;
  spec.learning_rate = 0.5f;
  spec.seed = 11;
  spec.init_scale = 0.1f;
  return spec;
}

class PsServiceTest : public ::testing::Test {
 protected:
  void StartServers(std::vector<TableSpec> tables, int64_t max_rows = int64_t{1} << 16,
                    int64_t max_message_bytes = int64_t{64} << 20) {
    for (int shard = 0; shard < 2; ++shard) {
      ShardServerOptions options;
      options.job = kJob;
      options.token = kToken;
      options.shard = shard;
      options.shards = 2;
      options.tables = tables;
      options.max_rows_per_request = max_rows;
      options.max_message_bytes = max_message_bytes;
      options.workers = workers_;
      auto server = ShardServer::Start(options);
      ASSERT_TRUE(server.ok()) << server.status();
      addresses_.push_back("127.0.0.1:" + std::to_string((*server)->port()));
      servers_.push_back(std::move(server).value());
    }
  }

  std::unique_ptr<PsClient> Client(const std::string& token = kToken,
                                   int64_t max_rows = int64_t{1} << 16) {
    PsClientOptions options;
    options.servers = addresses_;
    options.job = kJob;
    options.token = token;
    options.timeout_ms = 10000;
    options.max_rows_per_request = max_rows;
    auto client = PsClient::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(client).value() : nullptr;
  }

  // What the servers hold of `rows`, read from their tables directly.
  std::vector<float> Held(const std::string& table, const std::vector<uint64_t>& rows) {
    const int32_t dim = servers_[0]->table(table)->spec().dim;
    std::vector<float> out(rows.size() * static_cast<size_t>(dim));
    for (size_t i = 0; i < rows.size(); ++i) {
      const ShardTable* shard = servers_[static_cast<size_t>(ShardOfRow(rows[i], 2))]->table(table);
      EXPECT_TRUE(shard->Pull(&rows[i], 1, out.data() + i * static_cast<size_t>(dim)).ok());
    }
    return out;
  }

  // Clock `clock` of `worker` (of workers_), waiting for wait_for within timeout_ms.
  StatusOr<PsClock> Clock(PsClient& client, int worker, int64_t clock, int64_t wait_for,
                          bool initialized = false, int64_t timeout_ms = 10000) {
    ClockOptions options;
    options.worker = worker;
    options.workers = workers_;
    options.clock = clock;
    options.wait_for = wait_for;
    options.initialized = initialized;
    options.timeout_ms = timeout_ms;
    return client.Clock(options);
  }

  int workers_ = 1;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<ShardServer>> servers_;
};

TEST_F(PsServiceTest, APullReturnsEachRowInTheCallersOrderFromTheServerThatHoldsIt) {
  StartServers({Table("emb", 1000, 8)});
  auto client = Client();
  const std::vector<uint64_t> rows = {5, 998, 5, 0, 13};
  std::vector<float> out(rows.size() * 8);
  ASSERT_TRUE(client->Pull("emb", 8, rows, out.data()).ok());
  const TableSpec spec = Table("emb", 1000, 8);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int32_t j = 0; j < 8; ++j) {
      EXPECT_EQ(out[i * 8 + static_cast<size_t>(j)], InitialValue(spec, rows[i], j))
          << "row " << rows[i] << " element " << j;
    }
  }
  // Row 5 once: 4 distinct rows travelled, two per server (5 and 13 odd, 998 and 0 even).
  EXPECT_EQ(client->traffic().rows, 4u);
  EXPECT_EQ(servers_[0]->stats().rows_pulled, 2u);
  EXPECT_EQ(servers_[1]->stats().rows_pulled, 2u);
}

TEST_F(PsServiceTest, APushChangesTheRowsOnTheirServersWithRepeatedRowsSummed) {
  StartServers({Table("emb", 1000, 2)});
  auto client = Client();
  const std::vector<uint64_t> rows = {1, 2, 2, 3};
  const std::vector<uint64_t> distinct = {1, 2, 3};
  const std::vector<float> before = Held("emb", distinct);
  const std::vector<float> gradient = {1, 2, 0.5f, 0.5f, 0.25f, 0.25f, -4, 8};
  ASSERT_TRUE(client->Push("emb", 2, rows, gradient.data(), PushKind::kGradient).ok());
  const std::vector<float> after = Held("emb", distinct);
  const std::vector<float> summed = {1, 2, 0.75f, 0.75f, -4, 8};
  for (size_t i = 0; i < summed.size(); ++i) {
    EXPECT_EQ(after[i], before[i] - 0.5f * summed[i]) << i;
  }
  EXPECT_EQ(servers_[0]->stats().rows_pushed + servers_[1]->stats().rows_pushed, 3u);

  const std::vector<float> delta = {1, 1, 1, 1, 1, 1, 1, 1};
  ASSERT_TRUE(client->Push("emb", 2, rows, delta.data(), PushKind::kDelta).ok());
  const std::vector<float> last = Held("emb", distinct);
  EXPECT_EQ(last[2], after[2] + 2.0f);  // row 2, named twice
  EXPECT_EQ(last[0], after[0] + 1.0f);
}

TEST_F(PsServiceTest, AWrongTokenOrJobIsNotFoundAndChangesNothing) {
  StartServers({Table("emb", 100, 2)});
  const std::vector<uint64_t> rows = {0, 1, 2, 3};
  const std::vector<float> before = Held("emb", rows);
  const std::vector<float> values(8, 1.0f);
  std::vector<float> out(8);

  auto intruder = Client("not-the-token");
  Status pulled = intruder->Pull("emb", 2, rows, out.data());
  EXPECT_EQ(pulled.code(), StatusCode::kNotFound) << pulled;
  EXPECT_NE(pulled.message().find("no job default/ctr on this parameter server"), std::string::npos)
      << pulled;
  EXPECT_EQ(intruder->Push("emb", 2, rows, values.data(), PushKind::kDelta).code(),
            StatusCode::kNotFound);

  PsClientOptions other_job;
  other_job.servers = addresses_;
  other_job.job = "default/other";
  other_job.token = kToken;
  auto stranger = PsClient::Connect(other_job);
  ASSERT_TRUE(stranger.ok());
  EXPECT_EQ((*stranger)->Push("emb", 2, rows, values.data(), PushKind::kDelta).code(),
            StatusCode::kNotFound);

  EXPECT_EQ(Held("emb", rows), before);
  EXPECT_EQ(servers_[0]->table("emb")->version() + servers_[1]->table("emb")->version(), 0u);
  EXPECT_GE(servers_[0]->stats().refused, 3u);
}

TEST_F(PsServiceTest, AnUnknownTableIsNotFoundNamingIt) {
  StartServers({Table("emb", 100, 2)});
  std::vector<float> out(2);
  Status pulled = Client()->Pull("missing", 2, {4}, out.data());
  EXPECT_EQ(pulled.code(), StatusCode::kNotFound);
  EXPECT_NE(pulled.message().find("has no table missing"), std::string::npos) << pulled;
}

TEST_F(PsServiceTest, ARequestOfMoreRowsThanTheServerTakesIsRefusedAndSmallerPiecesPass) {
  StartServers({Table("emb", 1000, 2)}, /*max_rows=*/4);
  std::vector<uint64_t> rows;
  for (uint64_t r = 0; r < 20; r += 2) rows.push_back(r);  // 10 rows, all on server 0
  const std::vector<float> before = Held("emb", rows);
  const std::vector<float> values(rows.size() * 2, 1.0f);
  Status pushed =
      Client(kToken, /*max_rows=*/100)->Push("emb", 2, rows, values.data(), PushKind::kDelta);
  EXPECT_EQ(pushed.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pushed.message().find("rows: 10 in one request, more than this server's 4"),
            std::string::npos)
      << pushed;
  EXPECT_EQ(Held("emb", rows), before);

  // A client that cuts its requests to the servers' bound gets through in three pieces.
  auto client = Client(kToken, /*max_rows=*/4);
  ASSERT_TRUE(client->Push("emb", 2, rows, values.data(), PushKind::kDelta).ok());
  EXPECT_EQ(client->traffic().requests, 3u);
  const std::vector<float> after = Held("emb", rows);
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i], before[i] + 1.0f);
}

// What the client never sends, sent by hand: rows of the other shard or beyond the table, and
// values of the wrong size.
TEST_F(PsServiceTest, MalformedRequestsAreRefusedNamingWhatIsWrongAndChangeNothing) {
  StartServers({Table("emb", 100, 2)});
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(addresses_[0], grpc::InsecureChannelCredentials()));
  const std::vector<uint64_t> all = {0, 2, 4, 6};
  const std::vector<float> before = Held("emb", all);
  auto push = [&](std::vector<uint64_t> rows, size_t value_bytes) {
    grpc::ClientContext context;
    context.AddMetadata("x-lockstep-token", kToken);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::PushRequest request;
    request.set_job(kJob);
    request.set_table("emb");
    for (uint64_t row : rows) request.add_rows(row);
    request.set_kind(v1::PushRequest::DELTA);
    // Ones, not zeros: a push applied by mistake must show.
    std::vector<float> ones(value_bytes / sizeof(float) + 1, 1.0f);
    request.set_values(std::string(reinterpret_cast<const char*>(ones.data()), value_bytes));
    v1::PushResponse response;
    return stub->Push(&context, request, &response);
  };
  grpc::Status status = push({0, 3}, 16);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("rows[1] = 3 of table emb is held by server 1"),
            std::string::npos)
      << status.error_message();
  status = push({0, 100}, 16);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("rows[1] = 100 is beyond table emb's 100 rows"),
            std::string::npos)
      << status.error_message();
  status = push({0, 2}, 12);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("values: 12 bytes for 2 rows of table emb, which need 16"),
            std::string::npos)
      << status.error_message();
  EXPECT_EQ(Held("emb", all), before);
  EXPECT_EQ(servers_[0]->table("emb")->version(), 0u);
}

// The rows of a batch drawn from `distinct` different rows of a `rows`-row table, each repeated.
std::vector<uint64_t> Batch(size_t size, size_t distinct, int64_t rows) {
  std::vector<uint64_t> batch;
  for (size_t i = 0; i < size; ++i) batch.push_back(RowOfId(i % distinct, rows));
  return batch;
}

TEST_F(PsServiceTest, APullsBytesGrowWithTheBatchsDistinctRowsNotWithTheTable) {
  StartServers({Table("big", 1'000'000, 16), Table("small", 5000, 16)});
  auto measure = [&](const std::string& table, int64_t rows, size_t distinct) {
    auto client = Client();
    const std::vector<uint64_t> batch = Batch(4096, distinct, rows);
    std::vector<float> out(batch.size() * 16);
    EXPECT_TRUE(client->Pull(table, 16, batch, out.data()).ok());
    const size_t unique = std::set<uint64_t>(batch.begin(), batch.end()).size();
    EXPECT_EQ(client->traffic().rows, unique);
    return client->traffic().response_bytes;
  };
  const uint64_t big_256 = measure("big", 1'000'000, 256);
  const uint64_t small_256 = measure("small", 5000, 256);
  const uint64_t big_2048 = measure("big", 1'000'000, 2048);
  // 256 distinct rows of 16 floats are 16 KiB of values whichever table they come from (the
  // small table's hash may fold a few ids together); the request's 4096 ids never travel.
  EXPECT_GE(big_256, 256u * 64u);
  EXPECT_LT(big_256, 256u * 64u + 64u);
  EXPECT_NEAR(static_cast<double>(small_256), static_cast<double>(big_256), 0.05 * big_256);
  // Eight times the distinct rows, eight times the bytes.
  EXPECT_NEAR(static_cast<double>(big_2048) / big_256, 8.0, 0.1);
}

TEST_F(PsServiceTest, APullWhoseAnswerWouldOutgrowTheMessageBoundIsRefusedAndSmallerPiecesPass) {
  // Servers that take messages of at most 1 KiB: 100 rows of 8 floats would answer 3,200 bytes.
  StartServers({Table("emb", 1000, 8)}, int64_t{1} << 16, /*max_message_bytes=*/1024);
  std::vector<uint64_t> rows;
  for (uint64_t r = 0; r < 200; r += 2) rows.push_back(r);  // 100 rows, all on server 0
  std::vector<float> out(rows.size() * 8);
  Status pulled = Client()->Pull("emb", 8, rows, out.data());
  EXPECT_EQ(pulled.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pulled.message().find("are 3200 bytes of values, more than this server's message "
                                  "bound of 1024"),
            std::string::npos)
      << pulled;

  PsClientOptions small;
  small.servers = addresses_;
  small.job = kJob;
  small.token = kToken;
  small.max_message_bytes = 512;  // 16 rows of 8 floats per request
  auto client = PsClient::Connect(small);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Pull("emb", 8, rows, out.data()).ok());
  EXPECT_EQ((*client)->traffic().requests, 7u);  // ceil(100 / 16)
  EXPECT_EQ(out[8 * 99], InitialValue(Table("emb", 1000, 8), 198, 0));
}

// A server that answers a pull with far more than was asked for (faulty, or not ours).
class OversizedPullServer final : public v1::ParameterServer::Service {
 public:
  explicit OversizedPullServer(size_t bytes) : bytes_(bytes) {}
  grpc::Status Pull(grpc::ServerContext*, const v1::PullRequest*,
                    v1::PullResponse* response) override {
    response->set_dim(4);
    response->set_values(std::string(bytes_, '\0'));
    return grpc::Status::OK;
  }

 private:
  size_t bytes_;
};

TEST(PsClientTest, AnAnswerLargerThanItsRequestCanHoldIsRefusedNamingTheServer) {
  OversizedPullServer service(size_t{32} << 20);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  PsClientOptions options;
  options.servers = {"127.0.0.1:" + std::to_string(port)};
  options.job = kJob;
  options.token = kToken;
  options.max_message_bytes = int64_t{1} << 20;  // a request's values: 1 MiB at most
  auto client = PsClient::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<float> out(4 * 2);
  const Status pulled = (*client)->Pull("ads", 4, {0, 1}, out.data());
  EXPECT_EQ(pulled.code(), StatusCode::kResourceExhausted) << pulled;
  EXPECT_NE(pulled.message().find("parameter server 0"), std::string::npos) << pulled;
  server->Shutdown();
}

TEST_F(PsServiceTest, APushWithValuesThatAreNotFiniteIsRefusedBeforeAnythingIsSent) {
  StartServers({Table("emb", 100, 2)});
  auto client = Client();
  const std::vector<uint64_t> rows = {0, 1};
  const std::vector<float> values = {1.0f, 1.0f, std::numeric_limits<float>::infinity(), 0.0f};
  Status pushed = client->Push("emb", 2, rows, values.data(), PushKind::kGradient);
  EXPECT_EQ(pushed.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pushed.message().find("rows[1] = 1 are not all finite"), std::string::npos) << pushed;
  EXPECT_EQ(client->traffic().requests, 0u);
  EXPECT_EQ(servers_[0]->table("emb")->version() + servers_[1]->table("emb")->version(), 0u);
}

TEST_F(PsServiceTest, AClockWaitEndsWhenTheSlowestWorkerArrivesAndTheChiefHasInitialized) {
  workers_ = 2;
  StartServers({Table("emb", 100, 2)});
  auto fast = Client(), slow = Client();
  // Nobody has initialized: a wait for step 0 runs out, naming why.
  StatusOr<PsClock> early = Clock(*fast, 0, 1, 0, false, /*timeout_ms=*/300);
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), StatusCode::kDeadlineExceeded);
  // The fast worker has finished step 1 and waits for the slow one's.
  StatusOr<PsClock> waited = InternalError("not answered");
  std::thread waiter([&] { waited = Clock(*fast, 0, 1, 1); });
  EXPECT_TRUE(Clock(*slow, 1, -1, -1, /*initialized=*/true).ok());
  StatusOr<PsClock> slow_now = Clock(*slow, 1, 1, -1);
  waiter.join();
  ASSERT_TRUE(slow_now.ok()) << slow_now.status();
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(waited->clock, 1);
  EXPECT_EQ(waited->min_clock, 1);
  EXPECT_TRUE(waited->initialized);
  // A clock below the one held changes nothing: a replacement asks with -1 and learns it.
  StatusOr<PsClock> asked = Clock(*Client(), 0, -1, -1);
  ASSERT_TRUE(asked.ok());
  EXPECT_EQ(asked->clock, 1);
}

TEST_F(PsServiceTest, DeferredGradientsApplyTogetherWhenTheSlowestWorkerFinishesTheStep) {
  workers_ = 2;
  StartServers({Table("emb", 100, 2)});
  auto client = Client();
  ASSERT_TRUE(Clock(*client, 0, -1, -1, /*initialized=*/true).ok());
  const std::vector<uint64_t> rows = {3, 4};
  const std::vector<float> before = Held("emb", rows);
  const std::vector<float> first = {1, 2, 3, 4}, second = {0.5f, 0.5f, -1, -1};
  ASSERT_TRUE(client->Push("emb", 2, rows, first.data(), PushKind::kDeferred).ok());
  ASSERT_TRUE(client->Push("emb", 2, rows, second.data(), PushKind::kDeferred).ok());
  EXPECT_EQ(Held("emb", rows), before);  // held, not applied
  ASSERT_TRUE(Clock(*client, 0, 1, -1).ok());
  EXPECT_EQ(Held("emb", rows), before);  // worker 1 has not finished step 1
  ASSERT_TRUE(Clock(*client, 1, 1, -1).ok());
  const std::vector<float> after = Held("emb", rows);
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_FLOAT_EQ(after[i], before[i] - 0.5f * (first[i] + second[i])) << "element " << i;
  }
}

TEST_F(PsServiceTest, APushSentAgainWithItsIdentityIsAppliedOnceAndARefusedOneMayBeSentAgain) {
  StartServers({Table("emb", 100, 2)});
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(addresses_[0], grpc::InsecureChannelCredentials()));
  const std::vector<float> before = Held("emb", {4});
  v1::PushRequest request;
  request.set_job(kJob);
  request.set_table("emb");
  request.add_rows(4);
  const float gradient[2] = {1, 2};
  request.set_values(reinterpret_cast<const char*>(gradient), sizeof(gradient));
  request.set_client("client-a");
  request.set_sequence(7);
  for (int attempt = 0; attempt < 3; ++attempt) {  // its answer lost twice: sent three times
    grpc::ClientContext context;
    context.AddMetadata("x-lockstep-token", kToken);
    v1::PushResponse response;
    ASSERT_TRUE(stub->Push(&context, request, &response).ok());
  }
  const std::vector<float> once = Held("emb", {4});
  EXPECT_FLOAT_EQ(once[0], before[0] - 0.5f * 1);
  EXPECT_FLOAT_EQ(once[1], before[1] - 0.5f * 2);
  // Another client's push of the same number is its own.
  request.set_client("client-b");
  {
    grpc::ClientContext context;
    context.AddMetadata("x-lockstep-token", kToken);
    v1::PushResponse response;
    ASSERT_TRUE(stub->Push(&context, request, &response).ok());
  }
  EXPECT_FLOAT_EQ(Held("emb", {4})[0], before[0] - 0.5f * 2);
  // A refused push (a value that is not finite) is not remembered: once fixed, it applies.
  const float bad[2] = {std::numeric_limits<float>::infinity(), 0};
  request.set_client("client-c");
  request.set_values(reinterpret_cast<const char*>(bad), sizeof(bad));
  {
    grpc::ClientContext context;
    context.AddMetadata("x-lockstep-token", kToken);
    v1::PushResponse response;
    EXPECT_EQ(stub->Push(&context, request, &response).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  request.set_values(reinterpret_cast<const char*>(gradient), sizeof(gradient));
  {
    grpc::ClientContext context;
    context.AddMetadata("x-lockstep-token", kToken);
    v1::PushResponse response;
    ASSERT_TRUE(stub->Push(&context, request, &response).ok());
  }
  EXPECT_FLOAT_EQ(Held("emb", {4})[0], before[0] - 0.5f * 3);
}

TEST_F(PsServiceTest, AnAssignmentSetsRowsAndNamingARowTwiceIsRefused) {
  StartServers({Table("dense", 10, 2)});
  auto client = Client();
  const std::vector<float> values = {1, 2, 3, 4};
  ASSERT_TRUE(client->Push("dense", 2, {0, 7}, values.data(), PushKind::kAssign).ok());
  ASSERT_TRUE(client->Push("dense", 2, {0, 7}, values.data(), PushKind::kAssign).ok());
  EXPECT_EQ(Held("dense", {0, 7}), values);  // twice is once
  // Once the job is initialized, initial values are never written again.
  ClockOptions initialized;
  initialized.initialized = true;
  ASSERT_TRUE(client->Clock(initialized).ok());
  const std::vector<float> other = {9, 9, 9, 9};
  ASSERT_TRUE(client->Push("dense", 2, {0, 7}, other.data(), PushKind::kAssign).ok());
  EXPECT_EQ(Held("dense", {0, 7}), values);
  const Status twice = client->Push("dense", 2, {1, 1}, values.data(), PushKind::kAssign);
  EXPECT_EQ(twice.code(), StatusCode::kInvalidArgument) << twice;
}

TEST_F(PsServiceTest, AClockOfAnotherJobsWorkersIsRefusedNamingTheCount) {
  workers_ = 2;
  StartServers({Table("emb", 10, 2)});
  auto client = Client();
  ClockOptions options;
  options.worker = 0;
  options.workers = 3;
  StatusOr<PsClock> wrong = client->Clock(options);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("keeps the clocks of 2 workers"), std::string::npos)
      << wrong.status();
  options.workers = 2;
  auto stranger = Client("wrong-token");
  StatusOr<PsClock> refused = stranger->Clock(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kNotFound);
}

TEST(PsCheckpointTest, AServerStartedAgainRestoresItsShardAndClocksFromItsNewestCheckpoint) {
  const std::string dir = ::testing::TempDir() + "ps-ckpt-" + std::to_string(getpid());
  ShardServerOptions options;
  options.job = kJob;
  options.token = kToken;
  options.shard = 1;
  options.shards = 2;
  options.workers = 2;
  options.tables = {Table("emb", 100, 2)};
  options.checkpoint_uri = "file://" + dir;
  options.checkpoint_interval_steps = 2;
  std::vector<float> held;
  {
    auto server = ShardServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_EQ((*server)->stats().restored_step, -1);
    PsClientOptions client_options;
    client_options.servers = {"127.0.0.1:1", "127.0.0.1:" + std::to_string((*server)->port())};
    client_options.job = kJob;
    client_options.token = kToken;
    auto client = PsClient::Connect(client_options);
    ASSERT_TRUE(client.ok());
    const std::vector<float> gradient = {1, 2, 3, 4};
    ClockOptions clock;
    clock.workers = 2;
    // Only server 1's rows (odd), and each clock call to it alone: server 0 does not exist.
    ASSERT_TRUE((*client)->Push("emb", 2, {1, 3}, gradient.data(), PushKind::kGradient).ok());
    held = (*server)->table("emb")->Values();
    // The checkpoint is written when the slowest worker reaches step 2 (2 steps since the last).
    v1::ClockRequest request;
    request.set_job(kJob);
    request.set_workers(2);
    request.set_initialized(true);
    auto stub = v1::ParameterServer::NewStub(
        grpc::CreateChannel(client_options.servers[1], grpc::InsecureChannelCredentials()));
    // Written in the background: one at a time, so the test waits for each (bounded).
    auto written = [&](int64_t count) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while ((*server)->stats().checkpoints < count && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      return (*server)->stats().checkpoints >= count;
    };
    // The chief's initialization is checkpointed at once, then every 2 steps of the slowest.
    for (const auto& [worker, step, checkpoints] :
         {std::tuple<int, int, int64_t>{0, 0, 1}, {0, 2, 1}, {1, 2, 2}, {0, 3, 2}}) {
      grpc::ClientContext context;
      context.AddMetadata("x-lockstep-token", kToken);
      request.set_worker(worker);
      request.set_clock(step);
      v1::ClockResponse response;
      ASSERT_TRUE(stub->Clock(&context, request, &response).ok());
      ASSERT_TRUE(written(checkpoints)) << "worker " << worker << " at step " << step;
    }
    // The write is on the checkpointer's thread; the server's destructor waits for it.
    (*server)->Shutdown(1000);
  }
  auto again = ShardServer::Start(options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->stats().restored_step, 2);
  EXPECT_EQ((*again)->table("emb")->Values(), held);
  EXPECT_EQ((*again)->stats().min_clock, 2);
  // A shard of another job's tables is not this one's: it starts fresh.
  options.tables = {Table("emb", 100, 4)};
  auto other = ShardServer::Start(options);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ((*other)->stats().restored_step, -1);
  std::filesystem::remove_all(dir);
}

TEST(PsServerOptionsTest, AServerWithoutATokenOrWithTwoTablesOfOneNameDoesNotStart) {
  ShardServerOptions options;
  options.job = kJob;
  options.tables = {Table("emb", 10, 2)};
  EXPECT_EQ(ShardServer::Start(options).status().code(), StatusCode::kInvalidArgument);
  options.token = kToken;
  options.tables.push_back(Table("emb", 20, 2));
  Status started = ShardServer::Start(options).status();
  EXPECT_EQ(started.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(started.message().find("two tables are named emb"), std::string::npos) << started;
}

}  // namespace
}  // namespace lockstep::ps
