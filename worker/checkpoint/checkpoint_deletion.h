// Deleting checkpoints without ever showing a reader a partly deleted one.
//
// A recursive delete is not atomic: a process killed half-way through deleting step-N would leave
// a step-N directory without its manifest or with shards missing, which every reader would then
// have to report as damage. So a step directory is first renamed to .deleting-step-N (atomic, like
// the rename that committed it) and only then deleted. A process killed in between leaves a
// .deleting- directory, which no reader looks at and which the next ListCheckpoints,
// LoadNewestValid or commit's retention removes.
//
//   LOCKSTEP_RETURN_IF_ERROR(DeleteStepDir(storage, "/ckpt/job", 300, Deadline::AfterMs(60000)));
//
// Thread-safe as far as the Storage is. Two processes deleting the same directory at once is
// harmless: whichever finds it gone takes that as done.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/status.h"
#include "worker/checkpoint/storage/storage.h"

namespace lockstep::checkpoint {

// Deletes root/step-<step> by renaming it to root/.deleting-step-<step> and deleting that. OK when
// it is already gone. Errors are the storage's; if the rename succeeded and the delete failed,
// step-<step> is no longer visible and only the .deleting- directory remains.
Status DeleteStepDir(Storage& storage, const std::string& root, int64_t step, Deadline deadline);

// Deletes every .deleting- directory among `entries` (a listing of `root`): deletes that an
// earlier process did not finish. Best effort: failures are logged, never returned, because the
// callers (readers, retention) have succeeded without it.
void RemoveInterruptedDeletions(Storage& storage, const std::string& root,
                                const std::vector<FileInfo>& entries, Deadline deadline);

}  // namespace lockstep::checkpoint
