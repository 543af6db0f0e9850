// RendezvousServiceAddress: what workers dial when the operator hands them its rendezvous
// Service's cluster IP (--rendezvous-service).
#include "operator/rendezvous_address.h"

#include <gtest/gtest.h>

#include <deque>
#include <nlohmann/json.hpp>

namespace lockstep::op {
namespace {

using json = nlohmann::json;

// Answers GETs of the one Service from a script of replies, one per call (the last repeats).
class ScriptedClient : public kube::KubeClient {
 public:
  explicit ScriptedClient(std::deque<StatusOr<json>> replies) : replies_(std::move(replies)) {}
  StatusOr<json> Get(const kube::Resource& resource, const std::string& ns,
                     const std::string& name, const std::string&) override {
    EXPECT_EQ(resource.plural, "services");
    EXPECT_EQ(ns + "/" + name, "lockstep-system/lockstep-rendezvous");
    ++gets;
    StatusOr<json> reply = replies_.front();
    if (replies_.size() > 1) replies_.pop_front();
    return reply;
  }
  StatusOr<kube::ListResult> List(const kube::Resource&, const std::string&,
                                  const kube::ListOptions&) override {
    return UnimplementedError("list");
  }
  Status Watch(const kube::Resource&, const std::string&, const kube::WatchOptions&,
               const std::function<bool(const kube::WatchEvent&)>&,
               const std::atomic<bool>*) override {
    return UnimplementedError("watch");
  }
  StatusOr<json> Create(const kube::Resource&, const std::string&, const json&) override {
    return UnimplementedError("create");
  }
  StatusOr<json> Update(const kube::Resource&, const std::string&, const json&,
                        const std::string&) override {
    return UnimplementedError("update");
  }
  StatusOr<json> Patch(const kube::Resource&, const std::string&, const std::string&,
                       kube::PatchType, const json&, const std::string&) override {
    return UnimplementedError("patch");
  }
  Status Delete(const kube::Resource&, const std::string&, const std::string&,
                const kube::DeleteOptions&) override {
    return UnimplementedError("delete");
  }
  int64_t requests_sent() const override { return gets; }

  int64_t gets = 0;

 private:
  std::deque<StatusOr<json>> replies_;
};

json Service(const std::string& ip, const json& ports) {
  return {{"spec", {{"clusterIP", ip}, {"ports", ports}}}};
}

StatusOr<std::string> Address(ScriptedClient& client, int64_t timeout_ms = 5000) {
  return RendezvousServiceAddress(&client, "lockstep-system", "lockstep-rendezvous", timeout_ms);
}

TEST(RendezvousServiceAddressTest, TheClusterIpAndThePortNamedRendezvous) {
  ScriptedClient client({Service("10.96.0.42", json::array({{{"name", "metrics"}, {"port", 8080}},
                                                            {{"name", "grpc-rendezvous"},
                                                             {"port", 7443}}}))});
  EXPECT_EQ(Address(client).value(), "10.96.0.42:7443");
}

TEST(RendezvousServiceAddressTest, TheOnlyPortWhateverItsNameAndIpv6InBrackets) {
  ScriptedClient client({Service("fd00::1", json::array({{{"port", 9000}}}))});
  EXPECT_EQ(Address(client).value(), "[fd00::1]:9000");
}

TEST(RendezvousServiceAddressTest, AMissingServiceIsWaitedForUntilItHasAnAddress) {
  ScriptedClient client({NotFoundError("services \"lockstep-rendezvous\" not found"),
                         Service("", json::array({{{"port", 7443}}})),
                         Service("10.96.0.7", json::array({{{"port", 7443}}}))});
  EXPECT_EQ(Address(client).value(), "10.96.0.7:7443");
  EXPECT_EQ(client.gets, 3);
}

TEST(RendezvousServiceAddressTest, AHeadlessServiceOrAmbiguousPortsAreErrorsNamingIt) {
  ScriptedClient headless({Service("None", json::array({{{"port", 7443}}}))});
  StatusOr<std::string> address = Address(headless);
  ASSERT_FALSE(address.ok());
  EXPECT_EQ(address.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(address.status().message().find("lockstep-system/lockstep-rendezvous"),
            std::string::npos);
  EXPECT_EQ(headless.gets, 1) << "not retried: it will not change by itself";

  ScriptedClient two({Service("10.96.0.7", json::array({{{"name", "a"}, {"port", 1}},
                                                       {{"name", "b"}, {"port", 2}}}))});
  EXPECT_EQ(Address(two).status().code(), StatusCode::kInvalidArgument);
  ScriptedClient bad_port({Service("10.96.0.7", json::array({{{"port", "7443"}}}))});
  EXPECT_EQ(Address(bad_port).status().code(), StatusCode::kInvalidArgument);
}

TEST(RendezvousServiceAddressTest, NoAddressWithinTheTimeoutIsDeadlineExceeded) {
  ScriptedClient client({UnavailableError("connection refused")});
  StatusOr<std::string> address = Address(client, 300);
  ASSERT_FALSE(address.ok());
  EXPECT_EQ(address.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(address.status().message().find("connection refused"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::op
