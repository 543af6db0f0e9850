#include "worker/ps/ps_client.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <unordered_map>
#include <utility>

#include "common/rendezvous/wire.h"
#include "proto/parameter_server.grpc.pb.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire's floats are little-endian");

namespace lockstep::ps {
namespace {

namespace v1 = ::lockstep::ps::v1;

constexpr int64_t kMaxTimeoutMs = int64_t{24} * 3600 * 1000;

// Each distinct row once, and where every requested row finds it: rows[i] == distinct[slot[i]].
struct Distinct {
  std::vector<uint64_t> rows;
  std::vector<size_t> slot;
};

Distinct DistinctRows(const std::vector<uint64_t>& rows) {
  Distinct out;
  out.slot.reserve(rows.size());
  std::unordered_map<uint64_t, size_t> seen;
  seen.reserve(rows.size());
  for (uint64_t row : rows) {
    auto [it, added] = seen.emplace(row, out.rows.size());
    if (added) out.rows.push_back(row);
    out.slot.push_back(it->second);
  }
  return out;
}

// The requests of one call: for each server, its distinct rows (as indices into Distinct::rows)
// cut into pieces of at most max_rows.
std::vector<std::pair<int, std::vector<size_t>>> Pieces(const std::vector<uint64_t>& distinct,
                                                        int shards, int64_t max_rows) {
  max_rows = std::max<int64_t>(1, max_rows);
  std::vector<std::vector<size_t>> by_shard(static_cast<size_t>(shards));
  for (size_t d = 0; d < distinct.size(); ++d) {
    by_shard[static_cast<size_t>(ShardOfRow(distinct[d], shards))].push_back(d);
  }
  std::vector<std::pair<int, std::vector<size_t>>> pieces;
  for (int s = 0; s < shards; ++s) {
    const std::vector<size_t>& mine = by_shard[static_cast<size_t>(s)];
    for (size_t begin = 0; begin < mine.size(); begin += static_cast<size_t>(max_rows)) {
      const size_t end = std::min(mine.size(), begin + static_cast<size_t>(max_rows));
      pieces.emplace_back(s, std::vector<size_t>(mine.begin() + static_cast<std::ptrdiff_t>(begin),
                                                 mine.begin() + static_cast<std::ptrdiff_t>(end)));
    }
  }
  return pieces;
}

v1::PushRequest::Kind WireKind(PushKind kind) {
  switch (kind) {
    case PushKind::kDelta:
      return v1::PushRequest::DELTA;
    case PushKind::kDeferred:
      return v1::PushRequest::DEFERRED;
    case PushKind::kAssign:
      return v1::PushRequest::ASSIGN;
    case PushKind::kGradient:
      break;
  }
  return v1::PushRequest::GRADIENT;
}

template <typename Request, typename Response>
struct Call {
  int shard = 0;
  std::vector<size_t> distinct;  // which distinct rows this request carries
  std::unique_ptr<grpc::ClientContext> context;  // a fresh one for every attempt
  Request request;
  Response response;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> reader;
};

// A server that is down: it went away mid-call, or is not listening (yet, or again).
bool ServerDown(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE;
}

}  // namespace

struct PsClient::Stubs {
  std::vector<std::unique_ptr<v1::ParameterServer::Stub>> stubs;

  // Starts every call, then waits for all of them, each attempt under one deadline (timeout_ms,
  // or options.timeout_ms when 0). A call whose server is down (UNAVAILABLE) or did not answer
  // in time is sent again, waiting for the server to be back (a parameter server restarted from
  // its checkpoint), until patience_ms have passed (at least one attempt): a push carries its
  // client's id and sequence number, and a server that has applied it already answers without
  // applying it again. Returns the first failure, naming its server.
  template <typename Request, typename Response, typename Prepare>
  Status RunAll(std::vector<std::unique_ptr<Call<Request, Response>>>& calls,
                const PsClientOptions& options, Prepare prepare, int64_t timeout_ms = 0,
                bool wait_for_ready = false, int64_t patience_ms = 0) {
    const auto attempt =
        std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : options.timeout_ms);
    const auto started = std::chrono::system_clock::now();
    const auto give_up = started + std::max(attempt, std::chrono::milliseconds(patience_ms));
    std::vector<Call<Request, Response>*> pending;
    for (auto& call : calls) pending.push_back(call.get());
    for (bool again = false; !pending.empty(); again = true) {
      grpc::CompletionQueue queue;
      for (size_t i = 0; i < pending.size(); ++i) {
        Call<Request, Response>& call = *pending[i];
        call.context = std::make_unique<grpc::ClientContext>();
        call.context->AddMetadata(rendezvous::kTokenMetadataKey, options.token);
        call.context->set_deadline(std::min(give_up, std::chrono::system_clock::now() + attempt));
        call.context->set_wait_for_ready(wait_for_ready || again);
        call.response.Clear();
        call.reader = prepare(*stubs[static_cast<size_t>(call.shard)], call.context.get(),
                              call.request, &queue);
        call.reader->StartCall();
        call.reader->Finish(&call.response, &call.status, reinterpret_cast<void*>(i));
      }
      for (size_t done = 0; done < pending.size(); ++done) {
        void* tag = nullptr;
        bool ok = false;
        if (!queue.Next(&tag, &ok)) break;  // not reached: the queue is shut down below
      }
      queue.Shutdown();
      void* tag = nullptr;
      bool ok = false;
      while (queue.Next(&tag, &ok)) {
      }
      std::vector<Call<Request, Response>*> down;
      for (Call<Request, Response>* call : pending) {
        if (ServerDown(call->status) ||
            (patience_ms > 0 && call->status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)) {
          down.push_back(call);
        }
      }
      if (std::chrono::system_clock::now() >= give_up) break;
      pending = std::move(down);
    }
    for (const auto& call : calls) {
      if (!call->status.ok()) {
        return rendezvous::FromGrpcStatus(call->status)
            .WithContext("parameter server " + std::to_string(call->shard) + " (" +
                         options.servers[static_cast<size_t>(call->shard)] + ")");
      }
    }
    return OkStatus();
  }
};

// What an answer carries beside its values: its fields' tags and lengths, clocks, a version.
constexpr int64_t kAnswerOverheadBytes = 64 << 10;

StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(PsClientOptions options) {
  if (options.servers.empty()) return InvalidArgumentError("parameter servers: none given");
  if (options.job.empty() || options.token.empty()) {
    return InvalidArgumentError("parameter servers: a client needs the job and its token");
  }
  if (options.timeout_ms < 1 || options.timeout_ms > kMaxTimeoutMs ||
      options.max_rows_per_request < 1 || options.max_message_bytes < 1) {
    return InvalidArgumentError(
        "parameter servers: timeout_ms must be in [1, 86400000], max_rows_per_request and "
        "max_message_bytes >= 1");
  }
  std::unique_ptr<PsClient> client(new PsClient(std::move(options)));
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (!client->options_.tls_ca_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = client->options_.tls_ca_pem;
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  // An answer holds at most a request's values (RowsPerRequest keeps them within
  // max_message_bytes) and little else: a larger one is refused (RESOURCE_EXHAUSTED) and never
  // reaches this client's code. gRPC's transport still reads a message whole before the bound
  // applies (grpc/grpc#43012); a resource quota would bound that too, but would stall a large
  // pull's pieces in flight together on one channel.
  args.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(
      std::numeric_limits<int>::max(), client->options_.max_message_bytes +
                                           16 * client->options_.max_rows_per_request +
                                           kAnswerOverheadBytes)));
  for (const std::string& address : client->options_.servers) {
    client->stubs_->stubs.push_back(
        v1::ParameterServer::NewStub(grpc::CreateCustomChannel(address, credentials, args)));
  }
  return client;
}

PsClient::PsClient(PsClientOptions options)
    : options_(std::move(options)), stubs_(std::make_unique<Stubs>()) {
  // Unique among the job's clients: 128 random bits.
  std::random_device random;
  char id[33];
  std::snprintf(id, sizeof(id), "%08x%08x%08x%08x", random(), random(), random(), random());
  client_id_ = id;
}

PsClient::~PsClient() = default;

Status PsClient::Pull(const std::string& table, int32_t dim, const std::vector<uint64_t>& rows,
                      float* out) {
  if (dim < 1) return InvalidArgumentError("Pull: dim must be >= 1");
  if (rows.empty()) return OkStatus();
  const Distinct distinct = DistinctRows(rows);
  using PullCall = Call<v1::PullRequest, v1::PullResponse>;
  std::vector<std::unique_ptr<PullCall>> calls;
  for (auto& [shard, piece] : Pieces(distinct.rows, shards(), RowsPerRequest(dim))) {
    auto call = std::make_unique<PullCall>();
    call->shard = shard;
    call->request.set_job(options_.job);
    call->request.set_table(table);
    for (size_t d : piece) call->request.add_rows(distinct.rows[d]);
    call->distinct = std::move(piece);
    calls.push_back(std::move(call));
  }
  LOCKSTEP_RETURN_IF_ERROR(stubs_->RunAll(
      calls, options_,
      [](v1::ParameterServer::Stub& stub, grpc::ClientContext* context,
         const v1::PullRequest& request,
         grpc::CompletionQueue* queue) { return stub.PrepareAsyncPull(context, request, queue); },
      /*timeout_ms=*/0, /*wait_for_ready=*/false, options_.down_server_wait_ms));
  // Every distinct row's values, then each requested row's copy of them.
  std::vector<float> values(distinct.rows.size() * static_cast<size_t>(dim));
  PsTraffic traffic;
  for (const auto& call : calls) {
    const std::string& bytes = call->response.values();
    const size_t want = call->distinct.size() * static_cast<size_t>(dim) * sizeof(float);
    if (call->response.dim() != static_cast<uint32_t>(dim) || bytes.size() != want) {
      return DataLossError("parameter server " + std::to_string(call->shard) + " answered " +
                           std::to_string(bytes.size()) + " bytes of dim " +
                           std::to_string(call->response.dim()) + " for table " + table +
                           "; asked for " + std::to_string(call->distinct.size()) +
                           " rows of dim " + std::to_string(dim));
    }
    for (size_t k = 0; k < call->distinct.size(); ++k) {
      std::memcpy(values.data() + call->distinct[k] * static_cast<size_t>(dim),
                  bytes.data() + k * static_cast<size_t>(dim) * sizeof(float),
                  static_cast<size_t>(dim) * sizeof(float));
    }
    ++traffic.requests;
    traffic.request_bytes += call->request.ByteSizeLong();
    traffic.response_bytes += call->response.ByteSizeLong();
    traffic.rows += call->distinct.size();
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(out + i * static_cast<size_t>(dim),
                values.data() + distinct.slot[i] * static_cast<size_t>(dim),
                static_cast<size_t>(dim) * sizeof(float));
  }
  std::lock_guard<std::mutex> lock(traffic_mu_);
  traffic_.requests += traffic.requests;
  traffic_.request_bytes += traffic.request_bytes;
  traffic_.response_bytes += traffic.response_bytes;
  traffic_.rows += traffic.rows;
  return OkStatus();
}

Status PsClient::Push(const std::string& table, int32_t dim, const std::vector<uint64_t>& rows,
                      const float* values, PushKind kind) {
  if (dim < 1) return InvalidArgumentError("Push: dim must be >= 1");
  if (rows.empty()) return OkStatus();
  for (size_t i = 0; i < rows.size() * static_cast<size_t>(dim); ++i) {
    if (!std::isfinite(values[i])) {
      const size_t row = i / static_cast<size_t>(dim);
      return InvalidArgumentError("Push: the values of rows[" + std::to_string(row) +
                                  "] = " + std::to_string(rows[row]) + " are not all finite");
    }
  }
  const RowSums sums = SumByRow(rows, values, dim);
  if (kind == PushKind::kAssign && sums.rows.size() != rows.size()) {
    return InvalidArgumentError("Push: an assignment names a row more than once");
  }
  for (size_t i = 0; i < sums.values.size(); ++i) {
    if (!std::isfinite(sums.values[i])) {  // finite values can sum to infinity
      const size_t row = i / static_cast<size_t>(dim);
      return InvalidArgumentError("Push: the values of row " + std::to_string(sums.rows[row]) +
                                  " sum to a value that is not finite");
    }
  }
  using PushCall = Call<v1::PushRequest, v1::PushResponse>;
  std::vector<std::unique_ptr<PushCall>> calls;
  for (auto& [shard, piece] : Pieces(sums.rows, shards(), RowsPerRequest(dim))) {
    auto call = std::make_unique<PushCall>();
    call->shard = shard;
    call->request.set_job(options_.job);
    call->request.set_table(table);
    call->request.set_kind(WireKind(kind));
    // Each request once: a request sent again (its server was down, or slow to answer) is
    // recognised by the server and not applied twice.
    call->request.set_client(client_id_);
    call->request.set_sequence(next_sequence_.fetch_add(1) + 1);
    std::string* bytes = call->request.mutable_values();
    bytes->resize(piece.size() * static_cast<size_t>(dim) * sizeof(float));
    for (size_t k = 0; k < piece.size(); ++k) {
      call->request.add_rows(sums.rows[piece[k]]);
      std::memcpy(bytes->data() + k * static_cast<size_t>(dim) * sizeof(float),
                  sums.values.data() + piece[k] * static_cast<size_t>(dim),
                  static_cast<size_t>(dim) * sizeof(float));
    }
    call->distinct = std::move(piece);
    calls.push_back(std::move(call));
  }
  Status pushed = stubs_->RunAll(
      calls, options_,
      [](v1::ParameterServer::Stub& stub, grpc::ClientContext* context,
         const v1::PushRequest& request,
         grpc::CompletionQueue* queue) { return stub.PrepareAsyncPush(context, request, queue); },
      /*timeout_ms=*/0, /*wait_for_ready=*/false, options_.down_server_wait_ms);
  std::lock_guard<std::mutex> lock(traffic_mu_);
  for (const auto& call : calls) {
    ++traffic_.requests;
    traffic_.request_bytes += call->request.ByteSizeLong();
    traffic_.response_bytes += call->response.ByteSizeLong();
    traffic_.rows += call->distinct.size();
  }
  return pushed;
}

StatusOr<PsClock> PsClient::Clock(const ClockOptions& clock) {
  if (clock.workers < 1 || clock.worker < 0 || clock.worker >= clock.workers) {
    return InvalidArgumentError("Clock: worker " + std::to_string(clock.worker) + " of " +
                                std::to_string(clock.workers) + " does not exist");
  }
  if (clock.timeout_ms < 1 || clock.timeout_ms > kMaxTimeoutMs) {
    return InvalidArgumentError("Clock: timeout_ms must be in [1, 86400000]");
  }
  using ClockCall = Call<v1::ClockRequest, v1::ClockResponse>;
  std::vector<std::unique_ptr<ClockCall>> calls;
  for (int s = 0; s < shards(); ++s) {
    auto call = std::make_unique<ClockCall>();
    call->shard = s;
    call->request.set_job(options_.job);
    call->request.set_worker(static_cast<uint32_t>(clock.worker));
    call->request.set_workers(static_cast<uint32_t>(clock.workers));
    call->request.set_clock(clock.clock);
    call->request.set_wait_for(clock.wait_for);
    call->request.set_initialized(clock.initialized);
    calls.push_back(std::move(call));
  }
  LOCKSTEP_RETURN_IF_ERROR(stubs_->RunAll(
      calls, options_,
      [](v1::ParameterServer::Stub& stub, grpc::ClientContext* context,
         const v1::ClockRequest& request,
         grpc::CompletionQueue* queue) { return stub.PrepareAsyncClock(context, request, queue); },
      clock.timeout_ms, /*wait_for_ready=*/true));
  // Every server got the same reports, so they agree but for a report one of them missed (a
  // worker lost mid-call): the highest own clock is where the worker was, the lowest minimum
  // what every server has seen.
  PsClock out;
  out.clock = -1;
  out.min_clock = std::numeric_limits<int64_t>::max();
  out.initialized = true;
  for (const auto& call : calls) {
    out.clock = std::max(out.clock, call->response.clock());
    out.min_clock = std::min(out.min_clock, call->response.min_clock());
    out.initialized = out.initialized && call->response.initialized();
  }
  return out;
}

int64_t PsClient::RowsPerRequest(int32_t dim) const {
  const int64_t row_bytes = int64_t{dim} * static_cast<int64_t>(sizeof(float));
  return std::max<int64_t>(
      1, std::min(options_.max_rows_per_request, options_.max_message_bytes / row_bytes));
}

PsTraffic PsClient::traffic() const {
  std::lock_guard<std::mutex> lock(traffic_mu_);
  return traffic_;
}

}  // namespace lockstep::ps
