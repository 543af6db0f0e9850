#include "worker/agent/wake_pipe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/errno_check.h"

namespace lockstep::agent {
namespace {

int g_wake_pipe[2] = {-1, -1};

extern "C" void WakeOnSignal(int signal_number) {
  const int saved_errno = errno;
  Wake(static_cast<unsigned char>(signal_number));
  errno = saved_errno;
}

}  // namespace

Status InstallWakePipe(std::initializer_list<int> signals) {
  if (g_wake_pipe[0] < 0 && pipe2(g_wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    return ErrnoStatus("wake pipe: pipe", errno);
  }
  struct sigaction action {};
  action.sa_handler = WakeOnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (int s : signals) {
    if (sigaction(s, &action, nullptr) != 0) return ErrnoStatus("wake pipe: sigaction", errno);
  }
  signal(SIGPIPE, SIG_IGN);
  return OkStatus();
}

void Wake(unsigned char what) {
  [[maybe_unused]] ssize_t ignored = write(g_wake_pipe[1], &what, 1);
}

std::vector<unsigned char> WaitForWakes(int64_t timeout_ms) {
  std::vector<unsigned char> woken;
  struct pollfd readable {
    g_wake_pipe[0], POLLIN, 0
  };
  int ready;
  LOCKSTEP_SYSCALL_RETRY(ready,
                         poll(&readable, 1, static_cast<int>(std::max<int64_t>(0, timeout_ms))));
  if (ready <= 0) return woken;
  unsigned char bytes[64];
  ssize_t got;
  while ((got = read(g_wake_pipe[0], bytes, sizeof(bytes))) > 0) {
    woken.insert(woken.end(), bytes, bytes + got);
  }
  return woken;
}

}  // namespace lockstep::agent
