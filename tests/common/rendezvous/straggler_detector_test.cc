// Stragglers named from the members' reported pace: who, when, and who not.
#include "common/rendezvous/straggler_detector.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace lockstep::rendezvous {
namespace {

using std::chrono::milliseconds;

// Members beating every second for `seconds`, at one step each 10 ms of wall time; member m
// computes compute_ms[m] of those 10 ms (the rest it waits on the all-reduce), from `slow_from`
// seconds on for the slowed ones. Returns the names seen after each second.
struct PaceRun {
  StragglerDetector detector{StragglerOptions{}};
  std::map<std::string, Pace> paces;
  StragglerDetector::TimePoint now{};
  std::vector<std::string> changes;  // "t=7 +w2", "t=12 -w2"

  void Second(const std::map<std::string, double>& compute_ms_per_step) {
    now += milliseconds(1000);
    const int t = static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(
                                       now.time_since_epoch())
                                       .count());
    for (const auto& [member, compute_ms] : compute_ms_per_step) {
      Pace& pace = paces[member];
      pace.steps += 100;
      pace.compute_seconds += 100 * compute_ms / 1000;
      const std::vector<Straggler> before = detector.stragglers();
      if (!detector.Report(member, pace, now)) continue;
      for (const Straggler& s : detector.stragglers()) {
        bool was = false;
        for (const Straggler& b : before) was = was || b.member_id == s.member_id;
        if (!was) changes.push_back("t=" + std::to_string(t) + " +" + s.member_id);
      }
      for (const Straggler& b : before) {
        bool is = false;
        for (const Straggler& s : detector.stragglers()) is = is || b.member_id == s.member_id;
        if (!is) changes.push_back("t=" + std::to_string(t) + " -" + b.member_id);
      }
    }
  }
};

TEST(StragglerDetector, ARankComputingTwiceAsLongIsNamedAfterThreeWindows) {
  PaceRun run;
  for (int t = 0; t < 30; ++t) {
    run.Second({{"w0", 4}, {"w1", 4.4}, {"w2", t >= 10 ? 8 : 4.2}, {"w3", 3.8}});
  }
  // Windows close every 5 s (t=6, 11, 16, ...: the first report starts the first window). The
  // one closing at t=11 holds one slow second of 5 (1.18x the median); the next three are
  // wholly slow, the third of them closing at t=26: named 16 s after the slowdown began.
  EXPECT_EQ(run.changes, (std::vector<std::string>{"t=26 +w2"}));
  ASSERT_EQ(run.detector.stragglers().size(), 1u);
  EXPECT_NEAR(run.detector.stragglers()[0].ratio, 8 / 4.2, 0.05);
}

TEST(StragglerDetector, NoiseBelowTheRatioNamesNobody) {
  PaceRun run;
  // Every member in turn 40% slower than the others for a while: noise on a shared machine.
  for (int t = 0; t < 120; ++t) {
    const int slow = (t / 7) % 4;
    std::map<std::string, double> compute;
    for (int m = 0; m < 4; ++m) compute["w" + std::to_string(m)] = m == slow ? 5.6 : 4;
    run.Second(compute);
  }
  EXPECT_TRUE(run.changes.empty()) << run.changes[0];
}

TEST(StragglerDetector, AShortBurstIsNotAStraggler) {
  PaceRun run;
  for (int t = 0; t < 40; ++t) {
    // w1 slowed 3x for 8 s (a checkpoint persist beside it): two windows at most.
    run.Second({{"w0", 4}, {"w1", t >= 12 && t < 20 ? 12 : 4}, {"w2", 4}, {"w3", 4}});
  }
  EXPECT_TRUE(run.changes.empty()) << run.changes[0];
}

TEST(StragglerDetector, AStragglerThatRecoversIsNoLongerNamed) {
  PaceRun run;
  for (int t = 0; t < 50; ++t) {
    run.Second({{"w0", 4}, {"w1", 4}, {"w2", t < 30 ? 10 : 4}, {"w3", 4}});
  }
  EXPECT_EQ(run.changes, (std::vector<std::string>{"t=16 +w2", "t=36 -w2"}));
  EXPECT_TRUE(run.detector.stragglers().empty());
}

TEST(StragglerDetector, TwoMembersAreNeverJudged) {
  PaceRun run;
  for (int t = 0; t < 40; ++t) run.Second({{"w0", 4}, {"w1", 12}});
  EXPECT_TRUE(run.changes.empty()) << run.changes[0];
}

TEST(StragglerDetector, CountersThatGoBackStartTheWindowAnew) {
  StragglerOptions options;
  options.windows = 1;
  StragglerDetector detector(options);
  StragglerDetector::TimePoint now{};
  // a, b and c compute 4 ms a step; at t=7 c's counters start again from 0 (a new process in
  // the same generation), computing 10 ms a step. Its first window runs from that report, so it
  // is judged (and named) 5 s later, at t=12; a window still measured from before the reset
  // would only have closed once c passed its old step count.
  int named_at = -1;
  for (int t = 1; t <= 20 && named_at < 0; ++t) {
    now += milliseconds(1000);
    for (const char* id : {"a", "b"}) detector.Report(id, Pace{100 * t, 0.4 * t}, now);
    const Pace c = t < 7 ? Pace{100 * t, 0.4 * t} : Pace{100 * (t - 7), 1.0 * (t - 7)};
    if (detector.Report("c", c, now)) named_at = t;
  }
  EXPECT_EQ(named_at, 12);
  ASSERT_EQ(detector.stragglers().size(), 1u);
  EXPECT_NEAR(detector.stragglers()[0].ratio, 2.5, 0.01);
}

TEST(StragglerDetector, TooFewMembersToJudgeChangeNothing) {
  StragglerOptions options;
  options.windows = 1;
  StragglerDetector detector(options);
  StragglerDetector::TimePoint now{};
  // c computes 10 ms a step to the others' 4 and is named; then only c reports (a and b
  // completed): its windows cannot be judged, and its name stays.
  for (int t = 1; t <= 24; ++t) {
    now += milliseconds(1000);
    for (const char* id : {"a", "b", "c"}) {
      if (t > 12 && std::string(id) != "c") continue;
      const double compute_seconds = (std::string(id) == "c" ? 0.010 : 0.004) * 100 * t;
      detector.Report(id, Pace{100 * t, compute_seconds}, now);
    }
  }
  ASSERT_EQ(detector.stragglers().size(), 1u);
  EXPECT_EQ(detector.stragglers()[0].member_id, "c");
}

}  // namespace
}  // namespace lockstep::rendezvous
