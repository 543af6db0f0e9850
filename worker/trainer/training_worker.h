// TrainingWorker: one worker process's life in a job, written as a loop over rendezvous
// generations so that elasticity only has to extend it.
//
// One generation:
//   Join(state step) -> rank, world size            (blocks until the generation forms)
//   StartHeartbeat(on_generation_ended: abort the communicator)
//   build the Gloo communicator through the generation's key-value store
//   agree on the training state (the newest member broadcasts; training_state.h; when no member
//   holds state, rank 0 restores the newest valid checkpoint: training_checkpointer.h)
//   train until done, checkpointing every spec.checkpoint.intervalSteps in the background
// A collective error or the end of the generation (a member left or joined) drops the
// communicator, stops the heartbeat and joins the next generation, keeping the state in memory.
// When training is done: the final checkpoint is snapshotted, then barrier, evaluation (sharded
// over the ranks), parameter dump (rank 0, when asked), a bounded wait for the final checkpoint
// to persist, Leave(completed=true) with the final progress.
//
// Thread safety: Run is called by one thread; RequestStop and LeaveNow from any thread (the
// signal-handling thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "common/rendezvous/client.h"
#include "common/spec/training_job.h"
#include "common/status.h"
#include "worker/comm/communicator.h"
#include "worker/metrics.h"
#include "worker/trainer/trainer.h"
#include "worker/trainer/training_checkpointer.h"

namespace lockstep::trainer {

struct TrainingWorkerOptions {
  std::string job_name;                // namespace/name, for logs and metrics
  rendezvous::ClientOptions client;    // rendezvous address, job, token, member, host
  int64_t join_timeout_ms = 600000;    // how long one Join may wait for a generation
  int64_t connect_timeout_ms = 60000;  // full-mesh bootstrap of the communicator
  // Consecutive generations that may fail before the worker gives up (a member that keeps
  // failing to connect is broken, not unlucky).
  int max_consecutive_failed_generations = 20;
  std::string dump_params_path;  // LOCKSTEP_DUMP_PARAMS; rank 0 writes it at the end
  // Checkpoints (spec.checkpoint; none when its uri is empty) and their tunables.
  TrainingCheckpointerOptions checkpoint;
  // How long the end of training waits for the final checkpoint to persist before leaving.
  int64_t final_checkpoint_timeout_ms = 300000;
};

class TrainingWorker {
 public:
  TrainingWorker(TrainingWorkerOptions options, std::unique_ptr<Trainer> trainer,
                 WorkerMetrics* metrics);

  // Runs the job to the end: OK when training and evaluation completed and the worker left the
  // rendezvous; CANCELLED after RequestStop (having left with completed=false); another error
  // when the rendezvous or the communicators fail beyond retrying.
  Status Run();

  // Makes Run return CANCELLED promptly: sets the stop flag and aborts the collectives in flight.
  void RequestStop();
  // Leaves the rendezvous with completed=false right now (for a signal handler whose Run is
  // stuck in a blocking call). Idempotent with Run's own Leave.
  void LeaveNow();
  // True while Run waits in a rendezvous Join, which RequestStop cannot interrupt: a stopping
  // worker then leaves at once instead of waiting for its grace period (it holds no step that
  // leaving could lose).
  bool joining() const { return joining_.load(); }

  const Trainer& trainer() const { return *trainer_; }

 private:
  // Runs one generation; OK when the job is complete.
  Status RunGeneration(const rendezvous::Assignment& assignment, bool* completed);
  rendezvous::ProgressReport MakeReport(const TrainingProgress& progress) const;
  Status LeaveOnce(bool completed, const rendezvous::ProgressReport& report);

  // Aborts communicator_ and the pipeline's communicators; mu_ held.
  void AbortCommunicators(const std::string& reason);

  TrainingWorkerOptions options_;
  std::unique_ptr<Trainer> trainer_;
  WorkerMetrics* metrics_;
  std::unique_ptr<rendezvous::RendezvousClient> client_;
  std::unique_ptr<TrainingCheckpointer> checkpointer_;  // null without spec.checkpoint.uri
  std::atomic<bool> stop_{false};

  std::mutex mu_;  // guards the fields below (the heartbeat and signal threads read them)
  comm::Communicator* communicator_ = nullptr;
  // A pipeline job's: this rank's pipeline and stage group (aborted with communicator_).
  std::vector<comm::Communicator*> pipeline_communicators_;
  int64_t current_generation_ = -1;
  bool generation_ended_ = false;
  bool end_member_lost_ = false;  // why it ended: a member lost (abort) or joined (vote)
  // Set by the heartbeat thread when a member joined; read by the trainer at each step.
  std::atomic<bool> leave_requested_{false};
  bool left_by_vote_ = false;  // the last generation ended by the ranks' vote, not a failure
  std::string end_reason_;

  std::atomic<bool> joining_{false};
  std::mutex leave_mu_;  // serialises Leave between Run and LeaveNow; held across the RPC
  bool left_ = false;
};

}  // namespace lockstep::trainer
