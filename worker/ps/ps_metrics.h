// PsMetrics: a parameter server's Prometheus metrics (docs/architecture.md, "Metrics"), read from
// its ShardServer's stats at each scrape and labelled with the job and the server's shard:
//   lockstep_ps_requests_total{kind="pull"|"push"|"clock"}  calls answered
//   lockstep_ps_rows_total{direction="pulled"|"pushed"}      rows served and taken
//   lockstep_ps_bytes_total{direction="received"|"sent"}     serialized messages
//   lockstep_ps_refused_total                                calls answered with an error
//   lockstep_ps_min_clock                                    the slowest worker's step
//   lockstep_ps_staleness_steps                              fastest minus slowest worker
//   lockstep_ps_checkpoints_total                            shard checkpoints written
//   lockstep_ps_restored_step                                the checkpoint restored at start; -1
//
//   LOCKSTEP_ASSIGN_OR_RETURN(auto metrics, PsMetrics::Create("default/ctr", 1, 9402, *server));
//
// Port 0: no endpoint. Thread safety: the endpoint's thread reads the server's stats (which are
// thread-safe); the object must not outlive the server.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "worker/ps/ps_server.h"

namespace lockstep::ps {

class PsMetrics {
 public:
  // InvalidArgument for a port outside 0..65535; Unavailable naming the port when it is busy.
  static StatusOr<std::unique_ptr<PsMetrics>> Create(const std::string& job, int shard, int port,
                                                     const ShardServer& server);
  ~PsMetrics();
  int port() const;
  // The metrics as the endpoint serves them now (Prometheus text format).
  std::string Text();

 private:
  struct Impl;
  explicit PsMetrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::ps
