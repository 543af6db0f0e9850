#include "worker/checkpoint/storage/local/local_storage.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "common/errno_check.h"

namespace lockstep::checkpoint {
namespace {

Status CheckDeadline(const Deadline& deadline, const std::string& what) {
  if (deadline.expired()) return DeadlineExceededError(what + ": deadline passed");
  return OkStatus();
}

// Makes a rename or a create in `dir` durable.
Status FsyncDirectory(const std::string& dir) {
  int fd;
  LOCKSTEP_SYSCALL_RETRY(fd, ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd < 0) return ErrnoStatus("open " + dir, errno);
  int rc;
  LOCKSTEP_SYSCALL_RETRY(rc, ::fsync(fd));
  const int fsync_errno = errno;
  ::close(fd);
  if (rc != 0) return ErrnoStatus("fsync " + dir, fsync_errno);
  return OkStatus();
}

// Writeback of a file being written is started every this many bytes, so that the disk works
// while the rest is still being copied into the page cache and the closing fsync only waits for
// the tail. Smaller: more system calls and smaller disk requests; larger: more left for the
// fsync to wait for.
constexpr size_t kWritebackChunkBytes = size_t{8} << 20;

// Writes `pieces` one after the other to the new, empty file `fd`, starting the writeback of
// every full chunk as soon as it is written (sync_file_range(SYNC_FILE_RANGE_WRITE) only starts
// it: durability is still the closing fsync's).
Status WritePiecesWithEarlyWriteback(int fd, const std::vector<std::string_view>& pieces,
                                     const std::string& path) {
  off_t written = 0;
  off_t writeback_started = 0;
  for (std::string_view piece : pieces) {
    size_t done = 0;
    while (done < piece.size()) {
      const size_t want = std::min(piece.size() - done, kWritebackChunkBytes);
      ssize_t n;
      LOCKSTEP_SYSCALL_RETRY(n, ::write(fd, piece.data() + done, want));
      if (n < 0) return ErrnoStatus("write " + path, errno);
      done += static_cast<size_t>(n);
      written += n;
      if (static_cast<size_t>(written - writeback_started) >= kWritebackChunkBytes) {
        // A hint: a file system without it (EINVAL, ESPIPE) simply leaves it all to fsync.
        ::sync_file_range(fd, writeback_started, written - writeback_started,
                          SYNC_FILE_RANGE_WRITE);
        writeback_started = written;
      }
    }
  }
  return OkStatus();
}

// MakeDirs, with the fsync of each parent that gains a directory only when `sync`.
Status MakeDirsSynced(const std::string& path, bool sync) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return OkStatus();
    return AlreadyExistsError("mkdirs " + path + ": exists and is not a directory");
  }
  if (path != "/" && path != ".") LOCKSTEP_RETURN_IF_ERROR(MakeDirsSynced(ParentPath(path), sync));
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus("mkdir " + path, errno);
  }
  return sync ? FsyncDirectory(ParentPath(path)) : OkStatus();
}

FileInfo InfoFromStat(const std::string& name, const struct stat& st) {
  FileInfo info;
  info.name = name;
  info.is_dir = S_ISDIR(st.st_mode);
  info.size_bytes = info.is_dir ? 0 : static_cast<int64_t>(st.st_size);
  info.modification_time_ms =
      static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
  return info;
}

Status DeleteTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return ErrnoStatus("stat " + path, errno);
  if (S_ISDIR(st.st_mode)) {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) return ErrnoStatus("opendir " + path, errno);
    std::vector<std::string> names;
    while (struct dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(dir);
    for (const std::string& name : names) LOCKSTEP_RETURN_IF_ERROR(DeleteTree(path + "/" + name));
    if (::rmdir(path.c_str()) != 0) return ErrnoStatus("rmdir " + path, errno);
    return OkStatus();
  }
  if (::unlink(path.c_str()) != 0) return ErrnoStatus("unlink " + path, errno);
  return OkStatus();
}

std::string UniqueTempName(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return ParentPath(path) + "/." + BaseName(path) + ".tmp-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter.fetch_add(1));
}

}  // namespace

Status LocalStorage::Write(const std::string& path, std::string_view bytes,
                           const WriteOptions& options, Deadline deadline) {
  return WritePieces(path, {bytes}, options, deadline);
}

Status LocalStorage::WritePieces(const std::string& path,
                                 const std::vector<std::string_view>& pieces,
                                 const WriteOptions& options, Deadline deadline) {
  LOCKSTEP_RETURN_IF_ERROR(CheckDeadline(deadline, "write " + path));
  const std::string parent = ParentPath(path);
  LOCKSTEP_RETURN_IF_ERROR(MakeDirsSynced(parent, options.sync_directory));
  struct stat st;
  if (!options.overwrite && ::stat(path.c_str(), &st) == 0) {
    return AlreadyExistsError("write " + path + ": file exists");
  }
  // Atomic: a temporary name, renamed over `path` once synced. Otherwise `path` itself (an old
  // file there is truncated at once when overwriting is allowed).
  const std::string target = options.atomic ? UniqueTempName(path) : path;
  const int exclusive = options.atomic || !options.overwrite ? O_EXCL : O_TRUNC;
  int fd;
  LOCKSTEP_SYSCALL_RETRY(fd,
                         ::open(target.c_str(), O_WRONLY | O_CREAT | exclusive | O_CLOEXEC, 0644));
  if (fd < 0) return ErrnoStatus("create " + target, errno);
  Status status = WritePiecesWithEarlyWriteback(fd, pieces, target);
  if (status.ok()) {
    int rc;
    LOCKSTEP_SYSCALL_RETRY(rc, ::fsync(fd));
    if (rc != 0) status = ErrnoStatus("fsync " + target, errno);
  }
  if (::close(fd) != 0 && status.ok()) status = ErrnoStatus("close " + target, errno);
  if (status.ok()) status = CheckDeadline(deadline, "write " + path);
  if (status.ok() && options.atomic) {
    const int rc = options.overwrite ? ::rename(target.c_str(), path.c_str())
                                     : ::renameat2(AT_FDCWD, target.c_str(), AT_FDCWD, path.c_str(),
                                                   RENAME_NOREPLACE);
    if (rc != 0) status = ErrnoStatus("rename " + target + " to " + path, errno);
  }
  if (!status.ok()) {
    ::unlink(target.c_str());  // no partial file is left behind under any name
    return status;
  }
  return options.sync_directory ? FsyncDirectory(parent) : OkStatus();
}

StatusOr<std::vector<uint8_t>> LocalStorage::Read(const std::string& path, int64_t offset,
                                                  int64_t length, Deadline deadline) {
  LOCKSTEP_RETURN_IF_ERROR(CheckDeadline(deadline, "read " + path));
  if (offset < 0) return InvalidArgumentError("read " + path + ": negative offset");
  int fd;
  LOCKSTEP_SYSCALL_RETRY(fd, ::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd < 0) return ErrnoStatus("open " + path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return ErrnoStatus("stat " + path, error);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return FailedPreconditionError("read " + path + ": is a directory");
  }
  const int64_t available = std::max<int64_t>(0, static_cast<int64_t>(st.st_size) - offset);
  const int64_t want = length < 0 ? available : std::min(length, available);
  std::vector<uint8_t> bytes(static_cast<size_t>(want));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n;
    LOCKSTEP_SYSCALL_RETRY(n, ::pread(fd, bytes.data() + done, bytes.size() - done,
                                      static_cast<off_t>(offset + done)));
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return ErrnoStatus("read " + path, error);
    }
    if (n == 0) {
      ::close(fd);
      return DataLossError("read " + path + ": file shrank while reading (" + std::to_string(done) +
                           " of " + std::to_string(want) + " bytes)");
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return bytes;
}

StatusOr<FileInfo> LocalStorage::Stat(const std::string& path, Deadline deadline) {
  LOCKSTEP_RETURN_IF_ERROR(CheckDeadline(deadline, "stat " + path));
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("stat " + path, errno);
  return InfoFromStat(path == "/" ? "" : BaseName(path), st);
}

StatusOr<std::vector<FileInfo>> LocalStorage::List(const std::string& dir, Deadline deadline) {
  LOCKSTEP_RETURN_IF_ERROR(CheckDeadline(deadline, "list " + dir));
  DIR* handle = ::opendir(dir.c_str());
  if (handle == nullptr) return ErrnoStatus("list " + dir, errno);
  std::vector<FileInfo> entries;
  while (struct dirent* entry = ::readdir(handle)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    // An entry deleted between readdir and stat is simply not listed.
    if (::fstatat(::dirfd(handle), name.c_str(), &st, 0) != 0) continue;
    entries.push_back(InfoFromStat(name, st));
  }
  ::closedir(handle);
  std::sort(entries.begin(), entries.end(),
            [](const FileInfo& a, const FileInfo& b) { return a.name < b.name; });
  return entries;
}

Status LocalStorage::MakeDirs(const std::string& path, Deadline deadline) {
  LOCKSTEP_RETURN_IF_ERROR(CheckDeadline(deadline, "mkdirs " + path));
  return MakeDirsSynced(path, /*sync=*/true);
}

Status LocalStorage::SyncDirectory(const std::string& dir, Deadline deadline) {
  LOCKSTEP_RETURN_IF_ERROR(CheckDeadline(deadline, "sync " + dir));
  return FsyncDirectory(dir);
}

Status LocalStorage::Rename(const std::string& src, const std::string& dst, Deadline deadline) {
  LOCKSTEP_RETURN_IF_ERROR(CheckDeadline(deadline, "rename " + src));
  if (::renameat2(AT_FDCWD, src.c_str(), AT_FDCWD, dst.c_str(), RENAME_NOREPLACE) != 0) {
    const int error = errno;
    if (error == EEXIST) {
      return AlreadyExistsError("rename " + src + " to " + dst + ": destination exists");
    }
    return ErrnoStatus("rename " + src + " to " + dst, error);
  }
  LOCKSTEP_RETURN_IF_ERROR(FsyncDirectory(ParentPath(dst)));
  if (ParentPath(src) != ParentPath(dst)) LOCKSTEP_RETURN_IF_ERROR(FsyncDirectory(ParentPath(src)));
  return OkStatus();
}

Status LocalStorage::Delete(const std::string& path, bool recursive, Deadline deadline) {
  LOCKSTEP_RETURN_IF_ERROR(CheckDeadline(deadline, "delete " + path));
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return ErrnoStatus("delete " + path, errno);
  if (S_ISDIR(st.st_mode)) {
    if (recursive) {
      LOCKSTEP_RETURN_IF_ERROR(DeleteTree(path));
    } else if (::rmdir(path.c_str()) != 0) {
      const int error = errno;
      if (error == ENOTEMPTY || error == EEXIST) {
        return FailedPreconditionError("delete " + path + ": directory is not empty");
      }
      return ErrnoStatus("delete " + path, error);
    }
  } else if (::unlink(path.c_str()) != 0) {
    return ErrnoStatus("delete " + path, errno);
  }
  return FsyncDirectory(ParentPath(path));
}

}  // namespace lockstep::checkpoint
