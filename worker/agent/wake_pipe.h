// The process's wake pipe (the self-pipe trick): signal handlers, and any thread, write one byte
// to it; the process's event loop polls it with a timeout instead of blocking in waitpid or
// sigwait. The exec agent and the pod supervisor each run one such loop.
//
//   LOCKSTEP_RETURN_IF_ERROR(InstallWakePipe({SIGTERM, SIGINT, SIGCHLD}));
//   for (unsigned char what : WaitForWakes(/*timeout_ms=*/1000)) { ... }  // signal numbers
//   Wake(kMyEvent);  // another thread: a value above any signal number, e.g. 0xF0
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "common/status.h"

namespace lockstep::agent {

// Creates the pipe (once per process) and makes each delivery of one of `signals` write the
// signal's number to it (SA_RESTART; SIGCHLD only for exits, SA_NOCLDSTOP). SIGPIPE is ignored.
Status InstallWakePipe(std::initializer_list<int> signals);

// Writes `what`; async-signal-safe, callable from any thread.
void Wake(unsigned char what);

// Waits up to timeout_ms for the pipe to become readable, then drains it: the bytes written
// since the last call, in order; empty when nothing came.
std::vector<unsigned char> WaitForWakes(int64_t timeout_ms);

}  // namespace lockstep::agent
