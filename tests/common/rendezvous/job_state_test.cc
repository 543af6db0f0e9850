// JobState, the rendezvous state machine, driven by tables of events with a fake clock: no gRPC,
// no threads, no sleeps. Each row is one event and every action it produced, in order, written
// as text (see Render*). Rows that expect "" produced nothing.
//
// Events:  join W [step=N] [timeout=MS] [pod=P local=R]
//          beat W gG [step=N] [pace=STEPS/COMPUTE_MS] [via=STREAM] [resume=RANK/WORLD
//                    [pod=P local=R]]    open W gG (the stream opens, before its first beat)
//          drop W gG [via=STREAM]  (the stream closed)    leave W    complete W [step=N] [acc=X]
//          remove W    cancel W  (W's held join went away)    at MS  (the clock moves; Tick)
//          place P A/B/C  (pod P's place in the network, coarse to fine)
//          set gG K V    add gG K N    get gG K1,K2 [timeout=MS]    close    snapshot
// Actions: "W joins gG as R/N" (+ " pod I/P" when pods hold several ranks),
//          "W join fails CODE [REASON]", "W ends gG lost|joined", "W closed CODE",
//          "get#I = V1,V2", "get#I fails CODE", "wake @MS", "add = N", "add fails CODE",
//          and for `snapshot`: "gG active|idle [members] waiting [ids]".
#include "common/rendezvous/job_state.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::rendezvous {
namespace {

using std::chrono::milliseconds;

struct Row {
  std::string event;
  std::string actions;
};

JobConfig Config(int32_t min_members, int32_t max_members) {
  JobConfig config;
  config.job = "default/fashion";
  config.token = "t";
  config.min_members = min_members;
  config.max_members = max_members;
  config.last_call_ms = 1000;
  config.heartbeat_interval_ms = 100;
  config.heartbeat_timeout_ms = 500;
  return config;
}

// Feeds events to one JobState and renders what it asked for.
class Driver {
 public:
  explicit Driver(JobConfig config) : state_(std::move(config)) {}

  JobState& state() { return state_; }
  TimePoint now() const { return now_; }
  static TimePoint Start() { return TimePoint{} + std::chrono::hours(1); }

  // Runs every row; a mismatch names the row.
  void Run(const std::vector<Row>& rows) {
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_EQ(Apply(rows[i].event), rows[i].actions)
          << "row " << i << ": " << rows[i].event;
    }
  }

  std::string Apply(const std::string& event) {
    std::istringstream in(event);
    std::string verb, subject;
    in >> verb;
    std::vector<std::string> words;
    std::map<std::string, std::string> options;
    for (std::string word; in >> word;) {
      const size_t eq = word.find('=');
      if (eq == std::string::npos) {
        words.push_back(word);
      } else {
        options[word.substr(0, eq)] = word.substr(eq + 1);
      }
    }
    auto option = [&](const std::string& name, int64_t fallback) {
      auto it = options.find(name);
      return it == options.end() ? fallback : std::stoll(it->second);
    };
    auto generation = [&](size_t i) { return std::stoll(words.at(i).substr(1)); };
    Actions out;
    std::string result;
    if (verb == "join") {
      const CallId call = next_call_++;
      callers_[call] = words.at(0);
      held_[words.at(0)] = call;
      JoinArgs join;
      join.member_id = words.at(0);
      // Each join from a host of its own unless told (host=N: 10.0.0.N).
      join.host = "10.0.0." + std::to_string(option("host", static_cast<int64_t>(call)));
      join.wants_members = option("list", 0) != 0;
      join.state_step = option("step", -1);
      join.timeout_ms = option("timeout", 10000);
      join.pod = options.count("pod") ? options["pod"] : "";
      join.local_rank = static_cast<int32_t>(option("local", 0));
      state_.Join(call, join, now_, out);
    } else if (verb == "beat") {
      BeatArgs beat;
      beat.member_id = words.at(0);
      beat.generation = generation(1);
      if (options.count("step") != 0) {
        ProgressReport progress;
        progress.step = option("step", 0);
        beat.progress = progress;
      }
      if (options.count("pace") != 0) {  // pace=STEPS/COMPUTE_MS
        const std::string& pace = options["pace"];
        const size_t slash = pace.find('/');
        beat.pace =
            Pace{std::stoll(pace.substr(0, slash)), std::stod(pace.substr(slash + 1)) / 1000};
      }
      if (options.count("resume") != 0) {  // resume=RANK/WORLD
        const std::string& place = options["resume"];
        const size_t slash = place.find('/');
        beat.resume = ResumeArgs{static_cast<int32_t>(std::stoi(place.substr(0, slash))),
                                 static_cast<int32_t>(std::stoi(place.substr(slash + 1))),
                                 "10.0.0.9",
                                 options.count("pod") ? options["pod"] : "",
                                 static_cast<int32_t>(option("local", 0)),
                                 option("held", -1)};
      }
      state_.Beat(Stream(options.count("via") ? options["via"] : words.at(0)), beat, now_, out);
    } else if (verb == "open") {
      BeatArgs beat;
      beat.member_id = words.at(0);
      beat.generation = generation(1);
      beat.opening = true;
      state_.Beat(Stream(options.count("via") ? options["via"] : words.at(0)), beat, now_, out);
    } else if (verb == "drop") {
      state_.StreamClosed(Stream(options.count("via") ? options["via"] : words.at(0)), words.at(0),
                          generation(1), "stream broken", now_, out);
    } else if (verb == "leave" || verb == "complete") {
      LeaveArgs leave;
      leave.member_id = words.empty() ? "" : words[0];
      leave.completed = verb == "complete";
      if (options.count("step") != 0) {
        ProgressReport progress;
        progress.step = option("step", 0);
        progress.eval_accuracy = options.count("acc") ? std::stod(options["acc"]) : -1;
        progress.last_checkpoint_step = option("ckpt", -1);
        leave.progress = progress;
      }
      Status status = state_.Leave(leave, now_, out);
      if (!status.ok()) result = std::string("leave fails ") + StatusCodeName(status.code());
    } else if (verb == "remove") {
      state_.RemoveMember(words.at(0), "pod deleted", now_, out);
    } else if (verb == "place") {
      TopologyPath path;
      std::istringstream levels(words.at(1));
      for (std::string level; std::getline(levels, level, '/');) path.push_back(level);
      state_.SetPodTopology(words.at(0), path, now_, out);
    } else if (verb == "cancel") {
      state_.CancelJoin(held_.at(words.at(0)));
    } else if (verb == "at") {
      now_ = Start() + milliseconds(std::stoll(words.at(0)));
      state_.Tick(now_, out);
    } else if (verb == "set") {
      Status status = state_.StoreSet(generation(0), words.at(1), words.at(2), out);
      if (!status.ok()) result = std::string("set fails ") + StatusCodeName(status.code());
    } else if (verb == "add") {
      auto sum = state_.StoreAdd(generation(0), words.at(1), std::stoll(words.at(2)), out);
      result = sum.ok() ? "add = " + std::to_string(*sum)
                        : std::string("add fails ") + StatusCodeName(sum.status().code());
    } else if (verb == "get") {
      std::vector<std::string> keys;
      std::istringstream list(words.at(1));
      for (std::string key; std::getline(list, key, ',');) keys.push_back(key);
      const ByteRange range{static_cast<size_t>(option("offset", 0)),
                            static_cast<size_t>(option("length", 0))};
      state_.StoreGet(next_call_++, generation(0), keys, option("timeout", 0), now_, out, range);
    } else if (verb == "close") {
      state_.Close(UnavailableError("rendezvous service is shutting down"), now_, out);
    } else if (verb == "snapshot") {
      result = RenderSnapshot(state_.Snapshot());
    } else {
      ADD_FAILURE() << "unknown event " << event;
    }
    for (const auto& action : out) Append(result, Render(action));
    return result;
  }

  // The latest error message a join got (for the rows that check wording).
  const std::string& last_join_error() const { return last_join_error_; }
  const Assignment& last_assignment() const { return last_assignment_; }
  // The latest assignment of `member`, and the member list its answer carried (null: none).
  const Assignment& assignment(const std::string& member) const {
    return assignments_.at(member);
  }
  const std::vector<MemberInfo>* list(const std::string& member) const {
    return lists_.at(member).get();
  }
  JobSnapshot snapshot() const { return state_.Snapshot(); }

 private:
  static void Append(std::string& to, const std::string& what) {
    to += (to.empty() ? "" : "; ") + what;
  }

  StreamId Stream(const std::string& name) {
    auto [it, added] = streams_.emplace(name, streams_.size() + 1);
    if (added) stream_names_[it->second] = name;
    return it->second;
  }

  std::string Render(const Action& action) {
    if (const auto* answer = std::get_if<AnswerJoin>(&action)) {
      const std::string& who = callers_.at(answer->call);
      if (!answer->status.ok()) {
        last_join_error_ = answer->status.message();
        const std::string& reason = answer->status.reason();
        return who + " join fails " + StatusCodeName(answer->status.code()) +
               (reason.empty() ? "" : " " + reason);
      }
      last_assignment_ = answer->assignment;
      assignments_[who] = answer->assignment;
      lists_[who] = answer->members;
      const Assignment& a = answer->assignment;
      std::string pod;
      if (a.local_world_size > 1) {
        pod = " pod " + std::to_string(a.pod_rank) + "/" + std::to_string(a.pod_count);
        EXPECT_EQ(a.rank, a.pod_rank * a.local_world_size + a.local_rank) << who;
      }
      return who + " joins g" + std::to_string(a.generation) + " as " + std::to_string(a.rank) +
             "/" + std::to_string(a.world_size) + pod;
    }
    if (const auto* answer = std::get_if<AnswerStoreGet>(&action)) {
      const std::string id = "get#" + std::to_string(answer->call);
      if (!answer->status.ok()) return id + " fails " + StatusCodeName(answer->status.code());
      std::string values;
      for (const auto& value : answer->values) values += (values.empty() ? "" : ",") + value;
      return id + " = " + values;
    }
    if (const auto* end = std::get_if<EndStream>(&action)) {
      return stream_names_.at(end->stream) + " ends g" + std::to_string(end->generation) +
             (end->member_lost ? " lost" : " joined");
    }
    if (const auto* close = std::get_if<CloseStream>(&action)) {
      return stream_names_.at(close->stream) + " closed " + StatusCodeName(close->status.code());
    }
    const auto& wake = std::get<WakeAt>(action);
    return "wake @" +
           std::to_string(std::chrono::duration_cast<milliseconds>(wake.at - Start()).count());
  }

  static std::string RenderSnapshot(const JobSnapshot& s) {
    std::string members, waiting;
    for (const auto& m : s.members) members += (members.empty() ? "" : " ") + m.member_id;
    for (const auto& w : s.waiting_members) waiting += (waiting.empty() ? "" : " ") + w;
    return "g" + std::to_string(s.generation) + (s.generation_active ? " active" : " idle") +
           " [" + members + "] waiting [" + waiting + "]";
  }

  JobState state_;
  TimePoint now_ = Start();
  CallId next_call_ = 1;
  std::map<CallId, std::string> callers_;      // join call -> member
  std::map<std::string, CallId> held_;         // member -> its latest join call
  std::map<std::string, StreamId> streams_;    // name -> id
  std::map<StreamId, std::string> stream_names_;
  std::string last_join_error_;
  Assignment last_assignment_;
  std::map<std::string, Assignment> assignments_;
  std::map<std::string, std::shared_ptr<const std::vector<MemberInfo>>> lists_;
};

// ----------------------------------------------------------------------------------------------
// Forming generations

TEST(JobStateTest, FirstGenerationFormsWhenEveryMemberJoinedWithRanksInJoinOrder) {
  Driver job(Config(3, 3));
  job.Run({
      {"join w2", "wake @10000"},
      {"join w0", "wake @10000"},
      {"snapshot", "g0 idle [] waiting [w2 w0]"},
      {"join w1",
       "wake @10000; w2 joins g1 as 0/3; w0 joins g1 as 1/3; w1 joins g1 as 2/3; wake @501"},
      {"snapshot", "g1 active [w2 w0 w1] waiting []"},
  });
  EXPECT_EQ(job.last_assignment().first_host, "10.0.0.1");  // w2's
  EXPECT_EQ(job.last_assignment().host.host_count, 3);
  EXPECT_EQ(job.last_assignment().heartbeat_timeout_ms, 500);
}

TEST(JobStateTest, OnlyMembersThatAskForTheMemberListGetIt) {
  Driver job(Config(3, 3));
  job.Run({
      {"join w0 list=1", "wake @10000"},
      {"join w1", "wake @10000"},
      {"join w2 list=1",
       "wake @10000; w0 joins g1 as 0/3; w1 joins g1 as 1/3; w2 joins g1 as 2/3; wake @501"},
  });
  EXPECT_EQ(job.list("w1"), nullptr);
  ASSERT_NE(job.list("w0"), nullptr);
  EXPECT_EQ(job.list("w0"), job.list("w2")) << "one list shared by the answers of a formation";
  ASSERT_EQ(job.list("w0")->size(), 3u);
  EXPECT_EQ((*job.list("w0"))[1].member_id, "w1");
  EXPECT_EQ((*job.list("w0"))[1].host, "10.0.0.2");
}

// Members on shared hosts: each learns its host's index, its place on it and whether every host
// holds the same consecutive ranks (what a hierarchical all-reduce needs), without the list.
TEST(JobStateTest, EachMemberLearnsItsPlaceAmongTheHosts) {
  Driver job(Config(4, 4));
  job.Run({
      {"join w0 host=7", "wake @10000"},
      {"join w1 host=7", "wake @10000"},
      {"join w2 host=9", "wake @10000"},
      {"join w3 host=9",
       "wake @10000; w0 joins g1 as 0/4; w1 joins g1 as 1/4; w2 joins g1 as 2/4; "
       "w3 joins g1 as 3/4; wake @501"},
  });
  for (const std::string member : {"w0", "w1", "w2", "w3"}) {
    const Assignment& a = job.assignment(member);
    EXPECT_EQ(a.first_host, "10.0.0.7") << member;
    EXPECT_EQ(a.host.host_count, 2) << member;
    EXPECT_EQ(a.host.host_rank, a.rank / 2) << member;
    EXPECT_EQ(a.host.local_rank, a.rank % 2) << member;
    EXPECT_EQ(a.host.local_size, 2) << member;
    EXPECT_TRUE(a.host.contiguous) << member;
  }
}

TEST(JobStateTest, JoinWithoutMemberOrTimeoutIsRefused) {
  Driver job(Config(1, 1));
  job.Run({{"join w0 timeout=0", "w0 join fails INVALID_ARGUMENT"}});
}

TEST(JobStateTest, JoinFailsAtItsDeadlineNamingWhoIsPresent) {
  Driver job(Config(2, 2));
  job.Run({
      {"join w0 timeout=300", "wake @300"},
      {"at 299", ""},
      {"at 300", "w0 join fails DEADLINE_EXCEEDED NO_GENERATION_FORMED"},
      {"snapshot", "g0 idle [] waiting []"},
  });
  EXPECT_EQ(job.last_join_error(),
            "no generation formed within 300 ms: 1 of 2 members present (min 2, max 2)");
}

TEST(JobStateTest, ElasticJobFormsWithMinMembersOnceTheLastCallPasses) {
  Driver job(Config(2, 4));
  job.Run({
      {"join w0", "wake @10000"},
      {"join w1", "wake @10000; wake @1000"},
      {"at 999", ""},
      {"at 1000", "w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @1501"},
  });
}

TEST(JobStateTest, AJoinDuringTheLastCallExtendsIt) {
  Driver job(Config(2, 4));
  job.Run({
      {"join w0", "wake @10000"},
      {"join w1", "wake @10000; wake @1000"},
      {"at 600", ""},
      {"join w2", "wake @10600; wake @1600"},
      {"at 1000", ""},  // the first window closed, but an arrival came within it
      {"at 1600", "w0 joins g1 as 0/3; w1 joins g1 as 1/3; w2 joins g1 as 2/3; wake @2101"},
  });
}

TEST(JobStateTest, FirstGenerationWaitsForEveryInitialMemberWhenAsked) {
  JobConfig config = Config(1, 3);
  config.initial_members = 2;
  config.wait_for_initial_members = true;
  Driver job(config);
  job.Run({
      {"join w0", "wake @10000"},
      {"at 5000", ""},  // no last call: w1 is waited for
      {"join w1", "wake @15000; w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @5501"},
  });
}

TEST(JobStateTest, MaxMembersIsRespectedAndTheExtraJoinerTimesOutNamingTheFullGeneration) {
  Driver job(Config(1, 2));
  job.Run({
      {"join w0", "wake @10000; wake @1000"},
      {"join w1", "wake @10000; w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @501"},
      {"beat w0 g1", ""},
      {"beat w1 g1", ""},
      {"join w2 timeout=400", "wake @400"},  // the generation is full: it goes on
      {"beat w0 g1", ""},
      {"beat w1 g1", ""},
      {"at 400", "w2 join fails DEADLINE_EXCEEDED GENERATION_FULL"},
  });
  EXPECT_EQ(job.last_join_error(),
            "no generation formed within 400 ms: 1 of 3 members present (min 1, max 2); "
            "generation 1 is active and full");
}

TEST(JobStateTest, AMemberComputingMuchLongerThanItsPeersIsAStragglerOfItsGeneration) {
  JobConfig config = Config(4, 4);
  config.stragglers.windows = 2;
  config.stragglers.min_window_ms = 1000;
  Driver job(config);
  for (const char* member : {"w0", "w1", "w2", "w3"}) job.Apply(std::string("join ") + member);
  ASSERT_EQ(job.snapshot().world_size, 4);
  // Every 250 ms each member beats with its counters: 25 steps more, w2 computing 8 ms of each
  // step's 10, the others 4.
  auto beats = [&](int from_ms, int to_ms) {
    for (int t = from_ms; t <= to_ms; t += 250) {
      job.Apply("at " + std::to_string(t));
      for (int m = 0; m < 4; ++m) {
        const int steps = t / 10;
        const int compute_ms = steps * (m == 2 ? 8 : 4);
        job.Apply("beat w" + std::to_string(m) + " g1 pace=" + std::to_string(steps) + "/" +
                  std::to_string(compute_ms));
      }
    }
  };
  beats(0, 1500);  // one window each: not yet
  EXPECT_TRUE(job.snapshot().stragglers.empty());
  beats(1750, 3000);  // the second slow window in a row
  const JobSnapshot snapshot = job.snapshot();
  ASSERT_EQ(snapshot.stragglers.size(), 1u);
  EXPECT_EQ(snapshot.stragglers[0].member_id, "w2");
  EXPECT_EQ(snapshot.stragglers[0].rank, 2);
  EXPECT_NEAR(snapshot.stragglers[0].ratio, 2.0, 0.01);

  // A generation's stragglers are its own: the next one starts with none, and w2's windows
  // start anew in it.
  job.Run({{"drop w3 g1", "w0 ends g1 lost; w1 ends g1 lost; w2 ends g1 lost"}});
  for (const char* member : {"w0", "w1", "w2", "w3"}) job.Apply(std::string("join ") + member);
  ASSERT_EQ(job.snapshot().generation, 2);
  job.Apply("beat w2 g2 pace=400/3200");
  EXPECT_TRUE(job.snapshot().generation_active);
  EXPECT_TRUE(job.snapshot().stragglers.empty());
}

TEST(JobStateTest, ANewerJoinOfTheSameMemberReplacesTheOlderCall) {
  Driver job(Config(2, 2));
  job.Run({
      {"join w0", "wake @10000"},
      {"join w0", "w0 join fails ABORTED; wake @10000"},
      {"snapshot", "g0 idle [] waiting [w0]"},
      {"join w1", "wake @10000; w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @501"},
  });
}

TEST(JobStateTest, ACancelledJoinIsNotAdmitted) {
  Driver job(Config(1, 2));
  job.Run({
      {"join w0", "wake @10000; wake @1000"},
      {"cancel w0", ""},
      {"at 200", ""},
      {"join w1", "wake @10200; wake @1200"},
      {"at 1000", ""},
      {"at 1200", "w1 joins g1 as 0/1; wake @1701"},
  });
}

TEST(JobStateTest, RegistrationContinuesTheGenerationNumberingItIsGiven) {
  JobConfig config = Config(1, 1);
  config.first_generation = 7;
  Driver job(config);
  job.Run({
      {"snapshot", "g6 idle [] waiting []"},
      {"set g6 k v", "set fails FAILED_PRECONDITION"},
      {"join w0", "wake @10000; w0 joins g7 as 0/1; wake @501"},
      {"beat w0 g6", "w0 ends g6 lost"},  // a generation of the previous registration
      {"remove w0", ""},  // it had no stream to end
      {"join w0", "wake @10000; w0 joins g8 as 0/1; wake @501"},
  });
}

// ----------------------------------------------------------------------------------------------
// Resuming a generation another service formed (an operator's new leader)

// A registration whose status showed generation 4: first_generation 5.
JobConfig ResumingConfig(int32_t min_members, int32_t max_members) {
  JobConfig config = Config(min_members, max_members);
  config.first_generation = 5;
  return config;
}

TEST(JobStateResumeTest, AGenerationIsTakenUpOnceEveryRankResumedAndGoesOnAsIfFormedHere) {
  Driver job(ResumingConfig(1, 3));
  job.Run({
      {"open w0 g4", ""},  // its first beat says whether it resumes
      {"beat w0 g4 resume=0/3 step=100", "wake @500"},
      {"snapshot", "g4 idle [] waiting []"},
      {"open w2 g4", ""},
      {"beat w2 g4 resume=2/3", ""},
      {"beat w0 g4 step=101", ""},  // a resumer's later beats carry no place
      {"beat w1 g4 resume=1/3", "wake @501"},
      {"snapshot", "g4 active [w0 w1 w2] waiting []"},
      {"set g4 k v", ""},  // its store starts empty and serves it
      {"get g4 k", "get#1 = v"},
      {"drop w1 g4", "w0 ends g4 lost; w2 ends g4 lost"},
      {"join w0", "wake @10000; wake @1000"},
      {"join w2", "wake @10000; w0 joins g5 as 0/2; w2 joins g5 as 1/2; wake @501"},
  });
  EXPECT_EQ(job.snapshot().progress.step, 101);
}

TEST(JobStateResumeTest, TheSnapshotSaysAGenerationIsResumingUntilItIsTakenUp) {
  Driver job(ResumingConfig(1, 2));
  EXPECT_FALSE(job.snapshot().resuming);
  job.Apply("beat w0 g4 resume=0/2");
  EXPECT_TRUE(job.snapshot().resuming);
  job.Apply("beat w1 g4 resume=1/2");
  EXPECT_FALSE(job.snapshot().resuming);
  EXPECT_TRUE(job.snapshot().generation_active);
}

TEST(JobStateResumeTest, RanksThatDoNotAllResumeWithinTheTimeoutEndItAndTheNextIsNumberedPastIt) {
  JobConfig config = Config(1, 2);
  config.first_generation = 4;  // the status lagged: it showed generation 3
  Driver job(config);
  job.Run({
      {"beat w0 g4 resume=0/2", "wake @500"},
      {"at 499", ""},
      {"at 500", "w0 ends g4 lost"},
      {"join w0", "wake @10500; wake @1500"},
      {"at 1500", "w0 joins g5 as 0/1; wake @2001"},
  });
}

TEST(JobStateResumeTest, AResumeWaitsTheRegistrationsResumeWindowWhenItIsTheLonger) {
  // The operator's window: a heartbeat timeout plus one connection attempt that hung on the old
  // leader's address, so a rank that comes back that much after the first is still taken up.
  JobConfig config = ResumingConfig(1, 2);
  config.resume_window_ms = 2000;
  Driver job(config);
  job.Run({
      {"beat w0 g4 resume=0/2", "wake @2000"},
      {"at 1999", ""},
      {"beat w1 g4 resume=1/2", "wake @2500"},
      {"snapshot", "g4 active [w0 w1] waiting []"},
  });
}

TEST(JobStateResumeTest, PlacesThatDisagreeOrAWorldOutsideTheBoundsAreNotTakenUp) {
  Driver disagree(ResumingConfig(1, 3));
  disagree.Run({
      {"beat w0 g4 resume=0/2", "wake @500"},
      {"beat w1 g4 resume=0/2", "w1 ends g4 lost; w0 ends g4 lost"},
  });
  Driver worlds(ResumingConfig(1, 3));
  worlds.Run({
      {"beat w0 g4 resume=0/2", "wake @500"},
      {"beat w1 g4 resume=1/3", "w1 ends g4 lost; w0 ends g4 lost"},
  });
  Driver bounds(ResumingConfig(1, 2));
  bounds.Run({
      {"beat w0 g4 resume=0/3", "w0 ends g4 lost"},  // scaled down while the service was away
      {"snapshot", "g4 idle [] waiting []"},
  });
  Driver unplaced(ResumingConfig(1, 2));
  unplaced.Run({
      {"beat w0 g4 resume=0/2", "wake @500"},
      {"beat w1 g4", "w1 ends g4 lost; w0 ends g4 lost"},  // an older worker, or a stale one
  });
}

TEST(JobStateResumeTest, AResumerThatRejoinsBreaksItsStreamOrIsRemovedEndsTheResume) {
  for (const char* event : {"join w0", "drop w0 g4", "remove w0", "leave w0"}) {
    SCOPED_TRACE(event);
    Driver resuming(ResumingConfig(1, 3));
    resuming.Apply("beat w0 g4 resume=0/3");
    resuming.Apply("beat w1 g4 resume=1/3");
    const std::string out = resuming.Apply(event);
    EXPECT_NE(out.find("w1 ends g4 lost"), std::string::npos) << out;
    EXPECT_FALSE(resuming.snapshot().generation_active);
  }
}

TEST(JobStateResumeTest, AServiceThatFormedAGenerationAnswersAResumeAsAnyBeat) {
  Driver job(ResumingConfig(1, 1));
  job.Run({
      {"join w0", "wake @10000; w0 joins g5 as 0/1; wake @501"},
      {"beat w0 g5 resume=0/1", ""},        // a stream broken by the network, opened again
      {"beat w1 g4 resume=0/1", "w1 ends g4 lost"},  // an older generation: not current
  });
  Driver stale(ResumingConfig(1, 1));
  stale.Run({
      {"beat w0 g3 resume=0/1", "w0 ends g3 lost"},  // older than the status showed
  });
}

TEST(JobStateResumeTest, JoinsWaitOutTheResumeWindowThenFormAsUsual) {
  JobConfig config = ResumingConfig(1, 3);
  config.resume_window_ms = 500;
  Driver job(config);
  job.Run({
      {"join s0", "wake @10000; wake @500"},  // a standby, before the members resume
      {"at 500", "wake @1000"},               // nobody resumed: the usual last call
      {"at 1000", "s0 joins g5 as 0/1; wake @1501"},
  });
}

TEST(JobStateResumeTest, AFailedResumeIsOverJoinsFormAsUsualAndItsLateRanksRejoin) {
  JobConfig config = ResumingConfig(1, 2);
  config.resume_window_ms = 500;
  Driver job(config);
  job.Run({
      {"beat w0 g4 resume=0/2", "wake @500"},
      {"at 500", "w0 ends g4 lost"},
      {"beat w1 g4 resume=1/2", "w1 ends g4 lost"},  // too late: g4 is over here
      {"join w0", "wake @10500; wake @1500"},        // no second window: the usual last call
      {"join w1", "wake @10500; w0 joins g5 as 0/2; w1 joins g5 as 1/2; wake @1001"},
  });
}

TEST(JobStateResumeTest, MembersThatAllRejoinInsteadOfResumingAreNotHeld) {
  JobConfig config = ResumingConfig(2, 2);
  config.resume_window_ms = 500;
  Driver job(config);  // members of a release before Resume, or a generation that had ended
  job.Run({
      {"join w0", "wake @10000; wake @500"},
      {"join w1", "wake @10000; w0 joins g5 as 0/2; w1 joins g5 as 1/2; wake @501"},
  });
}

TEST(JobStateResumeTest, ANewcomerWithRoomHeldDuringTheResumeReformsTheTakenUpGeneration) {
  JobConfig config = ResumingConfig(1, 3);
  config.resume_window_ms = 500;
  Driver job(config);
  job.Run({
      {"join n0", "wake @10000; wake @500"},
      {"beat w0 g4 resume=0/2", "wake @500"},
      {"beat w1 g4 resume=1/2", "wake @501; w0 ends g4 joined; w1 ends g4 joined; wake @1000"},
      {"join w0", "wake @10000"},
      {"join w1", "wake @10000; w0 joins g5 as 0/3; w1 joins g5 as 1/3; n0 joins g5 as 2/3; "
                  "wake @501"},
  });
}

TEST(JobStateResumeTest, AStandbyHeldDuringTheResumeOfAFullGenerationStaysAStandby) {
  JobConfig config = ResumingConfig(1, 2);
  config.resume_window_ms = 500;
  Driver job(config);
  job.Run({
      {"join s0 timeout=300", "wake @300; wake @500"},
      {"beat w0 g4 resume=0/2", "wake @500"},
      {"beat w1 g4 resume=1/2", "wake @501"},
      {"at 300", "s0 join fails DEADLINE_EXCEEDED GENERATION_FULL"},
  });
}

TEST(JobStateResumeTest, ClosingClosesTheStreamsOfAResume) {
  Driver job(ResumingConfig(1, 3));
  job.Run({
      {"beat w0 g4 resume=0/2", "wake @500"},
      {"close", "w0 closed UNAVAILABLE"},
  });
}

// ----------------------------------------------------------------------------------------------
// Ending generations and re-forming

TEST(JobStateTest, ABrokenStreamEndsTheGenerationAndSurvivorsReformAtOnce) {
  Driver job(Config(1, 3));
  job.Run({
      {"join w0", "wake @10000; wake @1000"},
      {"join w1", "wake @10000"},
      {"join w2", "wake @10000; w0 joins g1 as 0/3; w1 joins g1 as 1/3; w2 joins g1 as 2/3; wake @501"},
      {"beat w0 g1", ""},
      {"beat w1 g1", ""},
      {"beat w2 g1", ""},
      {"drop w1 g1", "w0 ends g1 lost; w2 ends g1 lost"},
      {"join w2", "wake @10000"},
      // Every survivor is back: no last call.
      {"join w0", "wake @10000; w0 joins g2 as 0/2; w2 joins g2 as 1/2; wake @501"},
  });
}

TEST(JobStateTest, MissedHeartbeatsEndTheGenerationOneTimeoutAfterTheLastBeat) {
  Driver job(Config(1, 2));
  job.Run({
      {"join w0", "wake @10000; wake @1000"},
      {"join w1", "wake @10000; w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @501"},
      {"beat w0 g1", ""},
      {"beat w1 g1", ""},
      {"at 300", ""},
      {"beat w0 g1", ""},
      {"beat w1 g1", ""},  // w1's last
      {"at 501", "wake @801"},  // nobody silent for 500 ms: the next check is 500 ms after 300
      {"at 700", ""},
      {"beat w0 g1", ""},
      {"at 800", ""},
      {"at 801", "w0 ends g1 lost; w1 ends g1 lost"},  // w1's stream, if alive, learns it too
      {"snapshot", "g1 idle [w0 w1] waiting []"},
      {"join w0", "wake @10801; w0 joins g2 as 0/1; wake @1302"},  // w1 is no survivor
  });
}

TEST(JobStateTest, ASilenceWhileTheServiceItselfWasStalledIsNoEvidenceAgainstTheMembers) {
  Driver job(Config(1, 2));
  job.Run({
      {"join w0", "wake @10000; wake @1000"},
      {"join w1", "wake @10000; w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @501"},
      {"beat w0 g1", ""},
      {"beat w1 g1", ""},
      // The check due at 501 runs at 3000: the whole machine stood still for 2.5 s, and the
      // members' beats of that time are still unread. Those 2499 ms are not their silence.
      {"at 3000", "wake @3001"},
      {"beat w0 g1", ""},
      // w1's last beat counts as at 2499: silent 500 ms by 3000 + 1. That is evidence.
      {"at 3001", "w0 ends g1 lost; w1 ends g1 lost"},
  });
}

TEST(JobStateTest, AServiceLateAtEveryCheckStillFindsAHungMemberWithinTwoTimeouts) {
  Driver job(Config(1, 2));
  job.Run({
      {"join w0", "wake @10000; wake @1000"},
      {"join w1", "wake @10000; w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @501"},
      {"beat w0 g1", ""},
      {"beat w1 g1", ""},
      {"at 800", "wake @801"},  // 299 ms late: credited, w1 counts as beating at 299
      {"beat w0 g1", ""},
      {"at 1100", "w0 ends g1 lost; w1 ends g1 lost"},  // late again: no second credit
  });
}

TEST(JobStateTest, RemoveMemberEndsTheGenerationAtOnce) {
  Driver job(Config(1, 2));
  job.Run({
      {"join w0", "wake @10000; wake @1000"},
      {"join w1", "wake @10000; w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @501"},
      {"beat w0 g1", ""},
      {"remove w1", "w0 ends g1 lost"},
      {"remove w1", ""},  // already gone
  });
}

// A survivor that sees the loss first (its collective fails, it stops beating and rejoins) ends
// the generation before the launcher reports the dead member; the next generation then waits for
// the dead member, a survivor still, until RemoveMember says it is gone: it forms at once, not at
// the end of the last call.
TEST(JobStateTest, ARemovalAfterTheGenerationEndedFormsTheNextAtOnce) {
  Driver job(Config(1, 3));
  job.Run({
      {"join w0", "wake @10000; wake @1000"},
      {"join w1", "wake @10000"},
      {"join w2", "wake @10000; w0 joins g1 as 0/3; w1 joins g1 as 1/3; w2 joins g1 as 2/3; wake @501"},
      {"beat w0 g1", ""},
      {"beat w1 g1", ""},
      {"beat w2 g1", ""},
      {"drop w0 g1", "w1 ends g1 lost; w2 ends g1 lost"},
      {"join w0", "wake @10000"},  // no longer a survivor: its stream broke first
      {"join w2", "wake @10000"},  // w1 is still expected
      {"remove w1", "w2 joins g2 as 0/2; w0 joins g2 as 1/2; wake @501"},
  });
}

TEST(JobStateTest, ALateJoinerEndsTheGenerationWithoutLossAndTheNextIncludesEveryone) {
  Driver job(Config(1, 3));
  job.Run({
      {"join w0", "wake @10000; wake @1000"},
      {"join w1", "wake @10000"},
      {"at 1000", "w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @1501"},
      {"beat w0 g1", ""},
      {"beat w1 g1", ""},
      {"join w2", "w0 ends g1 joined; w1 ends g1 joined; wake @11000; wake @2000"},
      {"join w1", "wake @11000"},
      {"join w0", "wake @11000; w0 joins g2 as 0/3; w1 joins g2 as 1/3; w2 joins g2 as 2/3; wake @1501"},
  });
}

// Pipeline replicas of 2 pods: a generation holds whole replicas. A replica that lost nobody
// goes first and keeps its places; the lone survivor of the other waits for a partner, and its
// own re-joins end nothing; the replacement's join does, and the world is whole again.
TEST(JobStateTest, GenerationsHoldWholeGroupsOfPodsAndAWholeSurvivingGroupKeepsItsPlaces) {
  JobConfig config = Config(2, 4);
  config.pods_multiple = 2;
  Driver job(config);
  job.Run({
      {"join w0", "wake @10000"},
      {"join w1", "wake @10000; wake @1000"},
      {"join w2", "wake @10000"},
      {"join w3",
       "wake @10000; w0 joins g1 as 0/4; w1 joins g1 as 1/4; w2 joins g1 as 2/4; w3 joins g1 as "
       "3/4; wake @501"},
      {"beat w0 g1", ""},
      {"beat w1 g1", ""},
      {"beat w2 g1", ""},
      {"beat w3 g1", ""},
      {"drop w1 g1", "w0 ends g1 lost; w2 ends g1 lost; w3 ends g1 lost"},
      {"join w0", "wake @10000"},
      {"join w3", "wake @10000"},
      // The replica of w2 and w3 survived whole: it forms at once, in its places; w0 waits.
      {"join w2", "wake @10000; w2 joins g2 as 0/2; w3 joins g2 as 1/2; wake @501"},
      {"beat w2 g2", ""},
      {"beat w3 g2", ""},
      {"join w0", "w0 join fails ABORTED; wake @10000"},
      {"join w1", "w2 ends g2 joined; w3 ends g2 joined; wake @10000"},
      {"join w2", "wake @10000"},
      {"join w3",
       "wake @10000; w2 joins g3 as 0/4; w3 joins g3 as 1/4; w0 joins g3 as 2/4; w1 joins g3 as "
       "3/4; wake @501"},
  });
}

// A member that saw the loss first closes its stream and so counts as lost; it rejoins as a
// newcomer. Its group is still whole once it is back: the survivors, none of whose groups is
// whole without it, wait for it (the last call) rather than forming a generation in which a
// pipeline would miss a stage; it forms the moment the group is whole again.
TEST(JobStateTest, APodThatClosedItsStreamFirstIsWaitedForToMakeItsGroupWhole) {
  JobConfig config = Config(2, 4);
  config.pods_multiple = 2;
  Driver job(config);
  job.Run({
      {"join w0", "wake @10000"},
      {"join w3", "wake @10000; wake @1000"},
      {"join w1", "wake @10000"},
      {"join w2",
       "wake @10000; w0 joins g1 as 0/4; w3 joins g1 as 1/4; w1 joins g1 as 2/4; w2 joins g1 as "
       "3/4; wake @501"},
      {"beat w0 g1", ""},
      {"beat w3 g1", ""},
      {"beat w1 g1", ""},
      {"beat w2 g1", ""},
      // w1 dies; w0 notices first and closes its stream.
      {"drop w0 g1", "w3 ends g1 lost; w1 ends g1 lost; w2 ends g1 lost"},
      // The launcher reports w1's death.
      {"remove w1", ""},
      {"at 100", ""},
      {"join w3", "wake @10100"},
      // Every survivor is back, but neither group is whole: the last call, not a generation.
      {"join w2", "wake @10100; wake @1100"},
      {"join w0", "wake @10100; w0 joins g2 as 0/2; w3 joins g2 as 1/2; wake @601"},
  });
}

TEST(JobStateTest, AMemberJoiningAgainEndsItsGenerationEvenWhenFull) {
  Driver job(Config(2, 2));
  job.Run({
      {"join w0", "wake @10000"},
      {"join w1", "wake @10000; w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @501"},
      {"beat w1 g1", ""},
      {"join w0", "w1 ends g1 joined; wake @10000"},
      {"join w1", "wake @10000; w0 joins g2 as 0/2; w1 joins g2 as 1/2; wake @501"},
  });
}

TEST(JobStateTest, LeavingWithoutCompletingEndsTheGeneration) {
  Driver job(Config(1, 2));
  job.Run({
      {"join w0", "wake @10000; wake @1000"},
      {"join w1", "wake @10000; w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @501"},
      {"beat w0 g1", ""},
      {"leave w1", "w0 ends g1 lost"},
      {"leave", "leave fails INVALID_ARGUMENT"},
  });
}

TEST(JobStateTest, CompletingDoesNotEndTheGenerationAndClosesItToNewcomers) {
  Driver job(Config(1, 2));
  job.Run({
      {"join w0", "wake @10000; wake @1000"},
      {"join w1", "wake @10000; w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @501"},
      {"beat w0 g1", ""},
      {"beat w1 g1", ""},
      {"complete w0 step=100", ""},
      {"drop w0 g1", ""},  // finishing is not failing
      {"at 300", ""},
      {"beat w1 g1", ""},
      {"at 501", "wake @801"},  // w0, completed, is not expected to beat
      {"join w9", "w9 join fails FAILED_PRECONDITION JOB_COMPLETED"},
      {"snapshot", "g1 active [w0 w1] waiting []"},
  });
}

// A standby waits for a place in a full generation (max 2); when a member completes, the job is
// over for it: its join is answered at once, not at its deadline.
TEST(JobStateTest, AStandbyIsToldAtOnceWhenTheJobCompletes) {
  Driver job(Config(1, 2));
  job.Run({
      {"join w0", "wake @10000; wake @1000"},
      {"join w1", "wake @10000; w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @501"},
      {"join w2", "wake @10000"},  // the generation is full: w2 waits, ending nothing
      {"snapshot", "g1 active [w0 w1] waiting [w2]"},
      {"complete w0 step=100", "w2 join fails FAILED_PRECONDITION JOB_COMPLETED"},
      {"snapshot", "g1 active [w0 w1] waiting []"},
  });
}

// ----------------------------------------------------------------------------------------------
// Heartbeat streams

TEST(JobStateTest, ABeatRacingTheEndOfItsGenerationCarriesTheSameCause) {
  Driver job(Config(1, 3));
  job.Run({
      {"join w0", "wake @10000; wake @1000"},
      {"join w1", "wake @10000"},
      {"at 1000", "w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @1501"},
      {"join w2", "wake @11000; wake @2000"},  // nobody has a stream yet: nothing to end
      {"beat w0 g1", "w0 ends g1 joined"},  // ended by a join: not lost
      {"join w0", "wake @11000"},
      {"join w1", "wake @11000; w0 joins g2 as 0/3; w1 joins g2 as 1/3; w2 joins g2 as 2/3; wake @1501"},
      {"remove w2", ""},  // no streams yet
      {"beat w1 g2", "w1 ends g2 lost"},  // ended by a loss
      {"beat w1 g5", "w1 ends g5 lost"},  // never formed
  });
}

TEST(JobStateTest, ABeatFromOutsideTheGenerationIsToldToRejoin) {
  Driver job(Config(1, 1));
  job.Run({
      {"join w0", "wake @10000; w0 joins g1 as 0/1; wake @501"},
      {"beat w7 g1", "w7 ends g1 lost"},
  });
}

TEST(JobStateTest, ASecondStreamReplacesTheFirstWhoseClosingThenEndsNothing) {
  Driver job(Config(1, 1));
  job.Run({
      {"join w0", "wake @10000; w0 joins g1 as 0/1; wake @501"},
      {"beat w0 g1", ""},
      {"beat w0 g1 via=w0-second", "w0 closed ABORTED"},
      {"drop w0 g1", ""},
      {"snapshot", "g1 active [w0] waiting []"},
      {"drop w0 g1 via=w0-second", ""},  // the member's own stream: g1 ends (no other stream)
      {"snapshot", "g1 idle [w0] waiting []"},
  });
}

// ----------------------------------------------------------------------------------------------
// Progress and history

TEST(JobStateTest, HistoryRecordsLossesAndWhenTrainingResumes) {
  Driver job(Config(1, 2));
  job.Run({
      {"join w0 step=-1", "wake @10000; wake @1000"},
      {"join w1", "wake @10000; w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @501"},
      {"at 100", ""},
      {"beat w0 g1 step=5", ""},
      {"beat w1 g1 step=5", ""},
      {"at 200", ""},
      {"remove w1", "w0 ends g1 lost; w1 ends g1 lost"},
      {"at 250", ""},
      {"join w0 step=5", "wake @10250; w0 joins g2 as 0/1; wake @751"},
      {"at 300", ""},
      {"beat w0 g2 step=5", ""},  // the state it held: not training yet
      {"at 450", ""},
      {"beat w0 g2 step=6", ""},
  });
  const JobSnapshot snapshot = job.state().Snapshot();
  ASSERT_EQ(snapshot.history.size(), 2u);
  const double start = SecondsOf(Driver::Start());
  EXPECT_DOUBLE_EQ(snapshot.history[0].formed_at, start);
  EXPECT_DOUBLE_EQ(snapshot.history[0].training_at, start + 0.1);
  EXPECT_DOUBLE_EQ(snapshot.history[0].ended_at, start + 0.2);
  EXPECT_TRUE(snapshot.history[0].ended_by_loss);
  EXPECT_EQ(snapshot.history[1].formed_at_step, 5);
  EXPECT_DOUBLE_EQ(snapshot.history[1].training_at, start + 0.45);
  EXPECT_DOUBLE_EQ(snapshot.longest_recovery_seconds, 0.25);
  EXPECT_EQ(snapshot.generations_formed, 2);
  EXPECT_EQ(snapshot.progress.step, 6);
}

TEST(JobStateTest, TheLongestRecoverySpansGenerationsThatEndedBeforeTrainingAndIgnoresJoins) {
  JobConfig config = Config(1, 1);
  config.heartbeat_timeout_ms = 100000;  // the clock jumps: no member goes silent here
  Driver job(config);
  auto longest = [&] { return job.state().Snapshot().longest_recovery_seconds; };
  job.Apply("join w0");
  job.Apply("at 1000");
  job.Apply("beat w0 g1 step=1");
  EXPECT_EQ(longest(), 0);  // nobody lost yet
  job.Apply("at 5000");
  job.Apply("remove w0");  // lost at 5 s
  job.Apply("at 5100");
  job.Apply("join w0 step=1");
  job.Apply("at 5200");
  job.Apply("join w0 step=1");  // joining again ends g2 before it trained (no loss); g3 forms
  job.Apply("at 7000");
  job.Apply("beat w0 g3 step=2");
  EXPECT_DOUBLE_EQ(longest(), 2.0);  // from the loss, not from g2's end
  job.Apply("at 9000");
  job.Apply("remove w0");
  job.Apply("at 9100");
  job.Apply("join w0 step=2");
  job.Apply("at 9400");
  job.Apply("beat w0 g4 step=3");  // 0.4 s: shorter, the longest stays
  job.Apply("at 12000");
  job.Apply("remove w0");  // nothing trains after this loss: it does not count
  job.Apply("at 60000");
  const JobSnapshot snapshot = job.state().Snapshot();
  EXPECT_DOUBLE_EQ(snapshot.longest_recovery_seconds, 2.0);
  EXPECT_EQ(snapshot.generations_formed, 4);
}

// A crash-looping member forms a generation each time it comes back: the job keeps the latest
// records, while the count and the longest recovery still cover all of them.
TEST(JobStateTest, TenThousandGenerationsKeepTheLatestRecordsAndTheLongestRecovery) {
  JobConfig config = Config(1, 1);
  config.history_kept = 8;
  Driver job(config);
  int64_t at = 0;
  for (int g = 1; g <= 10000; ++g) {
    // Generation 5 trains again 3 s after the loss that ended generation 4; every other one
    // 10 ms after.
    at += g == 5 ? 3000 : 10;
    job.Apply("at " + std::to_string(at));
    job.Apply("join w0 step=" + std::to_string(g));
    job.Apply("beat w0 g" + std::to_string(g) + " step=" + std::to_string(g + 1));
    job.Apply("remove w0");
  }
  const JobSnapshot snapshot = job.state().Snapshot();
  EXPECT_EQ(snapshot.generations_formed, 10000);
  ASSERT_EQ(snapshot.history.size(), 8u);
  EXPECT_EQ(snapshot.history.front().generation, 9993);
  EXPECT_EQ(snapshot.history.back().generation, 10000);
  EXPECT_TRUE(snapshot.history.back().ended_by_loss);
  EXPECT_DOUBLE_EQ(snapshot.longest_recovery_seconds, 3.0);
  // A beat for a generation whose record is gone is still told to rejoin.
  EXPECT_EQ(job.Apply("beat w0 g3"), "w0 ends g3 lost");
}

TEST(JobStateTest, TheJobsProgressIsTheFurthestAnyMemberReported) {
  Driver job(Config(2, 2));
  job.Run({
      {"join w0", "wake @10000"},
      {"join w1", "wake @10000; w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @501"},
      {"beat w0 g1 step=9", ""},
      {"beat w1 g1 step=8", ""},
  });
  EXPECT_EQ(job.state().Snapshot().progress.step, 9);
}

TEST(JobStateTest, TheFirstCompletedReportIsFinalUnlessALaterOneAddsAnEvaluation) {
  Driver job(Config(3, 3));
  job.Run({
      {"join w0", "wake @10000"},
      {"join w1", "wake @10000"},
      {"join w2", "wake @10000; w0 joins g1 as 0/3; w1 joins g1 as 1/3; w2 joins g1 as 2/3; wake @501"},
      {"complete w1 step=100 ckpt=100", ""},
      {"complete w2 step=100", ""},            // no evaluation either: the first stays
      {"complete w0 step=100 acc=0.85", ""},   // adds the evaluation, keeps the checkpoint
  });
  const JobSnapshot snapshot = job.state().Snapshot();
  EXPECT_EQ(snapshot.completed_members, 3);
  EXPECT_DOUBLE_EQ(snapshot.final_progress.eval_accuracy, 0.85);
  EXPECT_EQ(snapshot.final_progress.last_checkpoint_step, 100);
}

// ----------------------------------------------------------------------------------------------
// The generation store

TEST(JobStateTest, StoreKeysLiveInTheirGenerationAndTheOneAfter) {
  Driver job(Config(1, 1));
  job.Run({
      {"set g1 k v", "set fails FAILED_PRECONDITION"},  // not formed
      {"join w0", "wake @10000; w0 joins g1 as 0/1; wake @501"},
      {"set g1 k v1", ""},
      {"add g1 n 2", "add = 2"},
      {"add g1 n 3", "add = 5"},
      {"add g1 k 1", "add fails INVALID_ARGUMENT"},
      {"get g1 k,n", "get#2 = v1,5"},
      {"get g2 k", "get#3 fails FAILED_PRECONDITION"},
      {"get g1 later timeout=200", "wake @200"},
      {"remove w0", ""},
      {"join w0", "wake @10000; w0 joins g2 as 0/1; wake @501"},
      {"get g1 k", "get#6 = v1"},  // g1 is the generation before: still readable
      {"remove w0", ""},
      {"join w0",
       "wake @10000; w0 joins g3 as 0/1; get#4 fails FAILED_PRECONDITION; wake @501"},
      {"get g1 k", "get#8 fails FAILED_PRECONDITION"},
  });
}

// One job's members cannot take the memory every job's rendezvous shares: past its limits a
// set, an add or a held get is refused, naming the limit, and what the job stored stays.
TEST(JobStateTest, AStorePastItsJobsLimitsRefusesMoreAndKeepsWhatItHolds) {
  JobConfig config = Config(1, 1);
  config.store_limits.max_keys = 3;
  config.store_limits.max_bytes = 3 * (StoreLimits::kKeyOverheadBytes + 2) + 4;
  config.store_limits.keys_per_rank = config.store_limits.waiters_per_rank = 0;
  config.store_limits.bytes_per_rank_pair = 0;
  Driver job(config);
  job.Run({
      {"join w0", "wake @10000; w0 joins g1 as 0/1; wake @501"},
      {"set g1 a 1", ""},
      {"set g1 b 22222", ""},               // 4 bytes more than a one-byte value
      {"set g1 c 33333", "set fails RESOURCE_EXHAUSTED"},  // bytes
      {"set g1 b 2", ""},                   // smaller: room again
      {"add g1 c 3", "add = 3"},
      {"add g1 d 4", "add fails RESOURCE_EXHAUSTED"},      // keys
      {"set g1 d 4", "set fails RESOURCE_EXHAUSTED"},
      {"set g1 a 11111111", "set fails RESOURCE_EXHAUSTED"},  // a larger value of a held key
      {"get g1 a,b,c", "get#2 = 1,2,3"},   // nothing was lost
      {"remove w0", ""},
      {"join w0", "wake @10000; w0 joins g2 as 0/1; wake @501"},
      {"remove w0", ""},
      // g1 is dropped when g3 forms: its keys and bytes no longer count.
      {"join w0", "wake @10000; w0 joins g3 as 0/1; wake @501"},
      {"set g3 a 1", ""},
      {"set g3 b 2", ""},
      {"set g3 c 3", ""},
  });
  Actions out;
  const Status refused = job.state().StoreSet(3, "d", "4", out);
  EXPECT_NE(refused.message().find("limit is 3"), std::string::npos) << refused.ToString();
  // A reason clients decide on, and what the operator shows in the job's StoreLimit condition:
  // every refusal of this registration counted, the last one's words. g1's four were refused by
  // g1's store, dropped since; the count is the job's.
  EXPECT_EQ(refused.reason(), kReasonStoreLimit);
  const JobSnapshot snapshot = job.state().Snapshot();
  EXPECT_EQ(snapshot.store_refusals, 5);
  EXPECT_EQ(snapshot.last_store_refusal, refused.message());
  // A key of any bytes is named as printable ASCII (the words reach the job's status, which
  // must be valid UTF-8), cut after 64 of them.
  const std::string binary = "k\xff\xc3\n" + std::string(100, 'x');
  const Status named = job.state().StoreSet(3, binary, "4", out);
  EXPECT_NE(named.message().find("key k\\xff\\xc3\\x0axxx"), std::string::npos)
      << named.message();
  EXPECT_NE(named.message().find("... (104 bytes)"), std::string::npos) << named.message();
}

// The limits follow the ranks a generation has, not the job's declared maximum: a job that
// declares 50,000 replicas and runs one gets one rank's allowance.
TEST(JobStateTest, AStoresLimitsFollowTheRanksThatFormedNotTheDeclaredMaximum) {
  JobConfig config = Config(1, 50000);
  config.store_limits.max_bytes = 1000;
  config.store_limits.bytes_per_rank_pair = 100;
  Driver job(config);
  job.Apply("join w0");
  job.Apply("at 1000");  // the last call: the generation forms with the one member there
  ASSERT_TRUE(job.state().Snapshot().generation_active);
  ASSERT_EQ(job.state().Snapshot().world_size, 1);
  const std::string big(1050, 'x');  // 1 + 1050 + 64 bytes: past 1000 + 100 x 1^2
  Actions out;
  EXPECT_EQ(job.state().StoreSet(1, "k", big, out).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(job.state().StoreSet(1, "k", std::string(900, 'x'), out).ok());
}

// A get that waits holds its keys: they count against the job's bytes until it is answered,
// cancelled or expired, so gets that time out and come again do not pile up.
TEST(GenerationStoresTest, HeldGetsCountTheirKeysUntilTheyGo) {
  StoreLimits limits;
  limits.max_bytes = 4096;
  GenerationStores stores(limits);
  Actions out;
  const TimePoint now = Driver::Start();
  const std::vector<std::string> keys = {std::string(500, 'a'), std::string(500, 'b')};
  stores.Get(1, 1, keys, 300, now, out);
  const size_t held = stores.bytes();
  EXPECT_GT(held, 2000u);  // both keys, twice
  stores.Get(2, 1, keys, 300, now, out);  // a second would pass 4096
  ASSERT_FALSE(out.empty());
  const auto* refused = std::get_if<AnswerStoreGet>(&out.back());
  ASSERT_NE(refused, nullptr);
  EXPECT_EQ(refused->status.code(), StatusCode::kResourceExhausted);
  stores.Cancel(1);
  EXPECT_EQ(stores.bytes(), 0u);
  for (int round = 0; round < 100; ++round) {  // expire, come again: nothing piles up
    stores.Get(10 + round, 1, keys, 300, now, out);
    stores.Expire(now + std::chrono::milliseconds(300), out);
    EXPECT_EQ(stores.waiters(), 0u);
    EXPECT_EQ(stores.bytes(), 0u);
  }
  limits.max_waiters = 1;
  stores.SetLimits(limits);
  stores.Get(7, 1, {"k"}, 300, now, out);
  stores.Get(8, 1, {"k"}, 300, now, out);  // a second held get passes max_waiters
  refused = std::get_if<AnswerStoreGet>(&out.back());
  ASSERT_NE(refused, nullptr);
  EXPECT_NE(refused->status.message().find("waiting gets, its limit is 1"), std::string::npos);
  EXPECT_TRUE(stores.Set(1, "k", "v", out).ok());  // answered: its bytes go too
  EXPECT_EQ(stores.waiters(), 0u);
  EXPECT_EQ(stores.bytes(), 1 + 1 + StoreLimits::kKeyOverheadBytes);
}

// An answer is bounded before it is built: a get that names a key a million times is refused.
TEST(JobStateTest, AStoreGetWhoseAnswerWouldPassItsBoundIsRefused) {
  JobConfig config = Config(1, 1);
  config.store_limits.max_answer_bytes = 10;
  Driver job(config);
  job.Run({
      {"join w0", "wake @10000; w0 joins g1 as 0/1; wake @501"},
      {"set g1 a 12345678", ""},
      {"get g1 a", "get#2 = 12345678"},
      {"get g1 a,a", "get#3 fails RESOURCE_EXHAUSTED"},
      {"get g1 a,a offset=0 length=4", "get#4 = 1234,1234"},
      {"get g1 b,b timeout=300", "wake @300"},
      {"set g1 b 123456", "get#5 fails RESOURCE_EXHAUSTED"},  // answered when the key came
  });
}

// The limits grow with the job: its bootstrap's keys and bytes grow with its ranks.
TEST(JobStateTest, AStoresLimitsGrowWithTheRanksTheJobMayHave) {
  StoreLimits limits;
  const StoreLimits small = limits.ScaledTo(4);
  const StoreLimits large = limits.ScaledTo(1000);
  EXPECT_EQ(small.max_bytes, limits.max_bytes + 16 * limits.bytes_per_rank_pair);
  EXPECT_GT(large.max_bytes, size_t{1000} * 1000 * 4 * 136);  // two meshes in each generation
  EXPECT_GT(large.max_keys, size_t{2} * 1000);                // a key per rank, twice
  EXPECT_GT(large.max_waiters, small.max_waiters);
}

TEST(JobStateTest, AStoreGetWaitsForItsKeysUntilItsDeadline) {
  Driver job(Config(1, 1));
  job.Run({
      {"join w0", "wake @10000; w0 joins g1 as 0/1; wake @501"},
      {"get g1 a,b timeout=300", "wake @300"},
      {"set g1 a 1", ""},
      {"set g1 b 2", "get#2 = 1,2"},
      {"get g1 c timeout=300", "wake @300"},
      {"get g1 c", "get#4 fails DEADLINE_EXCEEDED"},  // timeout 0: at once
      {"at 300", "get#3 fails DEADLINE_EXCEEDED"},
  });
}

TEST(JobStateTest, ARangedGetAnswersThoseBytesOfEveryValueOnceItsLastKeyArrives) {
  Driver job(Config(1, 1));
  job.Run({
      {"join w0", "wake @10000; w0 joins g1 as 0/1; wake @501"},
      {"get g1 a,b,a timeout=300 offset=2 length=3", "wake @300"},
      {"get g1 b timeout=300", "wake @300"},
      {"set g1 b 0123456", "get#3 = 0123456"},
      {"set g1 b xx", ""},  // present already: nobody waits for it any more
      {"set g1 a abcdefg", "get#2 = cde,,cde"},
      {"get g1 a offset=9 length=4", "get#4 = "},  // past the end: empty, not an error
  });
}

// ----------------------------------------------------------------------------------------------
// Closing

TEST(JobStateTest, ClosingAnswersEveryHeldCallAndRefusesWhatFollows) {
  Driver job(Config(1, 3));
  job.Run({
      {"join w0", "wake @10000; wake @1000"},
      {"join w1", "wake @10000"},
      {"at 1000", "w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @1501"},
      {"beat w0 g1", ""},
      {"get g1 k timeout=500", "wake @1500"},
      {"join w2 timeout=5000", "w0 ends g1 joined; wake @6000; wake @2000"},
      {"join w0", "wake @11000"},
      {"beat w1 g1", "w1 ends g1 joined"},
      {"close", "w2 join fails UNAVAILABLE; w0 join fails UNAVAILABLE; get#3 fails UNAVAILABLE"},
      {"join w1", "w1 join fails UNAVAILABLE"},
      {"beat w1 g1", "w1 closed UNAVAILABLE"},
      {"set g1 k v", "set fails UNAVAILABLE"},
      {"leave w1", "leave fails UNAVAILABLE"},
      {"at 6000", ""},
  });
}

TEST(JobStateTest, ClosingClosesTheStreamsOfTheActiveGeneration) {
  Driver job(Config(1, 1));
  job.Run({
      {"join w0", "wake @10000; w0 joins g1 as 0/1; wake @501"},
      {"beat w0 g1", ""},
      {"close", "w0 closed UNAVAILABLE"},
      {"snapshot", "g1 idle [w0] waiting []"},
  });
  EXPECT_EQ(job.state().Snapshot().history.back().end_reason,
            "rendezvous service is shutting down");
}

// ----------------------------------------------------------------------------------------------
// Pods of several ranks (ranks_per_pod 2): whole pods join, leave and count

JobConfig PodConfig(int32_t min_pods, int32_t max_pods) {
  JobConfig config = Config(min_pods, max_pods);
  config.ranks_per_pod = 2;
  return config;
}

// Pods a and b (min 1, max 2 pods), both complete, in generation 1: a0 a1 b0 b1 = ranks 0..3,
// streams open.
void FormTwoPods(Driver& job) {
  job.Run({
      {"join a0 pod=a local=0", "wake @10000"},
      {"join b1 pod=b local=1", "wake @10000"},
      {"join b0 pod=b local=0", "wake @10000; wake @1000"},  // one whole pod: the last call
      {"join a1 pod=a local=1",
       "wake @10000; a0 joins g1 as 0/4 pod 0/2; a1 joins g1 as 1/4 pod 0/2; "
       "b0 joins g1 as 2/4 pod 1/2; b1 joins g1 as 3/4 pod 1/2; wake @501"},
      {"beat a0 g1", ""},
      {"beat a1 g1", ""},
      {"beat b0 g1", ""},
      {"beat b1 g1", ""},
  });
}

TEST(JobStatePodsTest, WholePodsFormAGenerationWithContiguousRanksPodByPod) {
  Driver job(PodConfig(1, 2));
  FormTwoPods(job);
  const JobSnapshot formed = job.snapshot();
  ASSERT_EQ(formed.members.size(), 4u);
  EXPECT_EQ(formed.members[2].pod, "b");
  EXPECT_EQ(formed.members[2].local_rank, 0);
}

TEST(JobStatePodsTest, LosingOneRankTakesItsWholePodOut) {
  Driver job(PodConfig(1, 2));
  FormTwoPods(job);
  job.Run({
      {"drop a1 g1", "a0 ends g1 lost; b0 ends g1 lost; b1 ends g1 lost"},
      {"join b0 pod=b local=0", "wake @10000"},
      // Pod b is the only survivor: whole again, it re-forms at once without pod a.
      {"join b1 pod=b local=1", "wake @10000; b0 joins g2 as 0/2 pod 0/1; b1 joins g2 as 1/2 pod 0/1; wake @501"},
      {"snapshot", "g2 active [b0 b1] waiting []"},
  });
}

TEST(JobStatePodsTest, RemovingAPodEndsTheGenerationForAllItsRanks) {
  Driver job(PodConfig(1, 2));
  FormTwoPods(job);
  job.Run({
      {"remove b", "a0 ends g1 lost; a1 ends g1 lost; b0 ends g1 lost; b1 ends g1 lost"},
      {"join a1 pod=a local=1", "wake @10000"},
      {"join a0 pod=a local=0", "wake @10000; a0 joins g2 as 0/2 pod 0/1; a1 joins g2 as 1/2 pod 0/1; wake @501"},
  });
}

TEST(JobStatePodsTest, AnIncompletePodWaitsForTheNextGeneration) {
  Driver job(PodConfig(1, 2));
  job.Run({
      {"join a0 pod=a local=0", "wake @10000"},
      {"join a1 pod=a local=1", "wake @10000; wake @1000"},
      {"join b0 pod=b local=0", "wake @10000"},
      {"at 1000", "a0 joins g1 as 0/2 pod 0/1; a1 joins g1 as 1/2 pod 0/1; wake @1501"},
      {"snapshot", "g1 active [a0 a1] waiting [b0]"},
      {"beat a0 g1", ""},
      // b's second rank arrives: a newcomer pod while there is room ends the generation.
      {"join b1 pod=b local=1", "a0 ends g1 joined; wake @11000; wake @2000"},
      {"join a0 pod=a local=0", "wake @11000"},
      {"join a1 pod=a local=1",
       "wake @11000; a0 joins g2 as 0/4 pod 0/2; a1 joins g2 as 1/4 pod 0/2; "
       "b0 joins g2 as 2/4 pod 1/2; b1 joins g2 as 3/4 pod 1/2; wake @1501"},
  });
}

TEST(JobStatePodsTest, ALocalRankOutsideThePodIsRefusedAndAPlaceIsHeldOnce) {
  Driver job(PodConfig(1, 1));
  job.Run({
      {"join x pod=a local=2", "x join fails INVALID_ARGUMENT"},
      {"join a0 pod=a local=0", "wake @10000"},
      {"join a0-restarted pod=a local=0", "a0 join fails ABORTED; wake @10000"},
      {"join a1 pod=a local=1", "wake @10000; a0-restarted joins g1 as 0/2 pod 0/1; a1 joins g1 as 1/2 pod 0/1; wake @501"},
  });
}

TEST(JobStatePodsTest, AJoinTimesOutNamingCompletePods) {
  Driver job(PodConfig(2, 2));
  job.Run({
      {"join a0 pod=a local=0 timeout=100", "wake @100"},
      {"at 100", "a0 join fails DEADLINE_EXCEEDED NO_GENERATION_FORMED"},
  });
  EXPECT_EQ(job.last_join_error(),
            "no generation formed within 100 ms: 0 of 2 pods complete (1 members present, 2 ranks "
            "per pod; min 2, max 2 pods)");
}


// ----------------------------------------------------------------------------------------------
// Ranks that follow the network (order_by_topology): pods numbered rack by rack

JobConfig TopologyConfig(int32_t min_members, int32_t max_members) {
  JobConfig config = Config(min_members, max_members);
  config.order_by_topology = true;
  return config;
}

// w0..w3 placed in two racks interleaved (w0, w2 in r1; w1, w3 in r2), then w0..w2 joined in
// order; w3's join, the last, forms the generation.
const std::vector<Row> kInterleavedRacks = {
    {"place w0 z/r1/n0", ""}, {"place w1 z/r2/n1", ""}, {"place w2 z/r1/n2", ""},
    {"place w3 z/r2/n3", ""}, {"join w0", "wake @10000"},  {"join w1", "wake @10000"},
    {"join w2", "wake @10000"},
};

TEST(JobStateTopologyTest, PodsAreNumberedRackByRackWhateverOrderTheyJoinedIn) {
  Driver job(TopologyConfig(4, 4));
  job.Run(kInterleavedRacks);
  job.Run({
      {"join w3",
       "wake @10000; w0 joins g1 as 0/4; w2 joins g1 as 1/4; w1 joins g1 as 2/4; "
       "w3 joins g1 as 3/4; wake @501"},
  });
}

TEST(JobStateTopologyTest, WithoutTopologyOrderingPlacesChangeNothing) {
  Driver job(Config(4, 4));
  job.Run(kInterleavedRacks);
  job.Run({
      {"join w3",
       "wake @10000; w0 joins g1 as 0/4; w1 joins g1 as 1/4; w2 joins g1 as 2/4; "
       "w3 joins g1 as 3/4; wake @501"},
  });
}

// Everyone has joined but one pod's place is not known yet: the generation waits for it as for
// a late joiner, and forms the moment it comes.
TEST(JobStateTopologyTest, AGenerationWaitsForAPlaceNotYetKnownAndFormsWhenItComes) {
  Driver job(TopologyConfig(2, 2));
  job.Run({
      {"place w0 r2", ""},
      {"join w0", "wake @10000"},
      {"join w1", "wake @10000; wake @1000"},
      {"at 400", ""},
      {"place w1 r1", "w0 joins g1 as 0/2; w1 joins g1 as 1/2; wake @901"},
  });
}

// A place that never comes delays the generation by the last call at most; the pod without one
// is a group of its own.
TEST(JobStateTopologyTest, APlaceThatNeverComesDelaysTheGenerationByTheLastCallAtMost) {
  Driver job(TopologyConfig(3, 3));
  job.Run({
      {"place w0 r1", ""},
      {"place w2 r1", ""},
      {"join w0", "wake @10000"},
      {"join w1", "wake @10000"},
      {"join w2", "wake @10000; wake @1000"},
      {"at 1000", "w0 joins g1 as 0/3; w2 joins g1 as 1/3; w1 joins g1 as 2/3; wake @1501"},
  });
}

// After a loss the survivors keep their order and a replacement joins its rack's group; a
// removed pod's place is forgotten (its replacement may land elsewhere).
TEST(JobStateTopologyTest, ReformationsKeepTheRackOrderAndPlaceAReplacementInItsRack) {
  Driver job(TopologyConfig(2, 4));
  job.Run({
      {"place w0 z/r1", ""},
      {"place w1 z/r2", ""},
      {"place w2 z/r1", ""},
      {"place w3 z/r2", ""},
      {"join w0", "wake @10000"},
      {"join w1", "wake @10000; wake @1000"},
      {"join w2", "wake @10000"},
      {"join w3",
       "wake @10000; w0 joins g1 as 0/4; w2 joins g1 as 1/4; w1 joins g1 as 2/4; "
       "w3 joins g1 as 3/4; wake @501"},
      {"beat w0 g1", ""},
      {"beat w1 g1", ""},
      {"beat w2 g1", ""},
      {"beat w3 g1", ""},
      {"remove w0", "w0 ends g1 lost; w2 ends g1 lost; w1 ends g1 lost; w3 ends g1 lost"},
      {"join w3", "wake @10000"},
      {"join w2", "wake @10000"},
      {"join w1",
       "wake @10000; w2 joins g2 as 0/3; w1 joins g2 as 1/3; w3 joins g2 as 2/3; wake @501"},
      {"beat w1 g2", ""},
      {"beat w2 g2", ""},
      {"beat w3 g2", ""},
      // The replacement (the same pod name) joins last; the removed pod's place went with it,
      // so the generation waits for the replacement's, which puts it in rack r1 beside w2.
      {"join w0", "w2 ends g2 joined; w1 ends g2 joined; w3 ends g2 joined; wake @10000"},
      {"join w2", "wake @10000"},
      {"join w1", "wake @10000"},
      {"join w3", "wake @10000"},
      {"place w0 z/r1",
       "w2 joins g3 as 0/4; w0 joins g3 as 1/4; w1 joins g3 as 2/4; w3 joins g3 as 3/4; "
       "wake @501"},
  });
}

// Pods of several ranks: whole pods are ordered, their local ranks stay contiguous.
TEST(JobStateTopologyTest, APodsRanksStayContiguousWhenPodsAreOrdered) {
  JobConfig config = TopologyConfig(3, 3);
  config.ranks_per_pod = 2;
  Driver job(config);
  job.Run({
      {"place a r1", ""},
      {"place b r2", ""},
      {"place c r1", ""},
      {"join a0 pod=a local=0", "wake @10000"},
      {"join a1 pod=a local=1", "wake @10000"},
      {"join b0 pod=b local=0", "wake @10000"},
      {"join b1 pod=b local=1", "wake @10000"},
      {"join c1 pod=c local=1", "wake @10000"},
      {"join c0 pod=c local=0",
       "wake @10000; a0 joins g1 as 0/6 pod 0/3; a1 joins g1 as 1/6 pod 0/3; "
       "c0 joins g1 as 2/6 pod 1/3; c1 joins g1 as 3/6 pod 1/3; b0 joins g1 as 4/6 pod 2/3; "
       "b1 joins g1 as 5/6 pod 2/3; wake @501"},
  });
}

}  // namespace
}  // namespace lockstep::rendezvous
