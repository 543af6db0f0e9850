// One process of the user's command under the exec agent, with the channel to Lockstep's Python
// helper in it (helper_channel.h): what the agent knows of the process's in-place recovery.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<SupervisedCommand> command,
//                             SupervisedCommand::Start(child_options));
//   command->Assign(assignment, plan, variables);   // a helper program forms the group
//   ... on kWakeHelper: command->Absorb(); ...
//   if (command->recoverable()) command->EndGeneration(g);   // instead of SIGTERM
//
// A program that never says hello is an ordinary command: recoverable() stays false and the
// agent stops and restarts it as before.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/rendezvous/client.h"
#include "common/status.h"
#include "worker/agent/child_process.h"
#include "worker/agent/helper_channel.h"
#include "worker/agent/restart_protocol.h"
#include "worker/agent/zygote.h"

namespace lockstep::agent {

class SupervisedCommand {
 public:
  // Starts the program with its end of a new helper channel (LOCKSTEP_AGENT_FD added to the
  // environment). A channel that cannot be made (no descriptors left) starts the program
  // without one, as an ordinary command.
  static StatusOr<std::unique_ptr<SupervisedCommand>> Start(ChildProcess::Options options);
  // The same, forked by `zygote` (zygote.h, which must be Ready()): a process whose imports are
  // done. Errors: the channel or the fork failed (the zygote is then no longer Usable()).
  static StatusOr<std::unique_ptr<SupervisedCommand>> Fork(Zygote& zygote,
                                                           const ChildProcess::Options& options);

  ChildProcess& process() { return *process_; }
  const ChildProcess& process() const { return *process_; }

  // The process, for stopping it as an ordinary command; this object is spent.
  std::unique_ptr<ChildProcess> TakeProcess() { return std::move(process_); }

  // Applies what the helper said since the last call.
  void Absorb();
  // The program runs the helper's elastic entry point and can be told of a generation's end:
  // the agent recovers it in place.
  bool recoverable() const { return elastic_ && channel_ && !channel_->closed(); }
  bool said_hello() const { return elastic_; }
  // The helper has left every generation it was assigned and waits for the next assignment.
  bool idle() const { return elastic_ && left_generation_ >= assigned_generation_; }
  // The helper formed generation g's group and trains.
  bool training_in(int64_t g) const { return training_generation_ >= g; }
  // Forked ahead of a place (ExecAgent::StartProgramAhead): it may take one only once it said
  // hello, and says which variable it read instead when it asked for its rank too early.
  void set_ahead_of_place() { ahead_of_place_ = true; }
  bool ahead_of_place() const { return ahead_of_place_; }
  const std::string& awaited_variable() const { return awaited_variable_; }

  // Sends generation a's assignment (buffered until the helper reads it).
  Status Assign(const rendezvous::Assignment& a, const GenerationPlan& plan,
                const std::vector<std::pair<std::string, std::string>>& variables);
  // Tells the helper that generation g is over.
  Status EndGeneration(int64_t g);

 private:
  std::unique_ptr<ChildProcess> process_;
  std::unique_ptr<HelperChannel> channel_;  // null: the program has no channel
  bool elastic_ = false;
  int64_t assigned_generation_ = 0;
  int64_t training_generation_ = 0;
  int64_t left_generation_ = 0;
  bool closed_logged_ = false;
  bool ahead_of_place_ = false;
  std::string awaited_variable_;
};

}  // namespace lockstep::agent
