// The exec agent's Prometheus metrics.
#include "worker/agent/exec_metrics.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace lockstep::agent {
namespace {

TEST(ExecMetrics, ReportsProgressGenerationAndRestartsWithJobAndRank) {
  auto metrics = ExecMetrics::Create("default/ddp", 0);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  (*metrics)->SetGeneration(2, 1, 2);
  (*metrics)->AddRestarts(1);
  ProgressLine line;
  line.step = 40;
  line.samples = 2560;
  line.loss = 0.25;
  line.has_loss = true;
  rendezvous::ProgressReport report;
  (*metrics)->ObserveProgress(line, report);
  line.step = 30;  // resumed from an older checkpoint: the counter does not go back
  line.compute_seconds = 12;
  report.scaling_efficiency = 0.75;
  report.samples_per_second = 640;
  (*metrics)->ObserveProgress(line, report);
  const std::string text = (*metrics)->Scrape();
  EXPECT_NE(text.find("lockstep_train_steps_total{job=\"default/ddp\",rank=\"1\"} 40"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("lockstep_train_samples_total{job=\"default/ddp\",rank=\"1\"} 2560"),
            std::string::npos);
  EXPECT_NE(text.find("lockstep_train_loss{job=\"default/ddp\",rank=\"1\"} 0.25"),
            std::string::npos);
  EXPECT_NE(text.find("lockstep_scaling_efficiency{job=\"default/ddp\",rank=\"1\"} 0.75"),
            std::string::npos);
  EXPECT_NE(
      text.find("lockstep_train_samples_per_second{job=\"default/ddp\",rank=\"1\"} 640"),
      std::string::npos);
  EXPECT_NE(text.find("lockstep_world_size{job=\"default/ddp\"} 2"), std::string::npos);
  EXPECT_NE(text.find("lockstep_rendezvous_generation{job=\"default/ddp\"} 2"), std::string::npos);
  EXPECT_NE(text.find("lockstep_restarts_total{job=\"default/ddp\"} 1"), std::string::npos);
}

TEST(ExecMetrics, AProgramThatReportsNothingExportsNoTrainingSeries) {
  auto metrics = ExecMetrics::Create("default/quiet", 0);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  (*metrics)->SetGeneration(1, 0, 2);
  std::string text = (*metrics)->Scrape();
  EXPECT_NE(text.find("lockstep_world_size{job=\"default/quiet\"} 2"), std::string::npos) << text;
  for (const char* series :
       {"lockstep_train_steps_total{", "lockstep_train_samples_total{", "lockstep_train_loss{",
        "lockstep_scaling_efficiency{", "lockstep_train_samples_per_second{"}) {
    EXPECT_EQ(text.find(series), std::string::npos) << series << " before any report:\n" << text;
  }
  // Steps only: no loss, samples or efficiency series appear beside them.
  ProgressLine line;
  line.step = 5;
  (*metrics)->ObserveProgress(line, rendezvous::ProgressReport{});
  (*metrics)->SetGeneration(2, 1, 2);  // the series that exist move to the new rank
  text = (*metrics)->Scrape();
  EXPECT_NE(text.find("lockstep_train_steps_total{job=\"default/quiet\",rank=\"1\"} 5"),
            std::string::npos)
      << text;
  for (const char* series :
       {"lockstep_train_samples_total{", "lockstep_train_loss{", "lockstep_scaling_efficiency{"}) {
    EXPECT_EQ(text.find(series), std::string::npos) << series << ":\n" << text;
  }
}

TEST(ExecMetrics, BusyPortIsAnErrorNamingIt) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int port = ntohs(address.sin_port);
  auto metrics = ExecMetrics::Create("default/ddp", port);
  close(fd);
  ASSERT_FALSE(metrics.ok());
  EXPECT_NE(metrics.status().message().find(std::to_string(port)), std::string::npos)
      << metrics.status();
}

}  // namespace
}  // namespace lockstep::agent
