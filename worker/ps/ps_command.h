// `lockstep-worker ps`: one parameter server of a job as a process (ShardServer, ps_server.h),
// serving until SIGTERM or SIGINT.
//
//   LOCKSTEP_PS_TOKEN=... lockstep-worker ps --job default/ctr --shard 0 --shards 2
//       --listen 0.0.0.0:7470 --table embeddings:1000000:16:0.05 --table dense:40:64:0.05:1:0
//   LOCKSTEP_PS_TOKEN=... lockstep-worker ps --manifest ctr.yaml --shard 1
//
// --table NAME:ROWS:DIM[:LEARNING_RATE[:SEED[:INIT_SCALE]]] (repeatable; defaults 0.01, 1, 0.01),
// --workers N (the workers whose clocks it keeps; default 1). Or, instead of --table, --workers
// and --shards, the job's manifest (--manifest FILE, or LOCKSTEP_SPEC as in a pod): its tables
// (ps_job.h), spec.replicas workers and spec.parameterServers.replicas shards; the job's name
// from LOCKSTEP_JOB or the manifest.
// The token and the TLS files come from the environment (ps_credentials.h), never the command
// line (which any user can read in /proc). Once listening it prints one line, "parameter server S
// of N of job J listening on port P", so that a launcher given port 0 learns the port. Exit status: 0 after a signal, 2 for bad
// arguments (naming the flag and the value), 1 when it cannot serve.
#pragma once

#include <string>
#include <vector>

namespace lockstep::ps {

// args: the arguments after "ps".
int RunParameterServerCommand(const std::vector<std::string>& args);

}  // namespace lockstep::ps
