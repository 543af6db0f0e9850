// Test support for jobs of real processes (link lockstep_test_job), on top of
// tests/support/process:
//  - in_process_rendezvous.h: InProcessRendezvous, the rendezvous service hosted in the test for
//    one job, and the environment that makes a process one of its members;
//  - local_job.h: LocalJob, that service plus N lockstep-worker processes on a manifest;
//  - launcher_workers.h: the workers a `lockstep run` launcher started;
//  - run_summary.h: a finished run's summary file, and how far two runs' parameters are apart;
//  - sample_accounting_check.h: that a job trained every sample of an epoch exactly once.
#pragma once

#include "tests/support/job/in_process_rendezvous.h"  // IWYU pragma: export
#include "tests/support/job/launcher_workers.h"       // IWYU pragma: export
#include "tests/support/job/local_job.h"              // IWYU pragma: export
#include "tests/support/job/run_summary.h"            // IWYU pragma: export
#include "tests/support/job/sample_accounting_check.h"  // IWYU pragma: export
#include "tests/support/process/process.h"            // IWYU pragma: export
