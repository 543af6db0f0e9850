#include "common/http/http_endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/errno_check.h"
#include "common/logging.h"

namespace lockstep::http {
namespace {

constexpr int kRequestDeadlineSeconds = 5;
constexpr size_t kMaxRequestBytes = 16 * 1024;

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

bool WriteAll(int fd, const std::string& data) {
  size_t written = 0;
  while (written < data.size()) {
    ssize_t n = ::send(fd, data.data() + written, data.size() - written, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;  // peer gone or the send deadline passed
    written += static_cast<size_t>(n);
  }
  return true;
}

void SendResponse(int fd, const HttpResponse& response, bool head_only) {
  std::string text = "HTTP/1.1 " + std::to_string(response.status) + " " +
                     ReasonPhrase(response.status) + "\r\nContent-Type: " + response.content_type +
                     "\r\nContent-Length: " + std::to_string(response.body.size()) +
                     "\r\nConnection: close\r\n\r\n";
  if (!head_only) text += response.body;
  WriteAll(fd, text);
}

}  // namespace

struct HttpEndpoint::Thread {
  std::thread thread;
};

StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(
    const std::string& host, int port, std::map<std::string, HttpHandler> handlers) {
  const std::string where = host + ":" + std::to_string(port);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    return InvalidArgumentError("http endpoint: not an IPv4 address: \"" + host + "\"");
  }
  std::unique_ptr<HttpEndpoint> endpoint(new HttpEndpoint());
  endpoint->handlers_ = std::move(handlers);
  endpoint->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (endpoint->listen_fd_ < 0) return ErrnoStatus("http endpoint: socket", errno);
  const int one = 1;
  // Lets a restarted process take its port back while old connections sit in TIME_WAIT.
  setsockopt(endpoint->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(endpoint->listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(endpoint->listen_fd_, 64) != 0) {
    const int error = errno;
    return UnavailableError("cannot listen on " + where + " (port busy?): " + std::strerror(error));
  }
  socklen_t length = sizeof(address);
  getsockname(endpoint->listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
  endpoint->port_ = ntohs(address.sin_port);
  if (pipe2(endpoint->wake_fds_, O_CLOEXEC) != 0) {
    return ErrnoStatus("http endpoint: pipe", errno);
  }
  endpoint->thread_ = std::make_unique<Thread>();
  HttpEndpoint* self = endpoint.get();
  endpoint->thread_->thread = std::thread([self] { self->Serve(); });
  return endpoint;
}

HttpEndpoint::~HttpEndpoint() {
  if (thread_ && thread_->thread.joinable()) {
    const char byte = 1;
    [[maybe_unused]] ssize_t ignored = ::write(wake_fds_[1], &byte, 1);
    thread_->thread.join();
  }
  for (int fd : {listen_fd_, wake_fds_[0], wake_fds_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void HttpEndpoint::Serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fds_[0], POLLIN, 0}};
    const int ready = ::poll(fds, 2, -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      LOCKSTEP_LOG(ERROR) << "http endpoint on port " << port_
                          << ": poll: " << std::strerror(errno);
      return;
    }
    if (fds[1].revents != 0) return;  // destructor
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int connection = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;  // the client went away, or EINTR
    HandleConnection(connection);
    ::close(connection);
  }
}

void HttpEndpoint::HandleConnection(int fd) {
  timeval deadline{kRequestDeadlineSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &deadline, sizeof(deadline));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &deadline, sizeof(deadline));
  std::string request;
  char buffer[2048];
  while (request.find("\r\n\r\n") == std::string::npos) {
    ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // closed, or the read deadline passed
    request.append(buffer, static_cast<size_t>(n));
    if (request.size() > kMaxRequestBytes) {
      SendResponse(fd, {400, "text/plain; charset=utf-8", "request too large\n"}, false);
      return;
    }
  }
  // Request line: METHOD SP TARGET SP VERSION.
  const size_t line_end = request.find("\r\n");
  const std::string line = request.substr(0, line_end);
  const size_t first_space = line.find(' ');
  const size_t second_space = line.find(' ', first_space + 1);
  if (first_space == std::string::npos || second_space == std::string::npos) {
    SendResponse(fd, {400, "text/plain; charset=utf-8", "malformed request line\n"}, false);
    return;
  }
  const std::string method = line.substr(0, first_space);
  std::string target = line.substr(first_space + 1, second_space - first_space - 1);
  const size_t query = target.find('?');
  if (query != std::string::npos) target.resize(query);
  if (method != "GET" && method != "HEAD") {
    SendResponse(fd, {405, "text/plain; charset=utf-8", "only GET and HEAD\n"}, false);
    return;
  }
  const auto handler = handlers_.find(target);
  if (handler == handlers_.end()) {
    SendResponse(fd, {404, "text/plain; charset=utf-8", "not found: " + target + "\n"},
                 method == "HEAD");
    return;
  }
  SendResponse(fd, handler->second(), method == "HEAD");
}

HttpHandler PrometheusHandler(std::shared_ptr<prometheus::Registry> registry) {
  return [registry] {
    prometheus::TextSerializer serializer;
    return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8",
                        serializer.Serialize(registry->Collect())};
  };
}

}  // namespace lockstep::http
