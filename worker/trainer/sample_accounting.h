// Sample accounting: evidence that within an epoch no sample is trained twice or skipped,
// whatever the membership does. Turned on by LOCKSTEP_SAMPLE_ACCOUNTING=<path> (lockstep-worker).
//
// The trainer keeps, as part of the training state (broadcast with it at every state agreement
// and checkpointed), a count per sample id of how many times the id was trained in the current
// epoch: every committed global step adds its whole global batch (every rank knows it). At every
// epoch end rank 0 appends one line to <path> and the counts are reset; at the end of training a
// last line covers the partial epoch, if any. Each line is one JSON object (JSON Lines):
//
//   {"epoch": 0, "samples": 60000, "trained_once": 60000, "never": 0, "more_than_once": 0,
//    "complete": true, "partial": false, "consumed": 60000, "step": 938}
//
//   epoch           0-based epoch of the data order
//   samples         N, the train split's size
//   trained_once    ids trained exactly once in this epoch
//   never           ids not trained in this epoch
//   more_than_once  ids trained twice or more in this epoch
//   complete        the accounting is exact: for a full epoch every id was trained exactly once
//                   (trained_once == samples); for a partial epoch (end of training mid-epoch)
//                   exactly the first `consumed` positions of the epoch's order were trained, once
//                   each, and nothing else
//   partial         false at an epoch end; true for the end-of-training line of an unfinished epoch
//   consumed        positions of the epoch's order consumed (samples for a full epoch)
//   step            the global step after which the line was written
//
// A line is appended with one write(2) on a file opened with O_APPEND, so a reader never sees a
// torn line even when the writer is killed. The same epoch may appear more than once when the
// job rolled back over it (every process killed and resumed from an older checkpoint, or rank 0
// killed right after writing the line); each line is then a complete account of one trajectory
// and the LAST line of an epoch is the one of the run that finished.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::trainer {

// Adds one to the count of every sample id at positions [begin, end) of `order`.
void CountGlobalBatch(const std::vector<int64_t>& order, int64_t begin, int64_t end,
                      std::vector<int32_t>& counts);

struct EpochAccount {
  int64_t samples = 0;
  int64_t trained_once = 0;
  int64_t never = 0;
  int64_t more_than_once = 0;
  bool complete = false;
};

// Summarises `counts` for an epoch of which the first `consumed` positions of `order` were
// trained.
EpochAccount SummariseEpoch(const std::vector<int64_t>& order, size_t consumed,
                            const std::vector<int32_t>& counts);

// The JSON line (without the newline) for an epoch.
std::string FormatEpochAccount(int64_t epoch, int64_t step, bool partial, size_t consumed,
                               const EpochAccount& account);

// Summarises and appends the line to `path`; failures are logged (accounting never stops
// training).
// Whether `path` already holds the complete (not partial) line of `epoch`: a step's commit
// completed again from held gradients (trainer_pipeline.cc) must not account its epoch twice.
bool EpochAccounted(const std::string& path, int64_t epoch);

void AppendEpochAccounting(const std::string& path, int64_t epoch, int64_t step, bool partial,
                           const std::vector<int64_t>& order, size_t consumed,
                           const std::vector<int32_t>& counts);

}  // namespace lockstep::trainer
