// Storage: the narrow interface checkpoints are written through, one implementation per scheme.
//
//   file:///abs/dir        LocalStorage    (storage/local/local_storage.h)
//   hdfs://host:port/dir   WebHdfsStorage  (storage/webhdfs/webhdfs_storage.h), over WebHDFS REST;
//   webhdfs://host:port/dir is the same.
//
// Paths given to a Storage are absolute ("/ckpt/job/step-000000000500/manifest.json") in the
// storage's own namespace; the URI's path is where a caller's root lies:
//
//   LOCKSTEP_ASSIGN_OR_RETURN(StorageUri uri, ParseStorageUri("hdfs://nn:9870/ckpt/fashion"));
//   LOCKSTEP_ASSIGN_OR_RETURN(std::unique_ptr<Storage> storage, OpenStorage(uri.uri, {}));
//   LOCKSTEP_RETURN_IF_ERROR(storage->Write(uri.path + "/x.bin", bytes, {},
//   Deadline::AfterMs(5000)));
//
// Every call blocks at most until its deadline and then returns DEADLINE_EXCEEDED (or the error
// that kept it from finishing, when that came first). Errors use the canonical codes:
// NOT_FOUND (path missing), ALREADY_EXISTS, PERMISSION_DENIED, INVALID_ARGUMENT,
// FAILED_PRECONDITION (e.g. a directory that is not empty), UNAVAILABLE (transient: the
// implementation has already retried it until the deadline allowed), DATA_LOSS.
// Implementations are safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/deadline.h"
#include "common/status.h"

namespace lockstep::checkpoint {

// One entry of a directory listing, or the result of Stat.
struct FileInfo {
  std::string name;  // the last path component ("" for Stat of "/")
  int64_t size_bytes = 0;
  bool is_dir = false;
  int64_t modification_time_ms = 0;  // since the Unix epoch, as the storage reports it
};

struct WriteOptions {
  // false: ALREADY_EXISTS when the path exists. true: replace it (never leaving a mix of the
  // old and the new bytes).
  bool overwrite = false;
  // true: when Write returns, the file's name, and every parent directory it created, survive a
  // crash too (LocalStorage: the parent directory is fsync'ed). false: only the content is
  // durable, and it is so before the name appears; the names are the caller's to make durable
  // with SyncDirectory, once for several files written into one directory (a checkpoint's
  // shards and manifest) instead of once per file.
  bool sync_directory = true;
  // true: a reader sees no file (or the old one) or all of the new bytes (LocalStorage writes a
  // temporary name and renames it over `path` once synced). false: written under `path`
  // directly, so a reader may see it partial; for a file in a directory that no reader looks at
  // until it is complete (a checkpoint's .tmp- directory), where it spares a rename and, on a
  // journaling file system, one journal commit. WebHDFS always writes in place.
  bool atomic = true;
};

class Storage {
 public:
  virtual ~Storage() = default;

  // Writes `bytes` (binary) as the whole content of `path`, creating missing parent
  // directories. LocalStorage: a reader sees no file (or the old one) or all the bytes. HDFS
  // shows a file while it is being written, growing: callers that need all-or-nothing write
  // under a temporary directory and Rename it (as checkpoints do).
  virtual Status Write(const std::string& path, std::string_view bytes, const WriteOptions& options,
                       Deadline deadline) = 0;

  // Write of the concatenation of `pieces`, for content that lies in several buffers (a
  // checkpoint shard spans tensors); the same contract as Write. The default joins the pieces
  // and calls Write; LocalStorage writes straight from them, sparing a copy of the whole content
  // (and Write of LocalStorage goes through it, so a wrapper of LocalStorage that intercepts
  // writes overrides this one).
  virtual Status WritePieces(const std::string& path, const std::vector<std::string_view>& pieces,
                             const WriteOptions& options, Deadline deadline);

  // Reads up to `length` bytes from `offset` (length < 0: to the end). Returns fewer bytes only
  // when the file ends first; a transfer cut short is an error, never a short result.
  virtual StatusOr<std::vector<uint8_t>> Read(const std::string& path, int64_t offset,
                                              int64_t length, Deadline deadline) = 0;

  // NOT_FOUND when the path does not exist.
  virtual StatusOr<FileInfo> Stat(const std::string& path, Deadline deadline) = 0;

  // The entries of directory `dir` (not recursive), sorted by name. NOT_FOUND when missing.
  virtual StatusOr<std::vector<FileInfo>> List(const std::string& dir, Deadline deadline) = 0;

  // Creates `path` and its missing parents; OK when it already is a directory.
  virtual Status MakeDirs(const std::string& path, Deadline deadline) = 0;

  // Makes the entries of directory `dir` (names created, renamed or removed in it) survive a
  // crash. LocalStorage: fsync of the directory (NOT_FOUND when missing). WebHDFS: nothing to
  // do, the namenode has made every operation it acknowledged durable.
  virtual Status SyncDirectory(const std::string& dir, Deadline deadline) = 0;

  // Renames a file or a directory. Fails with ALREADY_EXISTS when `dst` exists (never moves
  // into it), NOT_FOUND when `src` or dst's parent is missing. Atomic for readers: a reader
  // sees `src` complete or `dst` complete. Durable when it returns (both parents are synced).
  virtual Status Rename(const std::string& src, const std::string& dst, Deadline deadline) = 0;

  // Deletes a file, or a directory (its content too when `recursive`; FAILED_PRECONDITION when
  // it is not empty and not `recursive`). NOT_FOUND when the path does not exist.
  virtual Status Delete(const std::string& path, bool recursive, Deadline deadline) = 0;

  // "file://" or "hdfs://host:port", for messages.
  virtual std::string Describe() const = 0;
};

struct StorageOptions {
  // WebHDFS: the user name sent as user.name (simple authentication). Empty: $USER, else "root".
  std::string user;
  // WebHDFS: the limit of one HTTP request. Smaller: a hung server is noticed sooner and retried;
  // larger: a slow but steady transfer of a big shard is not cut off.
  int64_t request_timeout_ms = 60000;
  // WebHDFS: first and largest pause between retries of an UNAVAILABLE request (exponential
  // with jitter, always bounded by the call's deadline).
  int64_t retry_initial_backoff_ms = 50;
  int64_t retry_max_backoff_ms = 2000;
};

struct StorageUri {
  std::string uri;        // as given
  std::string scheme;     // "file" | "hdfs" | "webhdfs"
  std::string authority;  // "host:port" ("" for file)
  std::string path;       // absolute, without a trailing slash (except "/")
};

// Accepts file:///abs, a plain absolute path (taken as file://), hdfs://host:port/abs and
// webhdfs://host:port/abs. INVALID_ARGUMENT naming the problem otherwise.
StatusOr<StorageUri> ParseStorageUri(const std::string& uri);

// Opens the storage that serves `uri`'s scheme (the path part is not used: see StorageUri).
StatusOr<std::unique_ptr<Storage>> OpenStorage(const std::string& uri,
                                               const StorageOptions& options);

// Path helpers for the absolute, '/'-separated paths of a Storage.
std::string JoinPath(const std::string& dir, const std::string& name);
std::string ParentPath(const std::string& path);  // "/a/b" -> "/a"; "/a" -> "/"
std::string BaseName(const std::string& path);    // "/a/b" -> "b"

}  // namespace lockstep::checkpoint
