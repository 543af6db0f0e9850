#include "worker/trainer/pipeline_communicators.h"

#include <string>
#include <vector>

#include "common/rendezvous/host_placement.h"
#include "worker/comm/prefixed_store.h"
#include "worker/trainer/trainer.h"

namespace lockstep::trainer {

StatusOr<PipelineCommunicators> ConnectPipeline(comm::Communicator& world,
                                                rendezvous::KeyValueStore& store,
                                                const comm::CommunicatorOptions& world_options,
                                                int stages, int64_t timeout_ms) {
  if (stages < 1 || world.size() % stages != 0) {
    // The rendezvous forms whole worlds for a pipeline job; another generation may.
    return UnavailableError("pipeline: a world of " + std::to_string(world.size()) +
                            " ranks is not a multiple of the pipeline's " +
                            std::to_string(stages) + " stages");
  }
  constexpr size_t kHostBytes = 256;  // a DNS name is at most 253 characters
  std::vector<char> mine(kHostBytes, '\0');
  world_options.host.copy(mine.data(), kHostBytes - 1);
  std::vector<char> gathered(kHostBytes * static_cast<size_t>(world.size()));
  LOCKSTEP_RETURN_IF_ERROR(world.AllGather(mine.data(), kHostBytes, gathered.data(), timeout_ms)
                               .WithContext("pipeline: all-gather of the ranks' hosts"));
  const PipelinePlace place = Trainer::PlaceInPipeline(world.rank(), stages);
  const int replicas = world.size() / stages;
  auto connect = [&](const std::vector<int>& members, int index, const std::string& name,
                     std::unique_ptr<rendezvous::KeyValueStore>* scoped)
      -> StatusOr<std::unique_ptr<comm::Communicator>> {
    std::vector<std::string> hosts;
    for (int rank : members) {
      hosts.emplace_back(&gathered[kHostBytes * static_cast<size_t>(rank)]);
    }
    comm::CommunicatorOptions options = world_options;
    options.rank = index;
    options.size = static_cast<int>(members.size());
    options.placement = rendezvous::PlaceOnHosts(hosts)[static_cast<size_t>(index)];
    options.job_name = world_options.job_name + "-" + name;
    *scoped = std::make_unique<comm::PrefixedStore>(store, "pipeline/" + name + "/");
    auto made = comm::CreateCommunicator(options, **scoped);
    if (!made.ok()) return made.status().WithContext("pipeline: the " + name + " communicator");
    return made;
  };
  std::vector<int> pipe_members, group_members;
  for (int s = 0; s < stages; ++s) pipe_members.push_back(place.replica * stages + s);
  for (int d = 0; d < replicas; ++d) group_members.push_back(d * stages + place.stage);
  PipelineCommunicators made;
  // Every rank connects its replica's first, then its stage group's: the two never wait on
  // each other.
  LOCKSTEP_ASSIGN_OR_RETURN(
      made.pipe, connect(pipe_members, place.stage, "replica-" + std::to_string(place.replica),
                         &made.pipe_store));
  LOCKSTEP_ASSIGN_OR_RETURN(
      made.group, connect(group_members, place.replica, "stage-" + std::to_string(place.stage),
                          &made.group_store));
  return made;
}

}  // namespace lockstep::trainer
