#include "common/http/http_endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "common/errno_check.h"
#include "common/logging.h"

namespace lockstep::http {
namespace {

// One deadline for a whole exchange (reading the request and writing the response), not per
// byte: a client that trickles a byte at a time is closed when it passes, like any other.
constexpr std::chrono::seconds kRequestDeadline{5};
constexpr size_t kMaxRequestBytes = 16 * 1024;
// Connections served at once. Past it the oldest one still sending its request is closed to make
// room, so clients that hold connections open cannot keep a scraper out, and memory stays bounded
// (16 KiB of request each).
constexpr size_t kMaxConnections = 32;
constexpr std::chrono::milliseconds kAcceptPause{100};

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

std::string ResponseText(const HttpResponse& response, bool head_only) {
  std::string text = "HTTP/1.1 " + std::to_string(response.status) + " " +
                     ReasonPhrase(response.status) + "\r\nContent-Type: " + response.content_type +
                     "\r\nContent-Length: " + std::to_string(response.body.size()) +
                     "\r\nConnection: close\r\n\r\n";
  if (!head_only) text += response.body;
  return text;
}

HttpResponse PlainResponse(int status, std::string body) {
  return {status, "text/plain; charset=utf-8", std::move(body)};
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
  endpoint->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (endpoint->listen_fd_ < 0) return ErrnoStatus("http endpoint: socket", errno);
  const int one = 1;
  // Lets a restarted process take its port back while old connections sit in TIME_WAIT.
  setsockopt(endpoint->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(endpoint->listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(endpoint->listen_fd_, SOMAXCONN) != 0) {
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

// One accepted connection: what it has sent, and once the request is complete, the response
// still to be written. Every connection has one deadline for the whole exchange.
struct HttpEndpoint::Connection {
  int fd = -1;
  Clock::time_point deadline;
  std::string request;
  std::string response;  // non-empty once the request has been answered
  size_t written = 0;
};

void HttpEndpoint::Serve() {
  std::deque<Connection> connections;  // oldest first
  auto close_at = [&](size_t index) {
    ::close(connections[index].fd);
    connections.erase(connections.begin() + static_cast<std::ptrdiff_t>(index));
  };
  // Out of file descriptors, accept fails while the listening socket stays readable: accepting
  // pauses meanwhile instead of spinning.
  Clock::time_point accept_paused_until = Clock::time_point::min();
  for (;;) {
    const bool accepting = Clock::now() >= accept_paused_until;
    std::vector<pollfd> fds = {{accepting ? listen_fd_ : -1, POLLIN, 0},
                               {wake_fds_[0], POLLIN, 0}};
    Clock::time_point next_deadline = accepting ? Clock::time_point::max() : accept_paused_until;
    for (const Connection& connection : connections) {
      fds.push_back({connection.fd,
                     static_cast<short>(connection.response.empty() ? POLLIN : POLLOUT), 0});
      next_deadline = std::min(next_deadline, connection.deadline);
    }
    int timeout_ms = -1;
    if (next_deadline != Clock::time_point::max()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_deadline -
                                                                              Clock::now());
      timeout_ms = static_cast<int>(std::max<int64_t>(0, left.count() + 1));
    }
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      LOCKSTEP_LOG(ERROR) << "http endpoint on port " << port_
                          << ": poll: " << std::strerror(errno);
      break;
    }
    if (fds[1].revents != 0) break;  // destructor
    // Progress on the connections polled (indices shift as connections close, so walk back).
    for (size_t i = connections.size(); i-- > 0;) {
      const short events = fds[2 + i].revents;
      if (events == 0) continue;
      if (!Progress(connections[i])) close_at(i);
    }
    const Clock::time_point now = Clock::now();
    for (size_t i = connections.size(); i-- > 0;) {
      if (connections[i].deadline <= now) close_at(i);
    }
    if ((fds[0].revents & POLLIN) != 0) {
      for (;;) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            accept_paused_until = Clock::now() + kAcceptPause;
          }
          break;  // EAGAIN: none left; or the client went away
        }
        if (connections.size() >= kMaxConnections) {
          // Full: the oldest connection still sending its request makes room, so clients that
          // hold connections open cannot keep a scraper out; one being answered is never cut.
          const auto waiting = std::find_if(connections.begin(), connections.end(),
                                            [](const Connection& c) { return c.response.empty(); });
          if (waiting == connections.end()) {
            ::close(fd);
            continue;
          }
          close_at(static_cast<size_t>(waiting - connections.begin()));
        }
        connections.push_back({fd, Clock::now() + kRequestDeadline, {}, {}, 0});
      }
    }
  }
  for (Connection& connection : connections) ::close(connection.fd);
}

bool HttpEndpoint::Progress(Connection& connection) {
  if (connection.response.empty()) {
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::recv(connection.fd, buffer, sizeof(buffer), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;  // wait for more
      if (n <= 0) return false;  // closed before a whole request, or an error
      connection.request.append(buffer, static_cast<size_t>(n));
      if (connection.request.size() > kMaxRequestBytes) {
        connection.response = ResponseText(PlainResponse(400, "request too large\n"), false);
        break;
      }
      if (connection.request.find("\r\n\r\n") != std::string::npos) {
        connection.response = Respond(connection.request);
        break;
      }
    }
  }
  while (connection.written < connection.response.size()) {
    const ssize_t n = ::send(connection.fd, connection.response.data() + connection.written,
                             connection.response.size() - connection.written, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;  // wait for room
    if (n <= 0) return false;
    connection.written += static_cast<size_t>(n);
  }
  return false;  // answered: every response closes the connection
}

std::string HttpEndpoint::Respond(const std::string& request) const {
  // Request line: METHOD SP TARGET SP VERSION.
  const size_t line_end = request.find("\r\n");
  const std::string line = request.substr(0, line_end);
  const size_t first_space = line.find(' ');
  const size_t second_space = line.find(' ', first_space + 1);
  if (first_space == std::string::npos || second_space == std::string::npos) {
    return ResponseText(PlainResponse(400, "malformed request line\n"), false);
  }
  const std::string method = line.substr(0, first_space);
  std::string target = line.substr(first_space + 1, second_space - first_space - 1);
  const size_t query = target.find('?');
  if (query != std::string::npos) target.resize(query);
  if (method != "GET" && method != "HEAD") {
    return ResponseText(PlainResponse(405, "only GET and HEAD\n"), false);
  }
  const bool head_only = method == "HEAD";
  const auto handler = handlers_.find(target);
  if (handler == handlers_.end()) {
    return ResponseText(PlainResponse(404, "not found: " + target + "\n"), head_only);
  }
  return ResponseText(handler->second(), head_only);
}

HttpHandler PrometheusHandler(std::shared_ptr<prometheus::Registry> registry) {
  return [registry] {
    prometheus::TextSerializer serializer;
    return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8",
                        serializer.Serialize(registry->Collect())};
  };
}

}  // namespace lockstep::http
