// ShardServer: one parameter server of a job (proto/parameter_server.proto), serving its shard of
// every table over gRPC. A parameter-server pod (or process under `lockstep run`) runs one.
//
//   ShardServerOptions options;
//   options.job = "default/ctr";
//   options.token = token;
//   options.shard = 0;
//   options.shards = 2;
//   options.tables = {{.name = "ads", .rows = 1'000'000, .dim = 16, .learning_rate = 0.05f}};
//   LOCKSTEP_ASSIGN_OR_RETURN(auto server, ShardServer::Start(options));
//   ... workers reach it at 127.0.0.1:<server->port()> (PsClient) ...
//   server->Shutdown(/*deadline_ms=*/1000);
//
// Thread safety: every method may be called from any thread while the server runs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/ps/shard_table.h"

namespace lockstep::ps {

struct ShardServerOptions {
  std::string listen_address = "127.0.0.1:0";  // port 0: pick a free port
  std::string job;    // namespace/name; requests naming another job get NOT_FOUND
  std::string token;  // non-empty; every call must carry it (x-lockstep-token)
  int shard = 0;
  int shards = 1;
  int workers = 1;  // the job's workers, whose clocks this server keeps (1..kMaxReplicas)
  std::vector<TableSpec> tables;
  // What one request may ask: rows named, and bytes of a message. A request naming more rows,
  // or rows whose values (rows x dim floats, a pull's answer or a push's payload) exceed the
  // message bound, is refused with INVALID_ARGUMENT before anything is allocated for it; a
  // message over the bound is refused by gRPC itself (RESOURCE_EXHAUSTED). Nothing changes.
  int64_t max_rows_per_request = int64_t{1} << 16;
  int64_t max_message_bytes = int64_t{64} << 20;
  // Checkpoints of this shard (shard_checkpoint.h) under checkpoint_uri, each time the slowest
  // worker's clock has advanced checkpoint_interval_steps since the last one (and once the chief
  // has initialized); the newest valid one is restored at Start. Empty: none.
  std::string checkpoint_uri;
  int64_t checkpoint_interval_steps = 100;
  int checkpoint_keep = 3;
  // TLS: PEM certificate chain and key; both empty for plaintext.
  std::string tls_cert_pem;
  std::string tls_key_pem;
};

// What the server has served since it started (for metrics and tests).
struct ShardServerStats {
  uint64_t pulls = 0;
  uint64_t pushes = 0;
  uint64_t rows_pulled = 0;
  uint64_t rows_pushed = 0;
  uint64_t refused = 0;  // calls answered with an error
  uint64_t clocks = 0;   // clock calls answered
  uint64_t bytes_received = 0;  // serialized requests answered (without gRPC framing)
  uint64_t bytes_sent = 0;      // serialized responses
  int64_t max_clock = 0;        // the fastest worker's clock (max - min: how stale the slowest is)
  int64_t min_clock = 0;  // the slowest worker's clock
  int64_t restored_step = -1;  // the checkpoint restored at Start; -1: none
  int64_t checkpoints = 0;     // written since Start
};

class ShardServer {
 public:
  // INVALID_ARGUMENT for options that cannot serve (no job or token, a bad table, two tables of
  // one name, bounds < 1); UNAVAILABLE when the address cannot be bound.
  static StatusOr<std::unique_ptr<ShardServer>> Start(const ShardServerOptions& options);
  virtual ~ShardServer() = default;

  virtual int port() const = 0;
  virtual ShardServerStats stats() const = 0;
  // The shard of table `name`, or nullptr (for tests and the server's own checkpoints).
  virtual const ShardTable* table(const std::string& name) const = 0;
  // Stops accepting calls and returns within deadline_ms; calls in flight are cancelled then.
  virtual void Shutdown(int64_t deadline_ms) = 0;
};

}  // namespace lockstep::ps
