#include "tests/support/webhdfs/webhdfs_test_server.h"

#include <cpprest/http_client.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "common/deadline.h"
#include "common/errno_check.h"

#ifndef LOCKSTEP_WEBHDFS_TEST_SERVER
#error "LOCKSTEP_WEBHDFS_TEST_SERVER must name webhdfs_test_server.py"
#endif

namespace lockstep::testing {

StatusOr<std::unique_ptr<WebHdfsTestServer>> WebHdfsTestServer::Start() {
  int to_child[2];
  int from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0) return ErrnoStatus("pipe", errno);
  if (::pipe2(from_child, O_CLOEXEC) != 0) return ErrnoStatus("pipe", errno);
  const pid_t pid = ::fork();
  if (pid < 0) return ErrnoStatus("fork", errno);
  if (pid == 0) {
    ::dup2(to_child[0], STDIN_FILENO);
    ::dup2(from_child[1], STDOUT_FILENO);
    const char* script = LOCKSTEP_WEBHDFS_TEST_SERVER;
    ::execl("/usr/bin/python3", "python3", script, static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  std::unique_ptr<WebHdfsTestServer> server(new WebHdfsTestServer());
  server->pid_ = pid;
  server->stdin_fd_ = to_child[1];

  std::string line;
  const Deadline deadline = Deadline::AfterMs(20000);
  while (line.find('\n') == std::string::npos) {
    struct pollfd fd = {from_child[0], POLLIN, 0};
    const int ready = ::poll(&fd, 1, static_cast<int>(deadline.remaining_ms()));
    if (ready < 0 && errno == EINTR) continue;
    char buffer[512];
    const ssize_t n = ready > 0 ? ::read(from_child[0], buffer, sizeof(buffer)) : 0;
    if (n <= 0) {
      ::close(from_child[0]);
      return UnavailableError("webhdfs test server did not report its ports (got '" + line + "')");
    }
    line.append(buffer, static_cast<size_t>(n));
  }
  ::close(from_child[0]);  // the server writes nothing more
  const nlohmann::json ports = nlohmann::json::parse(line, nullptr, false);
  if (!ports.is_object()) return InternalError("webhdfs test server said '" + line + "'");
  server->namenode_port_ = ports.value("namenode", 0);
  server->datanode_port_ = ports.value("datanode", 0);
  server->admin_port_ = ports.value("admin", 0);
  server->root_ = ports.value("root", std::string());
  return server;
}

WebHdfsTestServer::~WebHdfsTestServer() {
  if (stdin_fd_ >= 0) ::close(stdin_fd_);  // the server exits when its stdin closes
  if (pid_ <= 0) return;
  const Deadline deadline = Deadline::AfterMs(5000);
  while (!deadline.expired()) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

StatusOr<nlohmann::json> WebHdfsTestServer::Admin(const std::string& path_and_query) {
  try {
    web::http::client::http_client_config config;
    config.set_timeout(std::chrono::seconds(10));
    web::http::client::http_client client("http://127.0.0.1:" + std::to_string(admin_port_),
                                          config);
    web::http::http_response response =
        client.request(web::http::methods::GET, path_and_query).get();
    const std::string body = response.extract_string().get();
    if (response.status_code() != 200) {
      return InternalError("admin " + path_and_query + ": HTTP " +
                           std::to_string(response.status_code()) + " " + body);
    }
    return nlohmann::json::parse(body);
  } catch (const std::exception& e) {
    return UnavailableError("admin " + path_and_query + ": " + e.what());
  }
}

nlohmann::json WebHdfsTestServer::RequestLog() {
  StatusOr<nlohmann::json> log = Admin("/log");
  return log.ok() ? *log : nlohmann::json::array();
}

}  // namespace lockstep::testing
