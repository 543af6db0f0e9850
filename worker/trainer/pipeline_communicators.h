// The communicators of a pipeline job's rank for one generation, besides the world's: its
// replica of the pipeline (the replica's stages as ranks 0..P-1: activations) and its stage's
// group (that stage of every replica, by replica: the gradients' all-reduce). Rank r is stage
// r % P of replica r / P (Trainer::PlaceInPipeline).
//
//   LOCKSTEP_ASSIGN_OR_RETURN(PipelineCommunicators pipeline,
//                             ConnectPipeline(*world, *store, world_options, stages, timeout));
//   trainer->SetPipelineCommunicators(pipeline.pipe.get(), pipeline.group.get());
#pragma once

#include <cstdint>
#include <memory>

#include "common/rendezvous/kv_store.h"
#include "common/status.h"
#include "worker/comm/communicator.h"
#include "worker/comm/communicator_factory.h"

namespace lockstep::trainer {

struct PipelineCommunicators {
  std::unique_ptr<rendezvous::KeyValueStore> pipe_store, group_store;  // outlive the bootstrap
  std::unique_ptr<comm::Communicator> pipe, group;
};

// Bootstraps both through the generation's `store`, each under a prefix of its own, with the
// backend CreateCommunicator picks for its members: their hosts are exchanged over `world`
// first, so that a replica on one host uses shared memory whatever the rest of the world does.
// Every rank of the world calls it; blocks at most about twice world_options.connect_timeout_ms.
// Errors: the world's all-gather's and the backends'.
StatusOr<PipelineCommunicators> ConnectPipeline(comm::Communicator& world,
                                                rendezvous::KeyValueStore& store,
                                                const comm::CommunicatorOptions& world_options,
                                                int stages, int64_t timeout_ms);

}  // namespace lockstep::trainer
