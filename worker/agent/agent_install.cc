#include "worker/agent/agent_install.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "common/errno_check.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;

Status Errno(const std::string& what) { return ErrnoStatus(what, errno); }

// Copies the regular file `from` to `to` with `mode`: written to "<to>.partial" and renamed.
StatusOr<int64_t> CopyFile(const std::string& from, const std::string& to, mode_t mode) {
  int in;
  LOCKSTEP_SYSCALL_RETRY(in, open(from.c_str(), O_RDONLY | O_CLOEXEC));
  if (in < 0) return Errno("cannot read " + from);
  const std::string partial = to + ".partial";
  int out;
  LOCKSTEP_SYSCALL_RETRY(out,
                         open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
  if (out < 0) {
    Status status = Errno("cannot write " + to);
    close(in);
    return status;
  }
  int64_t copied = 0;
  std::vector<char> buffer(1 << 20);
  Status status;
  while (true) {
    ssize_t got;
    LOCKSTEP_SYSCALL_RETRY(got, read(in, buffer.data(), buffer.size()));
    if (got < 0) {
      status = Errno("cannot read " + from);
      break;
    }
    if (got == 0) break;
    for (ssize_t done = 0; done < got;) {
      ssize_t wrote;
      LOCKSTEP_SYSCALL_RETRY(wrote, write(out, buffer.data() + done, got - done));
      if (wrote < 0) {
        status = Errno("cannot write " + to);
        break;
      }
      done += wrote;
    }
    if (!status.ok()) break;
    copied += got;
  }
  close(in);
  // The mode as given, whatever the umask took from it at open.
  if (status.ok() && fchmod(out, mode) != 0) status = Errno("cannot set the mode of " + to);
  if (close(out) != 0 && status.ok()) status = Errno("cannot write " + to);
  if (status.ok() && rename(partial.c_str(), to.c_str()) != 0) status = Errno("cannot write " + to);
  if (!status.ok()) {
    unlink(partial.c_str());
    return status;
  }
  return copied;
}

Status MakeFolder(const std::string& path, mode_t mode) {
  if (mkdir(path.c_str(), mode) == 0) return Status();
  if (errno != EEXIST) return Errno("cannot create " + path);
  struct stat info {};
  if (stat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return FailedPreconditionError("cannot create " + path + ": something else is there");
  }
  return Status();
}

Status CopyLink(const std::string& from, const std::string& to) {
  std::error_code error;
  const fs::path points_to = fs::read_symlink(from, error);
  if (error) return InternalError("cannot read the link " + from + ": " + error.message());
  const std::string partial = to + ".partial";
  unlink(partial.c_str());
  if (symlink(points_to.c_str(), partial.c_str()) != 0) return Errno("cannot write " + to);
  if (rename(partial.c_str(), to.c_str()) != 0) {
    Status status = Errno("cannot write " + to);
    unlink(partial.c_str());
    return status;
  }
  return Status();
}

}  // namespace

StatusOr<std::string> BundleOf(const std::string& program) {
  std::error_code error;
  const fs::path resolved = fs::canonical(program, error);
  if (error) return NotFoundError("cannot resolve " + program + ": " + error.message());
  const fs::path bundle = resolved.parent_path().parent_path();
  if (!fs::is_regular_file(bundle / kBundleInfoFile, error)) {
    return NotFoundError(resolved.string() + " is not part of an agent bundle (no " +
                         (bundle / kBundleInfoFile).string() +
                         "; scripts/bundle/agent.sh makes one)");
  }
  return bundle.string();
}

StatusOr<AgentInstallReport> InstallAgentBundle(const std::string& bundle,
                                                const std::string& target) {
  std::error_code error;
  if (!fs::is_regular_file(fs::path(bundle) / kBundleInfoFile, error)) {
    return NotFoundError(bundle + " is not an agent bundle (no " + kBundleInfoFile + ")");
  }
  if (Status made = MakeFolder(target, 0755); !made.ok()) return made;
  // A target without it holds no whole bundle until this install has ended.
  const std::string info_to = (fs::path(target) / kBundleInfoFile).string();
  if (unlink(info_to.c_str()) != 0 && errno != ENOENT) return Errno("cannot write " + info_to);
  AgentInstallReport report;
  fs::recursive_directory_iterator it(bundle, fs::directory_options::none, error);
  if (error) return InternalError("cannot list " + bundle + ": " + error.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (error) return InternalError("cannot list " + bundle + ": " + error.message());
    // Lexically: fs::relative would follow a link to what it names.
    const fs::path relative = it->path().lexically_relative(bundle);
    if (relative == kBundleInfoFile) continue;  // last
    const std::string from = it->path().string();
    const std::string to = (fs::path(target) / relative).string();
    struct stat info {};
    if (lstat(from.c_str(), &info) != 0) return Errno("cannot read " + from);
    const mode_t mode = info.st_mode & 07777;
    if (S_ISDIR(info.st_mode)) {
      if (Status made = MakeFolder(to, mode); !made.ok()) return made;
    } else if (S_ISLNK(info.st_mode)) {
      if (Status linked = CopyLink(from, to); !linked.ok()) return linked;
      ++report.files;
    } else if (S_ISREG(info.st_mode)) {
      StatusOr<int64_t> copied = CopyFile(from, to, mode);
      if (!copied.ok()) return copied.status();
      ++report.files;
      report.bytes += *copied;
    }
  }
  const std::string info_from = (fs::path(bundle) / kBundleInfoFile).string();
  StatusOr<int64_t> copied = CopyFile(info_from, info_to, 0644);
  if (!copied.ok()) return copied.status();
  ++report.files;
  report.bytes += *copied;
  return report;
}

}  // namespace lockstep::agent
