// A rendezvous service hosted in the test process for one job, as `lockstep run` hosts it: the
// test starts worker or agent processes against it (MemberEnv) and reads the job's state from it.
//
//   InProcessRendezvous rendezvous({.job = "default/digits", .token = kTestJobToken,
//                                   .min_members = 2, .max_members = 2});
//   ChildProcess worker(argv, rendezvous.MemberEnv("worker-0"), log_path);
//   ASSERT_TRUE(rendezvous.WaitForStep(20, 30000));
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/rendezvous/server.h"
#include "tests/support/process/child_process.h"

namespace lockstep::testing {

// The token of every job a test hosts.
inline constexpr char kTestJobToken[] = "integration-test-token";

class InProcessRendezvous {
 public:
  // Starts a server on a free port of `listen_host` (loopback, or the bridge of test hosts:
  // tests/support/netns) and registers `config` (its token: the member's LOCKSTEP_JOB_TOKEN).
  // Fails the test when either fails; the other calls then do nothing.
  explicit InProcessRendezvous(const rendezvous::JobConfig& config,
                               const std::string& listen_host = "127.0.0.1");
  // Shuts the server down (within 5 s).
  ~InProcessRendezvous();
  InProcessRendezvous(const InProcessRendezvous&) = delete;
  InProcessRendezvous& operator=(const InProcessRendezvous&) = delete;

  bool ok() const { return server_ != nullptr; }
  const std::string& job() const { return config_.job; }
  rendezvous::RendezvousServer& server() { return *server_; }

  // The environment that makes a lockstep-worker process member `pod` of the job: the service's
  // address, the job, its token, the member, loopback host, a free metrics port, a 60 s join
  // timeout.
  Environment MemberEnv(const std::string& pod) const;
  // The job's state now; an empty snapshot (and a test failure) when the server has none.
  rendezvous::JobSnapshot Snapshot() const;
  // Polls (every 10 ms, at most timeout_ms) until some member reported progress of `step`.
  bool WaitForStep(int64_t step, int64_t timeout_ms) const;
  // What `lockstep run` does when it sees a worker exit.
  void RemoveMember(const std::string& pod, const std::string& reason);

 private:
  rendezvous::JobConfig config_;
  std::string listen_host_;
  std::unique_ptr<rendezvous::RendezvousServer> server_;
};

}  // namespace lockstep::testing
