// Start-up glue of the worker and the exec agent: probe the RDMA devices, log what was found, and
// add the NCCL IB settings that DecideNcclRdmaEnv chose to this process's environment, so that
// NCCL in this process (lockstep-worker train) or in the command the agent starts (it inherits
// the environment) sees them.
//
//   // main thread, before anything that may read the environment on another thread starts
//   rdma::SetUpNcclRdmaEnvironment(job.spec.network);
//
// The probe always runs (it is cheap, and a log of what the node offers helps whoever debugs a
// slow all-reduce); variables are added only in network mode roce or infiniband (nccl_rdma_env.h).
//
// LOCKSTEP_RDMA_SYSFS_ROOT=DIR reads the devices from the sysfs tree under DIR instead of through
// libibverbs: for a worker built without libibverbs, and for end-to-end tests with a fake tree.
//
// Thread safety: setenv() is not safe against a concurrent getenv() in another thread (glibc may
// move the environment array). Call this before the process starts threads of its own (signal
// watcher, metrics endpoint, gRPC, Gloo, NCCL, CUDA). Threads that exist before main (OpenBLAS's
// pool) read the environment only while the library loads.
#pragma once

#include <map>
#include <string>

#include "common/spec/training_job.h"
#include "worker/comm/rdma/nccl_rdma_env.h"
#include "worker/comm/rdma/rdma_devices.h"

namespace lockstep::rdma {

// Probes, logs (INFO; a failed probe is one WARNING and sets nothing), calls setenv for each
// variable chosen, and returns the decision. Never fails the caller: RDMA settings are an
// optimisation, NCCL still works without them.
NcclRdmaEnv SetUpNcclRdmaEnvironment(const spec::NetworkSpec& network,
                                     const RdmaProbeOptions& options = {});

// The process environment as a map (from environ).
std::map<std::string, std::string> CurrentEnvironment();

}  // namespace lockstep::rdma
