// Expectations: a job waits for the creations and deletions it asked for, until observed or
// expired.
#include "operator/controller/expectations.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace lockstep::op::controller {
namespace {

TEST(ExpectationsTest, UnknownKeyIsSatisfied) {
  Expectations expectations;
  EXPECT_TRUE(expectations.Satisfied("default/job"));
}

TEST(ExpectationsTest, SatisfiedOnceEveryCreationAndDeletionWasObserved) {
  Expectations expectations;
  expectations.ExpectCreations("default/job", {"job-worker-0", "job-worker-1"});
  expectations.ExpectDeletions("default/job", {"uid-7"});
  EXPECT_FALSE(expectations.Satisfied("default/job"));
  expectations.CreationObserved("default/job", "job-worker-0");
  expectations.CreationObserved("default/job", "unrelated-pod");
  EXPECT_FALSE(expectations.Satisfied("default/job"));
  expectations.CreationObserved("default/job", "job-worker-1");
  EXPECT_FALSE(expectations.Satisfied("default/job"));  // the deletion is outstanding
  expectations.DeletionObserved("default/job", "uid-7");
  EXPECT_TRUE(expectations.Satisfied("default/job"));
  EXPECT_TRUE(expectations.Satisfied("default/other"));
}

TEST(ExpectationsTest, ForgetDropsWhatAJobWaitedFor) {
  Expectations expectations;
  expectations.ExpectCreations("default/job", {"a"});
  expectations.Forget("default/job");
  EXPECT_TRUE(expectations.Satisfied("default/job"));
}

TEST(ExpectationsTest, ExpectationsExpireAfterTheirTtl) {
  Expectations expectations(/*ttl_ms=*/50);
  expectations.ExpectCreations("default/job", {"lost-event-pod"});
  EXPECT_FALSE(expectations.Satisfied("default/job"));
  std::this_thread::sleep_for(std::chrono::milliseconds(80));  // the TTL itself is under test
  EXPECT_TRUE(expectations.Satisfied("default/job"));
  // A new expectation starts a new TTL.
  expectations.ExpectCreations("default/job", {"another"});
  EXPECT_FALSE(expectations.Satisfied("default/job"));
}

}  // namespace
}  // namespace lockstep::op::controller
