// Runs tests/support/webhdfs/webhdfs_test_server.py (a WebHDFS namenode + datanode over a temp
// directory, with fault injection) as a child process, for tests.
//
//   LOCKSTEP_ASSIGN_OR_RETURN(auto server, WebHdfsTestServer::Start());
//   auto storage = OpenStorage(server->uri(), {});           // hdfs://127.0.0.1:<namenode>
//   server->Admin("/fault?target=namenode&kind=unavailable&count=3");
//   nlohmann::json log = server->RequestLog();
//
// The server's ports are chosen by the kernel and read from its first line of output. Destroying
// the object ends the child (closing its stdin; SIGKILL if it has not gone within 5 s).
#pragma once

#include <sys/types.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace lockstep::testing {

class WebHdfsTestServer {
 public:
  // Starts the server and waits (at most 20 s) for it to report its ports.
  static StatusOr<std::unique_ptr<WebHdfsTestServer>> Start();
  ~WebHdfsTestServer();

  int namenode_port() const { return namenode_port_; }
  int datanode_port() const { return datanode_port_; }
  std::string uri() const { return "hdfs://127.0.0.1:" + std::to_string(namenode_port_); }
  // Where the server keeps the files: the HDFS path /p is root() + "/fs/p".
  const std::string& root() const { return root_; }

  // GET on the admin listener (`path_and_query` like "/fault?..."); the parsed JSON reply.
  StatusOr<nlohmann::json> Admin(const std::string& path_and_query);
  // The requests received since the last /clear, oldest first.
  nlohmann::json RequestLog();

 private:
  WebHdfsTestServer() = default;
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int namenode_port_ = 0;
  int datanode_port_ = 0;
  int admin_port_ = 0;
  std::string root_;
};

}  // namespace lockstep::testing
