// ProbeRdmaDevices where libibverbs was not found at build time (rdma_devices.h): the worker
// still builds and runs; it says why it found nothing.
#include "worker/comm/rdma/rdma_devices.h"

namespace lockstep::rdma {

bool RdmaVerbsAvailable() { return false; }

StatusOr<std::vector<RdmaDevice>> ProbeRdmaDevices(const RdmaProbeOptions& options) {
  return UnavailableError(
      "libibverbs not available: this lockstep-worker was built without libibverbs-dev");
}

}  // namespace lockstep::rdma
