#include "worker/comm/gloo/socket_shutdown.h"

#include <dirent.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/deadline.h"

namespace lockstep::comm {
namespace {

// Same family, address and port.
bool SameEndpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof(x.sin6_addr)) == 0;
  }
  return false;
}

bool AnyOf(const std::vector<sockaddr_storage>& list, const sockaddr_storage& address) {
  for (const sockaddr_storage& entry : list) {
    if (SameEndpoint(entry, address)) return true;
  }
  return false;
}

// Calls `visit(fd)` for every connected TCP socket of this process whose local address is one of
// `local` or whose peer address is one of `remote`.
template <typename Visit>
void ForEachMatchingSocket(const std::vector<sockaddr_storage>& local,
                           const std::vector<sockaddr_storage>& remote, Visit visit) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int type = 0;
    socklen_t length = sizeof(type);
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_TYPE, &type, &length) != 0 ||
        type != SOCK_STREAM) {
      continue;
    }
    sockaddr_storage mine{}, peer{};
    socklen_t mine_length = sizeof(mine), peer_length = sizeof(peer);
    // A listening socket has no peer: left alone.
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&mine), &mine_length) != 0 ||
        getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) {
      continue;
    }
    if (AnyOf(local, mine) || AnyOf(remote, peer)) visit(static_cast<int>(fd));
  }
  closedir(dir);
}

}  // namespace

int ShutdownConnectedSockets(const std::vector<sockaddr_storage>& local,
                             const std::vector<sockaddr_storage>& remote) {
  int count = 0;
  ForEachMatchingSocket(local, remote, [&](int fd) {
    if (shutdown(fd, SHUT_RDWR) == 0) ++count;
  });
  return count;
}

bool WaitUntilSentBytesAcknowledged(const std::vector<sockaddr_storage>& local,
                                    const std::vector<sockaddr_storage>& remote,
                                    int64_t timeout_ms) {
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  // No event says "the send queue is empty", so it is looked at every millisecond: on a live
  // link the last bytes are acknowledged within a round trip or two.
  for (;;) {
    bool queued = false;
    ForEachMatchingSocket(local, remote, [&](int fd) {
      int unacknowledged = 0;
      if (ioctl(fd, SIOCOUTQ, &unacknowledged) == 0 && unacknowledged > 0) queued = true;
    });
    if (!queued) return true;
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void IgnoreSigpipeUnlessHandled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
  signal(SIGPIPE, SIG_IGN);
}

}  // namespace lockstep::comm
