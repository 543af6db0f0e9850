#include "tests/support/netns/netns_hosts.h"

#include <unistd.h>

#include <cstdint>
#include <iostream>

#include "tests/support/process/child_process.h"

namespace lockstep::testing {
namespace {

// Each iproute2 call is bounded: a hung `ip` fails the set-up instead of the suite.
constexpr int64_t kToolTimeoutMs = 20000;

// iproute2's programs by absolute path (the process runner does not search PATH).
std::string Tool(const std::string& name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    const std::string path = dir + name;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "/usr/sbin/" + name;
}

}  // namespace

bool NetnsHosts::Run(const std::vector<std::string>& argv, std::string* output) {
  std::vector<std::string> command = argv;
  command[0] = Tool(command[0]);
  const ProcessResult result = RunProcess(command, {}, kToolTimeoutMs);
  // iproute2's own error message is what a reader of a failed set-up needs.
  if (output != nullptr) *output = result.out + result.err;
  return result.code() == 0;
}

NetnsHosts::NetnsHosts(int count) {
  const int pid = static_cast<int>(getpid());
  id_ = std::to_string(pid % 100000);
  const std::string subnet = "10.231." + std::to_string(pid % 250 + 1) + ".";
  bridge_ = "lsb" + id_;
  gateway_ = subnet + "1";
  std::string output;
  if (geteuid() != 0) {
    skip_reason_ = "network namespaces need root (CAP_NET_ADMIN); this test runs as uid " +
                   std::to_string(geteuid());
    return;
  }
  if (!Run({"ip", "link", "add", bridge_, "type", "bridge"}, &output)) {
    skip_reason_ = "cannot create a bridge (ip link add " + bridge_ + " type bridge): " + output;
    return;
  }
  if (!Run({"ip", "addr", "add", gateway_ + "/24", "dev", bridge_}, &output) ||
      !Run({"ip", "link", "set", bridge_, "up"}, &output)) {
    skip_reason_ = "cannot configure bridge " + bridge_ + ": " + output;
    RemoveAll();
    return;
  }
  for (int i = 0; i < count; ++i) {
    const std::string name = "lsn" + id_ + "-" + std::to_string(i);
    const std::string outer = "lsv" + id_ + "o" + std::to_string(i);
    const std::string inner = "lsv" + id_ + "i" + std::to_string(i);
    const std::string address = subnet + std::to_string(10 + i);
    if (!Run({"ip", "netns", "add", name}, &output)) {
      skip_reason_ = "cannot create network namespace " + name + ": " + output;
      RemoveAll();
      return;
    }
    namespaces_.push_back(name);
    const bool made =
        Run({"ip", "link", "add", outer, "type", "veth", "peer", "name", inner}, &output) &&
        Run({"ip", "link", "set", inner, "netns", name}, &output) &&
        Run({"ip", "link", "set", outer, "master", bridge_, "up"}, &output) &&
        Run({"ip", "-n", name, "addr", "add", address + "/24", "dev", inner}, &output) &&
        Run({"ip", "-n", name, "link", "set", inner, "up"}, &output) &&
        Run({"ip", "-n", name, "link", "set", "lo", "up"}, &output);
    outer_links_.push_back(outer);
    inner_links_.push_back(inner);
    addresses_.push_back(address);
    if (!made) {
      skip_reason_ = "cannot join namespace " + name + " to bridge " + bridge_ + ": " + output;
      RemoveAll();
      return;
    }
  }
  ok_ = true;
}

NetnsHosts::~NetnsHosts() { RemoveAll(); }

void NetnsHosts::RemoveAll() {
  // Deleting a namespace deletes its end of each veth, which deletes the pair.
  for (const std::string& name : namespaces_) Run({"ip", "netns", "delete", name});
  for (const std::string& outer : outer_links_) Run({"ip", "link", "delete", outer});
  if (!bridge_.empty()) Run({"ip", "link", "delete", bridge_});
  namespaces_.clear();
  outer_links_.clear();
  inner_links_.clear();
  ok_ = false;
}

std::vector<std::string> NetnsHosts::Wrap(int host, const std::vector<std::string>& argv) const {
  std::vector<std::string> wrapped = {Tool("ip"), "netns", "exec", namespaces_[host]};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return wrapped;
}

bool NetnsHosts::LimitRate(const std::string& rate) {
  // tbf on the egress of both ends of each veth: traffic into the host leaves the bridge side,
  // traffic out of it leaves the namespace side. The bucket holds ~1 ms at 10 Gbit/s (1.25 MB),
  // enough for a TCP burst without letting the link exceed its rate for long.
  for (size_t i = 0; i < namespaces_.size(); ++i) {
    std::string output;
    const std::vector<std::string> tbf = {"root", "tbf", "rate", rate, "burst", "1250kb",
                                          "latency", "50ms"};
    std::vector<std::string> outer = {"tc", "qdisc", "replace", "dev", outer_links_[i]};
    outer.insert(outer.end(), tbf.begin(), tbf.end());
    std::vector<std::string> inner = {"ip", "netns", "exec", namespaces_[i],
                                      "tc", "qdisc", "replace", "dev", inner_links_[i]};
    inner.insert(inner.end(), tbf.begin(), tbf.end());
    if (!Run(outer, &output) || !Run(inner, &output)) {
      std::cerr << "tc refused the " << rate << " limit: " << output << "\n";
      return false;
    }
  }
  return true;
}

}  // namespace lockstep::testing
