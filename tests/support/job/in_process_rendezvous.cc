#include "tests/support/job/in_process_rendezvous.h"

#include <gtest/gtest.h>

#include <utility>

#include "tests/support/process/poll_until.h"

namespace lockstep::testing {

InProcessRendezvous::InProcessRendezvous(const rendezvous::JobConfig& config,
                                         const std::string& listen_host)
    : config_(config), listen_host_(listen_host) {
  auto server = rendezvous::RendezvousServer::Start({listen_host_ + ":0", "", ""});
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return;
  server_ = std::move(server).value();
  const Status added = server_->AddJob(config_);
  EXPECT_TRUE(added.ok()) << added;
}

InProcessRendezvous::~InProcessRendezvous() {
  if (server_) server_->Shutdown(5000);
}

Environment InProcessRendezvous::MemberEnv(const std::string& pod) const {
  return {{"LOCKSTEP_RENDEZVOUS",
           listen_host_ + ":" + std::to_string(server_ ? server_->port() : 0)},
          {"LOCKSTEP_JOB", config_.job},
          {"LOCKSTEP_JOB_TOKEN", config_.token},
          {"LOCKSTEP_POD", pod},
          {"LOCKSTEP_HOST", "127.0.0.1"},
          {"LOCKSTEP_METRICS_PORT", "0"},
          {"LOCKSTEP_JOIN_TIMEOUT_MS", "60000"}};
}

rendezvous::JobSnapshot InProcessRendezvous::Snapshot() const {
  if (!server_) return {};
  auto snapshot = server_->Snapshot(config_.job);
  EXPECT_TRUE(snapshot.ok()) << snapshot.status();
  return snapshot.ok() ? *snapshot : rendezvous::JobSnapshot{};
}

bool InProcessRendezvous::WaitForStep(int64_t step, int64_t timeout_ms) const {
  if (!server_) return false;
  return PollUntil(
      [&] {
        auto snapshot = server_->Snapshot(config_.job);
        return snapshot.ok() && snapshot->progress.step >= step;
      },
      timeout_ms, 10);
}

void InProcessRendezvous::RemoveMember(const std::string& pod, const std::string& reason) {
  if (server_) server_->RemoveMember(config_.job, pod, reason);
}

}  // namespace lockstep::testing
