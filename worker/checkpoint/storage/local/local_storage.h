// LocalStorage: Storage over a POSIX file system (file:// URIs).
//
// Durability and atomicity: Write goes to a hidden temporary name in the same directory, is
// fsync'ed, renamed into place, and the directory is fsync'ed (unless the caller takes that on:
// WriteOptions::sync_directory), so after a crash a reader finds the old file or the whole new
// one. Writeback is started every few MiB while the content is still being written
// (sync_file_range), so the closing fsync waits for the tail, not the whole file. Rename uses
// renameat2(RENAME_NOREPLACE), which refuses an existing destination atomically (files and
// directories alike) and fsyncs both parents.
// Local calls do not block on anything but the disk, so the deadline is checked between system
// calls rather than enforced within one.
#pragma once

#include <string>
#include <vector>

#include "worker/checkpoint/storage/storage.h"

namespace lockstep::checkpoint {

class LocalStorage : public Storage {
 public:
  LocalStorage() = default;

  Status Write(const std::string& path, std::string_view bytes, const WriteOptions& options,
               Deadline deadline) override;
  Status WritePieces(const std::string& path, const std::vector<std::string_view>& pieces,
                     const WriteOptions& options, Deadline deadline) override;
  StatusOr<std::vector<uint8_t>> Read(const std::string& path, int64_t offset, int64_t length,
                                      Deadline deadline) override;
  StatusOr<FileInfo> Stat(const std::string& path, Deadline deadline) override;
  StatusOr<std::vector<FileInfo>> List(const std::string& dir, Deadline deadline) override;
  Status MakeDirs(const std::string& path, Deadline deadline) override;
  Status SyncDirectory(const std::string& dir, Deadline deadline) override;
  Status Rename(const std::string& src, const std::string& dst, Deadline deadline) override;
  Status Delete(const std::string& path, bool recursive, Deadline deadline) override;
  std::string Describe() const override { return "file://"; }
};

}  // namespace lockstep::checkpoint
