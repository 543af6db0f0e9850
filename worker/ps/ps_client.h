// PsClient: a worker's side of a job's parameter servers (proto/parameter_server.proto). It
// sends each server only the rows its shard holds, each distinct row once, to all servers at
// once, and waits for them under one deadline.
//
//   PsClientOptions options;
//   options.servers = {"10.0.0.5:7000", "10.0.0.6:7000"};  // server s at index s
//   options.job = "default/ctr";
//   options.token = token;
//   LOCKSTEP_ASSIGN_OR_RETURN(auto client, PsClient::Connect(options));
//   std::vector<uint64_t> rows;                    // the rows a batch's ids fall in (RowOfId)
//   std::vector<float> embeddings(rows.size() * 16);
//   LOCKSTEP_RETURN_IF_ERROR(client->Pull("ads", 16, rows, embeddings.data()));
//   LOCKSTEP_RETURN_IF_ERROR(client->Push("ads", 16, rows, gradients.data(), PushKind::kGradient));
//
// A push is checked on the client first (dim, finite values), but it is not atomic: split over
// several servers, or over several requests to one, a part refused (a row past the table) or
// lost leaves the others applied (the error names the server). A request sent again after its
// server was down or slow carries the same id, and a server that applied it does not again.
//
// Thread safety: Pull and Push may be called from several threads at once.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/ps/shard_table.h"

namespace lockstep::ps {

struct PsClientOptions {
  std::vector<std::string> servers;  // host:port of server s at index s
  std::string job;
  std::string token;
  std::string tls_ca_pem;  // PEM of the CA that signed the servers' certificates; empty: plaintext
  int64_t timeout_ms = 10000;  // one Pull or Push, all its requests together
  // Rows per request: a shard's rows beyond this go in several requests (the servers'
  // max_rows_per_request must be at least this).
  int64_t max_rows_per_request = int64_t{1} << 16;
  // Bytes of values (rows x dim floats) per request, likewise (the servers' max_message_bytes
  // must be at least this, plus a little for the rows' numbers).
  int64_t max_message_bytes = int64_t{60} << 20;
  // How long a Pull or Push keeps sending a request again while its server is down or does not
  // answer within timeout_ms (a restarting server: its pod rescheduled, its shard restored);
  // 0: one attempt's timeout_ms.
  int64_t down_server_wait_ms = 0;
};

// What went over the wire, summed over calls (serialized message sizes, without gRPC framing).
struct PsTraffic {
  uint64_t requests = 0;
  uint64_t request_bytes = 0;
  uint64_t response_bytes = 0;
  uint64_t rows = 0;  // distinct rows sent or received
};

// One worker's clock report to every server (proto/parameter_server.proto, "Clocks").
struct ClockOptions {
  int worker = 0;
  int workers = 1;
  int64_t clock = -1;     // steps this worker has finished; -1: only ask
  int64_t wait_for = -1;  // wait until every worker's clock is >= this (and initialized)
  bool initialized = false;
  int64_t timeout_ms = 10000;  // the wait's bound: DEADLINE_EXCEEDED past it
};
struct PsClock {
  int64_t clock = 0;      // this worker's, as the servers hold it
  int64_t min_clock = 0;  // the slowest worker's
  bool initialized = false;
};

class PsClient {
 public:
  // INVALID_ARGUMENT without servers, job or token, with bounds < 1, or a timeout over a day.
  static StatusOr<std::unique_ptr<PsClient>> Connect(PsClientOptions options);
  ~PsClient();

  int shards() const { return static_cast<int>(options_.servers.size()); }

  // out[i * dim ...] = row rows[i] of `table` (rows in any order, repeats allowed). Errors: the
  // first server's that failed, naming it; DEADLINE_EXCEEDED after timeout_ms.
  Status Pull(const std::string& table, int32_t dim, const std::vector<uint64_t>& rows, float* out);
  // Applies values[i * dim ...] to row rows[i] (proto: GRADIENT or DELTA); the values of a row
  // named more than once are summed first, in order, so each row travels once.
  Status Push(const std::string& table, int32_t dim, const std::vector<uint64_t>& rows,
              const float* values, PushKind kind);

  // Reports this worker's clock to every server and, with wait_for >= 0, waits until every
  // worker's clock has reached it and the chief has initialized the job. A server that is not
  // up yet is waited for within the same timeout.
  StatusOr<PsClock> Clock(const ClockOptions& clock);

  PsTraffic traffic() const;

 private:
  struct Stubs;
  explicit PsClient(PsClientOptions options);
  // Rows of `dim` floats one request may carry (options' rows and bytes bounds).
  int64_t RowsPerRequest(int32_t dim) const;

  const PsClientOptions options_;
  std::unique_ptr<Stubs> stubs_;
  std::string client_id_;  // this client's pushes, as the servers tell them apart
  std::atomic<uint64_t> next_sequence_{0};
  mutable std::mutex traffic_mu_;
  PsTraffic traffic_;
};

}  // namespace lockstep::ps
