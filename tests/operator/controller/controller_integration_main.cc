// One kube-apiserver for the informer, leader election and event recorder tests.
#include <gtest/gtest.h>

#include "tests/operator/kube/kube_server.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new lockstep::op::testing::KubeServer);
  return RUN_ALL_TESTS();
}
