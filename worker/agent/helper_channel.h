// The channel between the exec agent and Lockstep's Python helper in the program it runs
// (python/lockstep/elastic.py): how a program that uses the helper's elastic entry point survives
// a peer's failure without exiting (in-place recovery, docs/exec.md).
//
//   LOCKSTEP_ASSIGN_OR_RETURN(HelperChannel::Pair pair, HelperChannel::Create());
//   options.inherit_fd = pair.program_fd;   // ChildProcess::Options; LOCKSTEP_AGENT_FD=<fd>
//   ... start the program, then pair.CloseProgramEnd() ...
//   pair.channel->SendAssignment(...);      // buffered until the helper reads it
//   for (const HelperMessage& m : pair.channel->Drain()) { ... }   // after a kWakeHelper
//
// Protocol. A socketpair (SOCK_STREAM) per program process; the program finds its end in the
// variable LOCKSTEP_AGENT_FD. Both sides write one JSON object per line (UTF-8, at most
// kMaxHelperLineBytes; a longer line closes the channel as a protocol error).
//   helper -> agent
//     {"type":"hello","protocol":1,"pid":P}  the program runs the elastic entry point: from now
//                                             on the agent recovers it in place instead of
//                                             stopping it when a generation ends.
//     {"type":"training","generation":G,"step":S}  the group of G is formed and the state in
//                                             sync (step S); training goes on.
//     {"type":"left","generation":G}          the program has destroyed G's process group (its
//                                             connections are closed) and waits for the next
//                                             assignment: it counts as stopped for G+1.
//     {"type":"awaiting","variable":V}        a program forked ahead of its place read V (one of
//                                             its identity's variables) before it reached the
//                                             elastic entry point; it waits to be ended
//                                             (python/lockstep/identity.py).
//   agent -> helper
//     {"type":"assign","generation":G,"rank":R,"world_size":W,"master_addr":A,
//      "master_port":P,"restart_count":C,"env":{"RANK":"R",...}}
//                                             form G's group (rank R of W; rank 0 serves the
//                                             store on A:P) and train; "env" holds the
//                                             variables a restarted command would get
//                                             (exec_environment.h), for the program's os.environ.
//     {"type":"ended","generation":G}        G is over (a member failed, left or joined): leave
//                                             it at the next step boundary or when its
//                                             collective fails, and say "left".
// An agent that hears nothing from the helper keeps today's behaviour (stop all, start all), so a
// program that does not use the helper never notices the channel.
//
// Thread safety: one reader thread per channel fills a queue and Wake()s the agent's loop
// (kWakeHelper); Send and Drain are for the agent's one thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/rendezvous/client.h"
#include "common/status.h"
#include "worker/agent/restart_protocol.h"

namespace lockstep::agent {

inline constexpr char kAgentFdEnv[] = "LOCKSTEP_AGENT_FD";
// Set to 1 in a warm spare: started ahead of need, it waits in the helper for an assignment.
inline constexpr char kWarmSpareEnv[] = "LOCKSTEP_WARM_SPARE";
inline constexpr size_t kMaxHelperLineBytes = 64 * 1024;
// Written to the wake pipe when a channel has news (a message, or its end).
inline constexpr unsigned char kWakeHelper = 0xF2;

struct HelperMessage {
  enum class Type { kHello, kTraining, kLeft, kAwaiting };
  Type type = Type::kHello;
  int64_t generation = 0;  // kTraining, kLeft
  int64_t step = 0;        // kTraining
  std::string variable;    // kAwaiting
};

// One helper message from one line; InvalidArgument naming what is wrong.
StatusOr<HelperMessage> ParseHelperMessage(const std::string& line);

// The agent's "assign" line for generation `a` under `plan`, with the command's generation
// variables (ExecVariables) as "env" (no trailing newline).
std::string EncodeAssignment(const rendezvous::Assignment& a, const GenerationPlan& plan,
                             const std::vector<std::pair<std::string, std::string>>& variables);
// The agent's "ended" line.
std::string EncodeGenerationEnded(int64_t generation);

class HelperChannel {
 public:
  struct Pair {
    std::unique_ptr<HelperChannel> channel;
    int program_fd = -1;  // the program's end, inherited across exec
    // Closes the agent's copy of the program's end once the program has it (after Start), so
    // the channel sees end-of-file when the program exits.
    void CloseProgramEnd();
  };
  static StatusOr<Pair> Create();
  ~HelperChannel();
  HelperChannel(const HelperChannel&) = delete;
  HelperChannel& operator=(const HelperChannel&) = delete;

  // Sends one line (a newline is added). Never blocks: a program that does not read its end
  // fills the socket buffer at worst with a few lines; a full buffer or a closed peer is an error.
  Status Send(const std::string& line);
  // The messages received since the last call, in order.
  std::vector<HelperMessage> Drain();
  // The program closed its end, or broke the protocol (closed() then says why in error()).
  bool closed() const { return closed_.load(); }
  std::string error() const;

 private:
  explicit HelperChannel(int fd);
  void ReadLoop();

  int fd_ = -1;
  std::atomic<bool> closed_{false};
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<HelperMessage> received_;  // guarded by mu_
  std::string error_;                    // guarded by mu_
  std::thread reader_;
};

}  // namespace lockstep::agent
