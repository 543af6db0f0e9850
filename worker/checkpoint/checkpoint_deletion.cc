#include "worker/checkpoint/checkpoint_deletion.h"

#include "common/logging.h"
#include "worker/checkpoint/checkpoint.h"

namespace lockstep::checkpoint {
namespace {

// A concurrent deleter may have removed it (or part of it) first: that is success too.
Status DeleteTreeIfPresent(Storage& storage, const std::string& path, Deadline deadline) {
  Status deleted = storage.Delete(path, /*recursive=*/true, deadline);
  if (deleted.code() == StatusCode::kNotFound) return OkStatus();
  return deleted;
}

}  // namespace

Status DeleteStepDir(Storage& storage, const std::string& root, int64_t step, Deadline deadline) {
  const std::string dir = JoinPath(root, StepDirName(step));
  const std::string deleting = JoinPath(root, DeletingDirName(step));
  Status renamed = storage.Rename(dir, deleting, deadline);
  if (renamed.code() == StatusCode::kAlreadyExists) {
    // An earlier delete of an older step-<step> (the step was committed again since) was
    // interrupted: finish that one first, then move this one aside.
    LOCKSTEP_RETURN_IF_ERROR(DeleteTreeIfPresent(storage, deleting, deadline));
    renamed = storage.Rename(dir, deleting, deadline);
  }
  if (renamed.code() == StatusCode::kNotFound) return OkStatus();
  LOCKSTEP_RETURN_IF_ERROR(renamed);
  return DeleteTreeIfPresent(storage, deleting, deadline);
}

void RemoveInterruptedDeletions(Storage& storage, const std::string& root,
                                const std::vector<FileInfo>& entries, Deadline deadline) {
  for (const FileInfo& entry : entries) {
    if (!entry.is_dir || !IsDeletingDirName(entry.name)) continue;
    const std::string path = JoinPath(root, entry.name);
    Status deleted = DeleteTreeIfPresent(storage, path, deadline);
    if (deleted.ok()) {
      LOCKSTEP_LOG(INFO) << "finished an interrupted checkpoint delete: " << path;
    } else {
      LOCKSTEP_LOG(WARNING) << "could not finish an interrupted checkpoint delete: " << deleted;
    }
  }
}

}  // namespace lockstep::checkpoint
