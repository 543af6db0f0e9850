#include "worker/metrics.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace lockstep {
namespace {

TEST(WorkerMetricsTest, RegistersEveryContractMetricWithJobLabel) {
  auto metrics = WorkerMetrics::Create("default/fashion", 0);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  (*metrics)->SetGeneration(1, 0, 2);
  (*metrics)->ObserveStep({0.01, 0.002, 128, 1000, 0.003});
  (*metrics)->ObserveAllreduce(0.003, 1000, 2);
  const std::string text = (*metrics)->Scrape();
  for (const char* name :
       {"lockstep_train_steps_total", "lockstep_train_samples_total",
        "lockstep_train_samples_per_second", "lockstep_train_loss",
        "lockstep_step_duration_seconds", "lockstep_allreduce_duration_seconds",
        "lockstep_allreduce_bytes_total", "lockstep_allreduce_bus_bandwidth_bytes",
        "lockstep_comm_exposed_seconds", "lockstep_scaling_efficiency", "lockstep_world_size",
        "lockstep_rendezvous_generation", "lockstep_restarts_total",
        "lockstep_checkpoint_duration_seconds", "lockstep_checkpoint_last_step",
        "lockstep_checkpoint_last_success_timestamp_seconds"}) {
    EXPECT_NE(text.find(std::string("\n") + name), std::string::npos) << name;
  }
  EXPECT_NE(text.find("lockstep_train_samples_total{job=\"default/fashion\",rank=\"0\"} 128"),
            std::string::npos)
      << text;
}

TEST(WorkerMetricsTest, SkippedFp16StepsAreCounted) {
  auto metrics = WorkerMetrics::Create("default/fashion", 0);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_NE((*metrics)->Scrape().find("lockstep_train_skipped_steps_total{job=\"default/fashion\"} 0"),
            std::string::npos);
  (*metrics)->IncrementSkippedSteps();
  (*metrics)->IncrementSkippedSteps();
  const std::string text = (*metrics)->Scrape();
  EXPECT_NE(text.find("lockstep_train_skipped_steps_total{job=\"default/fashion\"} 2"),
            std::string::npos)
      << text;
}

TEST(WorkerMetricsTest, CountersCarryOverWhenTheRankChanges) {
  auto metrics = WorkerMetrics::Create("default/x", 0);
  ASSERT_TRUE(metrics.ok());
  (*metrics)->SetGeneration(1, 1, 2);
  (*metrics)->ObserveStep({0.01, 0.0, 64, 0, 0});
  (*metrics)->SetGeneration(2, 0, 1);
  (*metrics)->ObserveStep({0.01, 0.0, 64, 0, 0});
  const std::string text = (*metrics)->Scrape();
  EXPECT_NE(text.find("lockstep_train_samples_total{job=\"default/x\",rank=\"0\"} 128"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("lockstep_train_samples_total{job=\"default/x\",rank=\"1\"}"),
            std::string::npos);
}

TEST(WorkerMetricsTest, BusyPortIsAnErrorNamingThePort) {
  // Hold a port on all interfaces, then ask the metrics endpoint for it.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  auto metrics = WorkerMetrics::Create("default/x", port);
  close(fd);
  ASSERT_FALSE(metrics.ok());
  EXPECT_NE(metrics.status().message().find(std::to_string(port)), std::string::npos)
      << metrics.status();
}

}  // namespace
}  // namespace lockstep
