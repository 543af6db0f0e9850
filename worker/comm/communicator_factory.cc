#include "worker/comm/communicator_factory.h"

#include <cstdlib>
#include <string>

#include "common/logging.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/hierarchical/hierarchical_communicator.h"
#include "worker/comm/shm/shm_communicator.h"

#ifdef LOCKSTEP_COMM_WITH_NCCL
#include "worker/comm/nccl/nccl_communicator.h"
#endif

namespace lockstep::comm {
namespace {

bool AllMembersOnThisHost(const CommunicatorOptions& options) {
  return options.placement.host_count == 1;
}

// Several hosts, each with the same number (> 1) of this generation's ranks, consecutive: pods of
// ranksPerWorker > 1, each on its own host.
bool SeveralRanksOnEveryHost(const CommunicatorOptions& options) {
  const rendezvous::HostPlacement& placement = options.placement;
  return placement.contiguous && placement.host_count > 1 && placement.local_size > 1 &&
         placement.host_count * placement.local_size == options.size;
}

}  // namespace

StatusOr<std::string> ChooseCommunicatorBackend(const CommunicatorOptions& options,
                                                const char* lockstep_comm) {
  const std::string forced = lockstep_comm == nullptr ? "" : lockstep_comm;
  const bool one_host = AllMembersOnThisHost(options);
  if (forced != "" && forced != "auto" && forced != "gloo" && forced != "shm" &&
      forced != "shm+gloo" && forced != "nccl") {
    return InvalidArgumentError("LOCKSTEP_COMM=" + forced +
                                ": expected auto, nccl, shm, shm+gloo or gloo");
  }
  if (options.cuda) {
    if (forced.empty() || forced == "auto" || forced == "nccl") return std::string("nccl");
    return FailedPreconditionError("LOCKSTEP_COMM=" + forced +
                                   ": the trainer runs on device cuda, whose tensors only nccl "
                                   "reduces; unset LOCKSTEP_COMM or set it to nccl");
  }
  if (forced == "nccl") {
    return FailedPreconditionError(
        "LOCKSTEP_COMM=nccl: the trainer runs on device cpu; nccl reduces GPU memory only");
  }
  const bool hierarchy = SeveralRanksOnEveryHost(options);
  if (forced.empty() || forced == "auto") {
    return std::string(one_host ? "shm" : hierarchy ? "shm+gloo" : "gloo");
  }
  if (forced == "gloo") return std::string("gloo");
  if (forced == "shm+gloo") {
    if (!hierarchy) {
      return FailedPreconditionError(
          "LOCKSTEP_COMM=shm+gloo, but the members of this generation are not several hosts "
          "with the same number (more than one) of consecutive ranks each");
    }
    return std::string("shm+gloo");
  }
  // forced == "shm": every other value was answered above.
  if (!one_host) {
    return FailedPreconditionError(
        "LOCKSTEP_COMM=shm, but the members of this generation are not all on host " +
        options.host + "; shared memory needs every member on one host");
  }
  return std::string("shm");
}

StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(const CommunicatorOptions& options,
                                                           rendezvous::KeyValueStore& store) {
  LOCKSTEP_ASSIGN_OR_RETURN(std::string backend,
                            ChooseCommunicatorBackend(options, std::getenv("LOCKSTEP_COMM")));
  LOCKSTEP_LOG(INFO) << "communicator backend " << backend << " for " << options.size
                     << " member(s)"
                     << (backend == "shm"        ? " on one host"
                         : backend == "shm+gloo" ? " on several hosts, several on each"
                                                 : "");
  if (backend == "nccl") {
    if (options.cuda_stream == nullptr) {
      // The legacy default stream would not order the collectives after the trainer's kernels.
      return InvalidArgumentError("communicator nccl: no CUDA stream to follow (cuda_stream)");
    }
#ifdef LOCKSTEP_COMM_WITH_NCCL
    NcclCommunicatorOptions nccl;
    nccl.rank = options.rank;
    nccl.size = options.size;
    nccl.device = options.cuda_device;
    nccl.connect_timeout_ms = options.connect_timeout_ms;
    nccl.input_stream = options.cuda_stream;
    return CreateNcclCommunicator(nccl, store);
#else
    return FailedPreconditionError("communicator nccl: this build has no NCCL communicator");
#endif
  }
  if (backend == "shm") {
    ShmOptions shm;
    shm.rank = options.rank;
    shm.size = options.size;
    shm.job_name = options.job_name;
    shm.generation = options.generation;
    shm.connect_timeout_ms = options.connect_timeout_ms;
    return CreateShmCommunicator(shm, store);
  }
  if (backend == "shm+gloo") {
    HierarchicalOptions hierarchical;
    hierarchical.rank = options.rank;
    hierarchical.layout =
        ContiguousLayout(options.placement.host_count, options.placement.local_size);
    hierarchical.host = options.host;
    hierarchical.job_name = options.job_name;
    hierarchical.generation = options.generation;
    hierarchical.connect_timeout_ms = options.connect_timeout_ms;
    return CreateHierarchicalCommunicator(hierarchical, store);
  }
  GlooOptions gloo;
  gloo.rank = options.rank;
  gloo.size = options.size;
  gloo.listen_host = options.host;
  gloo.connect_timeout_ms = options.connect_timeout_ms;
  return CreateGlooCommunicator(gloo, store);
}

}  // namespace lockstep::comm
