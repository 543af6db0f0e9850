// Test support for programs run as processes (label-independent; any test may link
// lockstep_test_process):
//  - child_process.h: ChildProcess / RunProcess, a program started with an environment, its
//    output captured or logged, waited for with a deadline and killed with its process group;
//  - process_table.h: processes found through /proc by environment and parent (a launcher's
//    workers, an agent's command);
//  - scratch_files.h: temporary and scratch directories, whole-file reads and writes;
//  - poll_until.h: bounded polling of what can only be polled;
//  - duty_cycle.h: a process stopped and continued in turn (a straggler).
// tests/support/job builds a job's processes (rendezvous, workers) on top of it.
#pragma once

#include "tests/support/process/child_process.h"  // IWYU pragma: export
#include "tests/support/process/duty_cycle.h"     // IWYU pragma: export
#include "tests/support/process/poll_until.h"     // IWYU pragma: export
#include "tests/support/process/process_table.h"  // IWYU pragma: export
#include "tests/support/process/scratch_files.h"  // IWYU pragma: export
