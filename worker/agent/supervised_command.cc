#include "worker/agent/supervised_command.h"

#include "common/logging.h"

namespace lockstep::agent {

StatusOr<std::unique_ptr<SupervisedCommand>> SupervisedCommand::Start(
    ChildProcess::Options options) {
  std::unique_ptr<SupervisedCommand> command(new SupervisedCommand());
  StatusOr<HelperChannel::Pair> pair = HelperChannel::Create();
  if (pair.ok()) {
    options.inherit_fd = pair->program_fd;
    options.env.push_back(std::string(kAgentFdEnv) + "=" + std::to_string(pair->program_fd));
  } else {
    LOCKSTEP_LOG(WARNING) << pair.status() << "; the command runs without in-place recovery";
  }
  StatusOr<std::unique_ptr<ChildProcess>> process = ChildProcess::Start(options);
  if (pair.ok()) {
    pair->CloseProgramEnd();
    command->channel_ = std::move(pair->channel);
  }
  if (!process.ok()) return process.status();
  command->process_ = std::move(*process);
  return command;
}

StatusOr<std::unique_ptr<SupervisedCommand>> SupervisedCommand::Fork(
    Zygote& zygote, const ChildProcess::Options& options) {
  LOCKSTEP_ASSIGN_OR_RETURN(HelperChannel::Pair pair, HelperChannel::Create());
  StatusOr<std::unique_ptr<ChildProcess>> process = zygote.Fork(options, pair.program_fd);
  pair.CloseProgramEnd();
  if (!process.ok()) return process.status();
  std::unique_ptr<SupervisedCommand> command(new SupervisedCommand());
  command->channel_ = std::move(pair.channel);
  command->process_ = std::move(*process);
  return command;
}

void SupervisedCommand::Absorb() {
  if (!channel_) return;
  for (const HelperMessage& message : channel_->Drain()) {
    switch (message.type) {
      case HelperMessage::Type::kHello:
        if (!elastic_) {
          LOCKSTEP_LOG(INFO) << "pid " << process_->pid()
                             << " runs Lockstep's elastic helper: in-place recovery";
        }
        elastic_ = true;
        break;
      case HelperMessage::Type::kTraining:
        training_generation_ = std::max(training_generation_, message.generation);
        break;
      case HelperMessage::Type::kLeft:
        left_generation_ = std::max(left_generation_, message.generation);
        break;
      case HelperMessage::Type::kAwaiting:
        if (awaited_variable_.empty()) awaited_variable_ = message.variable;
        break;
    }
  }
  if (channel_->closed() && elastic_ && !closed_logged_ && !channel_->error().empty()) {
    closed_logged_ = true;
    LOCKSTEP_LOG(WARNING) << "helper channel of pid " << process_->pid()
                          << " closed: " << channel_->error();
  }
}

Status SupervisedCommand::Assign(const rendezvous::Assignment& a, const GenerationPlan& plan,
                                 const std::vector<std::pair<std::string, std::string>>& variables) {
  if (!channel_) return FailedPreconditionError("the command has no helper channel");
  LOCKSTEP_RETURN_IF_ERROR(channel_->Send(EncodeAssignment(a, plan, variables)));
  assigned_generation_ = a.generation;
  return OkStatus();
}

Status SupervisedCommand::EndGeneration(int64_t g) {
  if (!channel_) return FailedPreconditionError("the command has no helper channel");
  return channel_->Send(EncodeGenerationEnded(g));
}

}  // namespace lockstep::agent
