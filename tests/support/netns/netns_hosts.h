// Test hosts on one machine: network namespaces joined by veth pairs to a bridge, so that
// processes of a test run as if on separate hosts (their own addresses and interfaces; the
// communicator factory sees different hosts) while the test process reaches them all.
//
//   NetnsHosts hosts(2);
//   if (!hosts.ok()) GTEST_SKIP() << hosts.skip_reason();
//   hosts.LimitRate("1gbit");                  // optional: tc tbf on every host's link
//   ChildProcess worker(hosts.Wrap(0, argv), {{"LOCKSTEP_HOST", hosts.address(0)}}, log);
//   ... services the hosts must reach listen on hosts.gateway() ...
//
// Layout: a bridge lsb<id> with address 10.231.<subnet>.1/24 in the test's own namespace, and
// host i a namespace lsn<id>-<i> whose veth holds 10.231.<subnet>.<10 + i>/24 and whose
// loopback is up. <id> and <subnet> come from the test process's pid, so concurrent tests do
// not collide. Only these addresses of the test's own hosts are used. The destructor removes
// the namespaces, the veths and the bridge (and a crashed test's leftovers are named by pid).
//
// Needs CAP_NET_ADMIN (root) and iproute2 (`ip`, `tc`). Where namespaces cannot be made, ok() is
// false and skip_reason() says why; the test skips, saying so, rather than passing quietly.
#pragma once

#include <string>
#include <vector>

namespace lockstep::testing {

class NetnsHosts {
 public:
  explicit NetnsHosts(int count);
  ~NetnsHosts();
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  bool ok() const { return ok_; }
  const std::string& skip_reason() const { return skip_reason_; }
  int size() const { return static_cast<int>(namespaces_.size()); }

  const std::string& address(int host) const { return addresses_[host]; }
  const std::string& namespace_name(int host) const { return namespaces_[host]; }
  // The bridge's address: where the hosts reach the test process.
  const std::string& gateway() const { return gateway_; }
  // argv run inside host `host`'s namespace (`ip netns exec`, which execs it: the pid is the
  // program's).
  std::vector<std::string> Wrap(int host, const std::vector<std::string>& argv) const;

  // Limits every host's link in both directions to `rate` (tc's units: "1gbit", "10gbit") with a
  // token bucket filter; false (and a test failure message on stderr) when tc refuses.
  bool LimitRate(const std::string& rate);

 private:
  bool Run(const std::vector<std::string>& argv, std::string* output = nullptr);
  void RemoveAll();

  bool ok_ = false;
  std::string skip_reason_;
  std::string id_;
  std::string bridge_;
  std::string gateway_;
  std::vector<std::string> namespaces_;
  std::vector<std::string> addresses_;
  std::vector<std::string> outer_links_;  // the bridge side of each veth
  std::vector<std::string> inner_links_;  // the namespace side
};

}  // namespace lockstep::testing
