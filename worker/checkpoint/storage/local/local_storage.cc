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

Status WriteAll(int fd, std::string_view bytes, const std::string& path) {
  size_t written = 0;
  while (written < bytes.size()) {
    ssize_t n;
    LOCKSTEP_SYSCALL_RETRY(n, ::write(fd, bytes.data() + written, bytes.size() - written));
    if (n < 0) return ErrnoStatus("write " + path, errno);
    written += static_cast<size_t>(n);
  }
  return OkStatus();
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
  LOCKSTEP_RETURN_IF_ERROR(MakeDirs(parent, deadline));
  struct stat st;
  if (!options.overwrite && ::stat(path.c_str(), &st) == 0) {
    return AlreadyExistsError("write " + path + ": file exists");
  }
  const std::string temp = UniqueTempName(path);
  int fd;
  LOCKSTEP_SYSCALL_RETRY(fd, ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd < 0) return ErrnoStatus("create " + temp, errno);
  Status status;
  for (size_t k = 0; k < pieces.size() && status.ok(); ++k) {
    status = WriteAll(fd, pieces[k], temp);
  }
  if (status.ok()) {
    int rc;
    LOCKSTEP_SYSCALL_RETRY(rc, ::fsync(fd));
    if (rc != 0) status = ErrnoStatus("fsync " + temp, errno);
  }
  if (::close(fd) != 0 && status.ok()) status = ErrnoStatus("close " + temp, errno);
  if (status.ok()) status = CheckDeadline(deadline, "write " + path);
  if (status.ok()) {
    const int rc = options.overwrite ? ::rename(temp.c_str(), path.c_str())
                                     : ::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, path.c_str(),
                                                   RENAME_NOREPLACE);
    if (rc != 0) status = ErrnoStatus("rename " + temp + " to " + path, errno);
  }
  if (!status.ok()) {
    ::unlink(temp.c_str());  // no partial file is left behind under any name
    return status;
  }
  return FsyncDirectory(parent);
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
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return OkStatus();
    return AlreadyExistsError("mkdirs " + path + ": exists and is not a directory");
  }
  if (path != "/" && path != ".") LOCKSTEP_RETURN_IF_ERROR(MakeDirs(ParentPath(path), deadline));
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return ErrnoStatus("mkdir " + path, errno);
  }
  return FsyncDirectory(ParentPath(path));
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
