// CPU priority of a process started ahead of need (the exec agent's warm spare): it runs under
// SCHED_IDLE meanwhile, so that its start-up (a Python program importing torch: seconds of a
// core) takes only CPU time that no training rank wants, and it returns to the normal policy
// when it is about to train.
//
//   if (IdlePriorityIsReversible()) (void)EnterIdlePriority(pid);   // once it has been executed
//   ... about to train:
//   if (Status s = LeaveIdlePriority(pid); !s.ok()) LOG(WARNING) << s;
//
// Leaving SCHED_IDLE needs CAP_SYS_NICE or an RLIMIT_NICE of at least 20 (sched(7): an
// unprivileged thread may leave SCHED_IDLE only for a nice value its RLIMIT_NICE permits), which a
// pod under the restricted security profile does not have. Idle priority is therefore only ever
// entered where this process has just shown that it can undo it (a child of the same user
// inherits that): a process stuck at idle priority while it trains would be worse than one that
// competes for a moment.
#pragma once

#include <sys/types.h>

#include "common/status.h"

namespace lockstep {

// Whether this process may move a thread of its own uid from SCHED_IDLE back to SCHED_OTHER.
// Probed once (on a short-lived thread, so the probe cannot leave the caller at idle priority)
// and remembered. Thread-safe.
bool IdlePriorityIsReversible();

// Moves every thread of process `pid` under SCHED_OTHER to SCHED_IDLE; LeaveIdlePriority moves
// every thread under SCHED_IDLE back to SCHED_OTHER. Each works in passes over /proc/PID/task
// until a pass finds nothing left to move (a thread the process starts meanwhile inherits its
// creator's policy, which a later pass sees; at most a few passes). Threads that exit meanwhile
// are skipped. Entering needs no privilege; leaving needs IdlePriorityIsReversible().
// Errors: NotFound when the process is gone, PermissionDenied, Unavailable when threads kept
// appearing under the old policy.
//
// Entered by the parent once the program has been executed, never in the child before exec: an
// exec at idle priority on a busy machine waits for idle CPU, and a parent waiting for it too.
Status EnterIdlePriority(pid_t pid);
Status LeaveIdlePriority(pid_t pid);

}  // namespace lockstep
