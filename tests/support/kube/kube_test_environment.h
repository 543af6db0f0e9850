// One real API server per gtest binary: a global Environment that starts KubeTestEnv before the
// first test and stops it after the last (start-up takes seconds; a first run builds it, minutes).
//
//   int main(int argc, char** argv) {
//     ::testing::InitGoogleTest(&argc, argv);
//     ::testing::AddGlobalTestEnvironment(new KubeTestEnvironment("crd_test"));
//     return RUN_ALL_TESTS();
//   }
//   ... in a test: ASSERT_TRUE(KubeTestEnvironment::kube) << KubeTestEnvironment::error;
#pragma once

#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <string>
#include <utility>

#include "tests/support/kube/kube_testenv.h"

namespace lockstep::testing {

class KubeTestEnvironment : public ::testing::Environment {
 public:
  // `binary`: named in the start-up line, so a slow first build is explained in the test log.
  explicit KubeTestEnvironment(std::string binary) : binary_(std::move(binary)) {}
  void SetUp() override {
    std::cerr << binary_ << ": starting kube-apiserver (a first run builds it: minutes)\n";
    kube = KubeTestEnv::Start({}, &error);
  }
  void TearDown() override { kube.reset(); }

  static inline std::unique_ptr<KubeTestEnv> kube;  // null when it could not start: see error
  static inline std::string error;

 private:
  std::string binary_;
};

}  // namespace lockstep::testing
