#include "worker/ps/ps_server.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "common/rendezvous/wire.h"
#include "common/spec/training_job.h"
#include "proto/parameter_server.grpc.pb.h"
#include "worker/ps/shard_checkpoint.h"

// The wire carries float32 little-endian (proto/parameter_server.proto); values are copied as
// they lie in memory.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire's floats are little-endian");

namespace lockstep::ps {
namespace {

namespace v1 = ::lockstep::ps::v1;
using rendezvous::kTokenMetadataKey;
using rendezvous::ToGrpcStatus;
using rendezvous::TokensEqual;

// A clock wait answers this long before its call's deadline, and lasts at most kMaxClockWait.
constexpr auto kClockAnswerMargin = std::chrono::milliseconds(200);
constexpr auto kMaxClockWait = std::chrono::minutes(10);

class ShardServerImpl final : public ShardServer, public v1::ParameterServer::Service {
 public:
  explicit ShardServerImpl(ShardServerOptions options)
      : options_(std::move(options)), clocks_(static_cast<size_t>(options_.workers), 0) {}
  ~ShardServerImpl() override { Shutdown(/*deadline_ms=*/1000); }

  Status Init() {
    for (const TableSpec& spec : options_.tables) {
      LOCKSTEP_ASSIGN_OR_RETURN(auto table,
                                ShardTable::Create(spec, options_.shard, options_.shards));
      if (!tables_.emplace(spec.name, std::move(table)).second) {
        return InvalidArgumentError("two tables are named " + spec.name);
      }
    }
    if (!options_.checkpoint_uri.empty()) LOCKSTEP_RETURN_IF_ERROR(Restore());
    std::shared_ptr<grpc::ServerCredentials> credentials;
    if (!options_.tls_cert_pem.empty()) {
      grpc::SslServerCredentialsOptions ssl;
      ssl.pem_key_cert_pairs.push_back({options_.tls_key_pem, options_.tls_cert_pem});
      credentials = grpc::SslServerCredentials(ssl);
    } else {
      credentials = grpc::InsecureServerCredentials();
    }
    grpc::ServerBuilder builder;
    builder.AddListeningPort(options_.listen_address, credentials, &port_);
    builder.RegisterService(this);
    builder.SetMaxReceiveMessageSize(static_cast<int>(options_.max_message_bytes));
    builder.SetMaxSendMessageSize(static_cast<int>(options_.max_message_bytes));
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port_ == 0) {
      return UnavailableError("parameter server: cannot listen on " + options_.listen_address);
    }
    return OkStatus();
  }

  int port() const override { return port_; }

  ShardServerStats stats() const override {
    ShardServerStats stats;
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats = stats_;
    }
    std::lock_guard<std::mutex> lock(clock_mu_);
    stats.min_clock = min_clock_;
    stats.max_clock = *std::max_element(clocks_.begin(), clocks_.end());
    stats.restored_step = restored_step_;
    stats.checkpoints = checkpointer_ ? checkpointer_->written() : 0;
    return stats;
  }

  const ShardTable* table(const std::string& name) const override {
    auto found = tables_.find(name);
    return found == tables_.end() ? nullptr : found->second.get();
  }

  void Shutdown(int64_t deadline_ms) override {
    {
      std::lock_guard<std::mutex> lock(clock_mu_);
      stopping_ = true;
      clock_cv_.notify_all();
    }
    std::lock_guard<std::mutex> lock(shutdown_mu_);
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
    server_.reset();
  }

  grpc::Status Pull(grpc::ServerContext* context, const v1::PullRequest* request,
                    v1::PullResponse* response) override {
    auto table = Admit(*context, request->job(), request->table(), request->rows_size());
    if (!table.ok()) return Refuse(table.status());
    const size_t count = static_cast<size_t>(request->rows_size());
    const int32_t dim = (*table)->spec().dim;
    std::vector<float> values(count * static_cast<size_t>(dim));
    Status pulled = (*table)->Pull(request->rows().data(), count, values.data());
    if (!pulled.ok()) return Refuse(pulled);
    response->set_values(reinterpret_cast<const char*>(values.data()),
                         values.size() * sizeof(float));
    response->set_dim(static_cast<uint32_t>(dim));
    response->set_version((*table)->version());
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.pulls;
    stats_.rows_pulled += count;
    stats_.bytes_received += request->ByteSizeLong();
    stats_.bytes_sent += response->ByteSizeLong();
    return grpc::Status::OK;
  }

  grpc::Status Clock(grpc::ServerContext* context, const v1::ClockRequest* request,
                     v1::ClockResponse* response) override {
    StatusOr<bool> admitted = AdmitJob(*context, request->job());
    if (!admitted.ok()) return Refuse(admitted.status());
    if (request->workers() != static_cast<uint32_t>(options_.workers)) {
      return Refuse(InvalidArgumentError("workers: " + std::to_string(request->workers()) +
                                         ", but this server keeps the clocks "
                                         "of " +
                                         std::to_string(options_.workers) + " workers"));
    }
    if (request->worker() >= request->workers()) {
      return Refuse(InvalidArgumentError("worker: " + std::to_string(request->worker()) +
                                         " is not below workers (" +
                                         std::to_string(request->workers()) + ")"));
    }
    if (request->clock() < -1 || request->wait_for() < -1) {
      return Refuse(InvalidArgumentError("clock and wait_for must be -1 or more"));
    }
    const size_t worker = request->worker();
    std::unique_lock<std::mutex> lock(clock_mu_);
    if (request->clock() > clocks_[worker]) {
      const int64_t before = min_clock_;
      clocks_[worker] = request->clock();
      min_clock_ = *std::min_element(clocks_.begin(), clocks_.end());
      if (min_clock_ > before) ApplyDeferred();
      clock_cv_.notify_all();
    }
    if (request->initialized() && !initialized_) {
      initialized_ = true;
      clock_cv_.notify_all();
    }
    MaybeCheckpoint();
    const int64_t wait_for = request->wait_for();
    // Bounded by the call's deadline (the client's), checked between slices of the wait, and
    // answered a little before it, so that the caller reads why it waited in vain; and by
    // kMaxClockWait for a call without one.
    const auto now = std::chrono::system_clock::now();
    const auto give_up = std::min(context->deadline() - kClockAnswerMargin, now + kMaxClockWait);
    while (wait_for >= 0 && !(initialized_ && min_clock_ >= wait_for)) {
      // Waits that end unanswered are not refusals (lockstep_ps_refused_total): the caller asks
      // again.
      if (stopping_ || context->IsCancelled()) {
        return ToGrpcStatus(CancelledError("the parameter server is stopping"));
      }
      if (give_up <= std::chrono::system_clock::now()) {
        const size_t slowest =
            static_cast<size_t>(std::min_element(clocks_.begin(), clocks_.end()) - clocks_.begin());
        return ToGrpcStatus(DeadlineExceededError(
            !initialized_ ? "the chief has not initialized the parameters yet"
                          : "waiting for every worker to reach step " + std::to_string(wait_for) +
                                ": worker " + std::to_string(slowest) + " is at " +
                                std::to_string(clocks_[slowest])));
      }
      // Wakes for a clock, a cancellation check every 100 ms, and at give_up exactly.
      clock_cv_.wait_until(lock, std::min(give_up, std::chrono::system_clock::now() +
                                                       std::chrono::milliseconds(100)));
    }
    response->set_clock(clocks_[worker]);
    response->set_min_clock(min_clock_);
    response->set_initialized(initialized_);
    lock.unlock();
    std::lock_guard<std::mutex> stats_lock(stats_mu_);
    ++stats_.clocks;
    stats_.bytes_received += request->ByteSizeLong();
    stats_.bytes_sent += response->ByteSizeLong();
    return grpc::Status::OK;
  }

  grpc::Status Push(grpc::ServerContext* context, const v1::PushRequest* request,
                    v1::PushResponse* response) override {
    auto table = Admit(*context, request->job(), request->table(), request->rows_size());
    if (!table.ok()) return Refuse(table.status());
    const size_t count = static_cast<size_t>(request->rows_size());
    const size_t want = count * static_cast<size_t>((*table)->spec().dim) * sizeof(float);
    if (request->values().size() != want) {
      return Refuse(InvalidArgumentError("values: " + std::to_string(request->values().size()) +
                                         " bytes for " + std::to_string(count) + " rows of table " +
                                         request->table() + ", which need " + std::to_string(want) +
                                         " (rows x dim x 4)"));
    }
    // The bytes of a protobuf string need not be aligned for floats: copy them.
    std::vector<float> values(want / sizeof(float));
    if (want > 0) std::memcpy(values.data(), request->values().data(), want);
    PushKind kind = PushKind::kGradient;
    switch (request->kind()) {
      case v1::PushRequest::DELTA:
        kind = PushKind::kDelta;
        break;
      case v1::PushRequest::DEFERRED:
        kind = PushKind::kDeferred;
        break;
      case v1::PushRequest::ASSIGN:
        kind = PushKind::kAssign;
        break;
      default:
        break;
    }
    // A request sent again (its answer was lost) is answered without being applied twice.
    const bool identified = !request->client().empty() && request->sequence() > 0;
    if (identified && !FirstSight(request->client(), request->sequence())) {
      response->set_version((*table)->version());
      return grpc::Status::OK;
    }
    Status applied = OkStatus();
    if (kind == PushKind::kDeferred) {
      applied = Defer(**table, request->rows().data(), count, values.data());
      response->set_version((*table)->version());
    } else if (kind == PushKind::kAssign && Initialized()) {
      // Initial values are written once: a chief started again after the job was initialized
      // must not overwrite what was trained.
      response->set_version((*table)->version());
    } else {
      auto version = (*table)->Push(request->rows().data(), count, values.data(), kind);
      applied = version.status();
      if (version.ok()) response->set_version(*version);
    }
    if (!applied.ok()) {
      if (identified) Forget(request->client(), request->sequence());
      return Refuse(applied);
    }
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.pushes;
    stats_.rows_pushed += count;
    stats_.bytes_received += request->ByteSizeLong();
    stats_.bytes_sent += response->ByteSizeLong();
    return grpc::Status::OK;
  }

 private:
  bool Initialized() const {
    std::lock_guard<std::mutex> lock(clock_mu_);
    return initialized_;
  }

  // Whether push `sequence` of `client` is new; it is remembered from now on (so a repeat arriving
  // while the first is applied is not applied too). Each client's numbers below its newest minus
  // kSequenceWindow are forgotten, as are the clients least recently heard from past kMaxClients:
  // bounded memory, and a repeat comes within one call's patience, long before either.
  bool FirstSight(const std::string& client, uint64_t sequence) {
    std::lock_guard<std::mutex> lock(dedup_mu_);
    Sequences& seen = sequences_[client];
    seen.last_use = ++dedup_clock_;
    if (sequence <= seen.floor || !seen.recent.insert(sequence).second) return false;
    seen.newest = std::max(seen.newest, sequence);
    if (seen.recent.size() > 2 * kSequenceWindow) {
      seen.floor = seen.newest - kSequenceWindow;
      for (auto it = seen.recent.begin(); it != seen.recent.end();) {
        it = *it <= seen.floor ? seen.recent.erase(it) : std::next(it);
      }
    }
    if (sequences_.size() > kMaxClients) {
      auto oldest = sequences_.begin();
      for (auto it = sequences_.begin(); it != sequences_.end(); ++it) {
        if (it->second.last_use < oldest->second.last_use) oldest = it;
      }
      sequences_.erase(oldest);
    }
    return true;
  }

  // A push that was refused: a repeat of it may be applied after all.
  void Forget(const std::string& client, uint64_t sequence) {
    std::lock_guard<std::mutex> lock(dedup_mu_);
    auto it = sequences_.find(client);
    if (it != sequences_.end()) it->second.recent.erase(sequence);
  }

  // The newest valid checkpoint of this shard, when there is one, into the tables and clocks.
  Status Restore() {
    ShardCheckpointOptions options;
    options.uri = options_.checkpoint_uri;
    options.shard = options_.shard;
    options.shards = options_.shards;
    options.keep = options_.checkpoint_keep;
    options.tables = options_.tables;
    options.workers = options_.workers;
    LOCKSTEP_ASSIGN_OR_RETURN(checkpointer_, ShardCheckpointer::Open(options));
    LOCKSTEP_ASSIGN_OR_RETURN(std::optional<ShardSnapshot> snapshot, checkpointer_->LoadNewest());
    if (!snapshot.has_value()) return OkStatus();
    for (auto& [name, table] : tables_) {
      LOCKSTEP_RETURN_IF_ERROR(table->SetValues(snapshot->tables[name])
                                   .WithContext("restoring " + checkpointer_->root()));
    }
    clocks_ = snapshot->clocks;
    min_clock_ = *std::min_element(clocks_.begin(), clocks_.end());
    initialized_ = snapshot->initialized;
    restored_step_ = snapshot->step;
    return OkStatus();
  }

  // Under clock_mu_: once the job is initialized, hands a copy of the shard and the clocks to the
  // checkpointer when none was committed yet (the chief's initial values: a shard restored
  // before any other checkpoint is whole) or the slowest worker has advanced intervalSteps past
  // the last committed one. A write that failed is tried again at a later call (after the
  // checkpointer's back-off); one in flight is let finish.
  void MaybeCheckpoint() {
    if (!checkpointer_ || !initialized_ || !checkpointer_->ready()) return;
    const int64_t committed = checkpointer_->last_committed_step();
    if (committed >= 0 && min_clock_ < committed + options_.checkpoint_interval_steps) return;
    ShardSnapshot snapshot;
    snapshot.step = min_clock_;
    snapshot.clocks = clocks_;
    snapshot.initialized = initialized_;
    for (const auto& [name, table] : tables_) snapshot.tables[name] = table->Values();
    checkpointer_->WriteInBackground(std::move(snapshot));
  }

  // Holds a deferred gradient until the slowest worker's clock advances, summed with the others'.
  Status Defer(const ShardTable& table, const uint64_t* rows, size_t count, const float* values) {
    LOCKSTEP_RETURN_IF_ERROR(table.CheckRows(rows, count));
    const int32_t dim = table.spec().dim;
    for (size_t i = 0; i < count * static_cast<size_t>(dim); ++i) {
      if (!std::isfinite(values[i])) {
        return InvalidArgumentError("values of rows[" + std::to_string(i / dim) +
                                    "] are not all finite");
      }
    }
    std::lock_guard<std::mutex> lock(clock_mu_);
    Deferred& held = deferred_[table.spec().name];
    for (size_t i = 0; i < count; ++i) {
      auto [it, added] = held.slot.emplace(rows[i], held.rows.size());
      if (added) {
        held.rows.push_back(rows[i]);
        held.values.resize(held.values.size() + static_cast<size_t>(dim), 0.0f);
      }
      float* target = held.values.data() + it->second * static_cast<size_t>(dim);
      for (int32_t j = 0; j < dim; ++j) target[j] += values[i * static_cast<size_t>(dim) + j];
    }
    return OkStatus();
  }

  // Under clock_mu_: applies what was deferred, as gradients.
  void ApplyDeferred() {
    for (auto& [name, held] : deferred_) {
      if (held.rows.empty()) continue;
      Status applied =
          tables_.at(name)
              ->Push(held.rows.data(), held.rows.size(), held.values.data(), PushKind::kGradient)
              .status();
      if (!applied.ok()) {
        std::lock_guard<std::mutex> stats_lock(stats_mu_);
        ++stats_.refused;  // the sum of finite gradients overflowed: that step is dropped
      }
      held = Deferred();
    }
  }

  // The token and the job (a wrong one of either gets the same NOT_FOUND, as the rendezvous
  // service answers).
  StatusOr<bool> AdmitJob(const grpc::ServerContext& context, const std::string& job) const {
    const auto& metadata = context.client_metadata();
    auto token = metadata.find(kTokenMetadataKey);
    const std::string presented = token == metadata.end()
                                      ? std::string()
                                      : std::string(token->second.data(), token->second.size());
    if (!TokensEqual(options_.token, presented) || job != options_.job) {
      return NotFoundError("no job " + job + " on this parameter server");
    }
    return true;
  }

  // The table a call may use: the token and the job first (a wrong one of either gets the same
  // NOT_FOUND, as the rendezvous service answers), then the table and the request's row count.
  StatusOr<ShardTable*> Admit(const grpc::ServerContext& context, const std::string& job,
                              const std::string& table_name, int rows) const {
    LOCKSTEP_RETURN_IF_ERROR(AdmitJob(context, job).status());
    auto found = tables_.find(table_name);
    if (found == tables_.end()) {
      return NotFoundError("job " + job + " has no table " + table_name);
    }
    if (rows > options_.max_rows_per_request) {
      return InvalidArgumentError("rows: " + std::to_string(rows) +
                                  " in one request, more than this server's " +
                                  std::to_string(options_.max_rows_per_request));
    }
    // A pull's answer, and a push's values, are rows x dim floats: bounded like a message, and
    // checked before anything is allocated for them.
    const int64_t bytes = static_cast<int64_t>(rows) * found->second->spec().dim *
                          static_cast<int64_t>(sizeof(float));
    if (bytes > options_.max_message_bytes) {
      return InvalidArgumentError("rows: " + std::to_string(rows) + " rows of table " + table_name +
                                  " are " + std::to_string(bytes) +
                                  " bytes of values, more than this server's message bound of " +
                                  std::to_string(options_.max_message_bytes));
    }
    return found->second.get();
  }

  grpc::Status Refuse(const Status& status) {
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.refused;
    }
    return ToGrpcStatus(status);
  }

  const ShardServerOptions options_;
  std::map<std::string, std::unique_ptr<ShardTable>> tables_;  // fixed after Init
  int port_ = 0;
  std::mutex shutdown_mu_;
  std::unique_ptr<grpc::Server> server_;
  mutable std::mutex stats_mu_;
  ShardServerStats stats_;

  struct Deferred {
    std::unordered_map<uint64_t, size_t> slot;  // row -> its place in rows
    std::vector<uint64_t> rows;
    std::vector<float> values;  // rows.size() x dim
  };
  mutable std::mutex clock_mu_;
  std::condition_variable clock_cv_;
  std::vector<int64_t> clocks_;  // worker -> steps finished
  int64_t min_clock_ = 0;
  bool initialized_ = false;
  bool stopping_ = false;
  std::map<std::string, Deferred> deferred_;  // table -> gradients held
  static constexpr uint64_t kSequenceWindow = 4096;
  static constexpr size_t kMaxClients = 4096;
  struct Sequences {
    uint64_t floor = 0;  // every number up to here counts as seen
    uint64_t newest = 0;
    std::unordered_set<uint64_t> recent;
    uint64_t last_use = 0;
  };
  std::mutex dedup_mu_;
  std::unordered_map<std::string, Sequences> sequences_;
  uint64_t dedup_clock_ = 0;
  std::unique_ptr<ShardCheckpointer> checkpointer_;  // set in Init; null without checkpoints
  int64_t restored_step_ = -1;
};

Status CheckOptions(const ShardServerOptions& options) {
  if (options.job.empty()) return InvalidArgumentError("parameter server: no job");
  if (options.token.empty()) {
    return InvalidArgumentError("parameter server: job " + options.job + " has no token");
  }
  if (options.max_rows_per_request < 1 || options.max_message_bytes < 1 ||
      options.max_message_bytes > std::numeric_limits<int>::max()) {
    return InvalidArgumentError(
        "parameter server: max_rows_per_request must be >= 1 and max_message_bytes in [1, 2 GiB)");
  }
  if (options.shards < 1 || options.shard < 0 || options.shard >= options.shards) {
    return InvalidArgumentError("parameter server: shard " + std::to_string(options.shard) +
                                " of " + std::to_string(options.shards) + " does not exist");
  }
  if (!options.checkpoint_uri.empty() &&
      (options.checkpoint_interval_steps < 1 || options.checkpoint_keep < 1)) {
    return InvalidArgumentError(
        "parameter server: checkpoint_interval_steps and checkpoint_keep must be >= 1");
  }
  if (options.workers < 1 || options.workers > spec::kMaxReplicas) {
    return InvalidArgumentError("parameter server: workers must be in [1, " +
                                std::to_string(spec::kMaxReplicas) + "] (got " +
                                std::to_string(options.workers) + ")");
  }
  if (options.tls_cert_pem.empty() != options.tls_key_pem.empty()) {
    return InvalidArgumentError("parameter server: TLS needs both a certificate and its key");
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<ShardServer>> ShardServer::Start(const ShardServerOptions& options) {
  LOCKSTEP_RETURN_IF_ERROR(CheckOptions(options));
  auto server = std::make_unique<ShardServerImpl>(options);
  LOCKSTEP_RETURN_IF_ERROR(server->Init());
  return std::unique_ptr<ShardServer>(std::move(server));
}

}  // namespace lockstep::ps
