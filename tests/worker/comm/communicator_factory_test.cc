// Which backend the factory picks for a generation's members and LOCKSTEP_COMM, and that the
// picked backend is what CreateCommunicator builds.
#include "worker/comm/communicator_factory.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "tests/worker/comm/memory_store.h"

namespace lockstep::comm {
namespace {

// Rank 0's options among members on `hosts` (by rank), placed as the rendezvous places them.
CommunicatorOptions Members(const std::vector<std::string>& hosts) {
  CommunicatorOptions options;
  options.size = static_cast<int>(hosts.size());
  options.placement = rendezvous::PlaceOnHosts(hosts).at(0);
  options.host = hosts.at(0);
  options.job_name = "test/factory";
  options.connect_timeout_ms = 5000;
  return options;
}

TEST(CommunicatorFactoryTest, BackendFollowsMembersHostsAndLockstepComm) {
  struct Case {
    std::vector<std::string> hosts;
    const char* lockstep_comm;
    std::string expected;  // backend, or the error code's name
    bool cuda = false;     // the trainer's tensors are on a GPU
  };
  const std::vector<Case> cases = {
      {{"10.0.0.1", "10.0.0.1"}, nullptr, "shm"},
      {{"10.0.0.1", "10.0.0.1"}, "", "shm"},
      {{"10.0.0.1", "10.0.0.1"}, "auto", "shm"},
      {{"10.0.0.1"}, nullptr, "shm"},
      {{"10.0.0.1", "10.0.0.2"}, nullptr, "gloo"},
      {{"10.0.0.1", "10.0.0.2"}, "auto", "gloo"},
      {{"10.0.0.1", "10.0.0.1"}, "gloo", "gloo"},
      {{"10.0.0.1", "10.0.0.1"}, "shm", "shm"},
      {{"10.0.0.1", "10.0.0.2"}, "shm", "FAILED_PRECONDITION"},
      {{"10.0.0.1", "10.0.0.1"}, "tcp", "INVALID_ARGUMENT"},
      // device: cuda: NCCL wherever the members are; a CPU backend cannot reduce GPU memory.
      {{"10.0.0.1", "10.0.0.1"}, nullptr, "nccl", true},
      {{"10.0.0.1", "10.0.0.2"}, "auto", "nccl", true},
      {{"10.0.0.1", "10.0.0.2"}, "nccl", "nccl", true},
      {{"10.0.0.1", "10.0.0.1"}, "gloo", "FAILED_PRECONDITION", true},
      {{"10.0.0.1", "10.0.0.1"}, "shm", "FAILED_PRECONDITION", true},
      {{"10.0.0.1", "10.0.0.1"}, "tcp", "INVALID_ARGUMENT", true},
      {{"10.0.0.1", "10.0.0.1"}, "nccl", "FAILED_PRECONDITION"},
      // Pods of several ranks on several hosts: shared memory inside, Gloo between.
      {{"10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"}, nullptr, "shm+gloo"},
      // Equal groups that are not consecutive ranks: the service numbers pods so that they are
      // (proto/rendezvous.proto, "Pods"); anything else goes flat.
      {{"10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.2"}, "auto", "gloo"},
      {{"10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.2"}, "shm+gloo", "FAILED_PRECONDITION"},
      {{"10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"}, "gloo", "gloo"},
      {{"10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"}, "shm+gloo", "shm+gloo"},
      {{"10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"}, "shm", "FAILED_PRECONDITION"},
      {{"10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"}, nullptr, "nccl", true},
      // Unequal groups, or one rank per host: no hierarchy to use.
      {{"10.0.0.1", "10.0.0.1", "10.0.0.2"}, nullptr, "gloo"},
      {{"10.0.0.1", "10.0.0.1", "10.0.0.2"}, "shm+gloo", "FAILED_PRECONDITION"},
      {{"10.0.0.1", "10.0.0.2"}, "shm+gloo", "FAILED_PRECONDITION"},
      {{"10.0.0.1", "10.0.0.1"}, "shm+gloo", "FAILED_PRECONDITION"},
  };
  for (const Case& c : cases) {
    CommunicatorOptions options = Members(c.hosts);
    options.cuda = c.cuda;
    auto backend = ChooseCommunicatorBackend(options, c.lockstep_comm);
    const std::string got =
        backend.ok()                                                 ? *backend
        : backend.status().code() == StatusCode::kFailedPrecondition ? "FAILED_PRECONDITION"
        : backend.status().code() == StatusCode::kInvalidArgument    ? "INVALID_ARGUMENT"
                                                                     : backend.status().ToString();
    EXPECT_EQ(got, c.expected) << "hosts " << c.hosts.size() << " LOCKSTEP_COMM="
                               << (c.lockstep_comm ? c.lockstep_comm : "(unset)")
                               << (c.cuda ? " cuda" : " cpu");
  }
}

TEST(CommunicatorFactoryTest, CudaWithoutAStreamToFollowIsRefused) {
  CommunicatorOptions options = Members({"10.0.0.1"});
  options.cuda = true;  // and no cuda_stream
  testing::MemoryKeyValueStore store;
  auto communicator = CreateCommunicator(options, store);
  EXPECT_EQ(communicator.status().code(), StatusCode::kInvalidArgument) << communicator.status();
}

TEST(CommunicatorFactoryTest, MembersOnOneHostGetSharedMemoryUnlessGlooIsForced) {
  testing::MemoryKeyValueStore store;
  CommunicatorOptions options = Members({"127.0.0.1"});
  options.host = "127.0.0.1";
  unsetenv("LOCKSTEP_COMM");
  auto shm = CreateCommunicator(options, store);
  ASSERT_TRUE(shm.ok()) << shm.status();
  EXPECT_EQ((*shm)->backend(), "shm");
  setenv("LOCKSTEP_COMM", "gloo", 1);
  testing::MemoryKeyValueStore gloo_store;
  auto gloo = CreateCommunicator(options, gloo_store);
  unsetenv("LOCKSTEP_COMM");
  ASSERT_TRUE(gloo.ok()) << gloo.status();
  EXPECT_EQ((*gloo)->backend(), "gloo");
}

}  // namespace
}  // namespace lockstep::comm
