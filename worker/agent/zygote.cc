#include "worker/agent/zygote.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <regex>

#include "common/deadline.h"
#include "common/errno_check.h"
#include "common/logging.h"

namespace lockstep::agent {
namespace {

// Bounds a zygote's message (its answers are a few dozen bytes; "ready" lists module names).
constexpr size_t kMaxMessageBytes = 64 * 1024;
constexpr int kForkedFds = 4;  // stdout, stderr, helper channel, go pipe

bool IsPythonInterpreter(const std::string& path) {
  static const std::regex name(R"(python[0-9]*(\.[0-9]+)?)");
  const size_t slash = path.rfind('/');
  return std::regex_match(slash == std::string::npos ? path : path.substr(slash + 1), name);
}

}  // namespace

std::optional<std::vector<std::string>> ZygoteArgv(const std::vector<std::string>& argv) {
  if (argv.empty() || !IsPythonInterpreter(argv[0])) return std::nullopt;
  // Options that take no argument and leave PYTHONPATH in force (-E and -I would ignore it).
  static const std::regex flags(R"(-[bBdOqsSuvR]+)");
  std::vector<std::string> zygote = {argv[0]};
  size_t i = 1;
  for (; i < argv.size() && argv[i].size() > 1 && argv[i][0] == '-'; ++i) {
    const std::string& arg = argv[i];
    if (arg == "-m") break;
    if ((arg == "-X" || arg == "-W") && i + 1 < argv.size()) {
      zygote.push_back(arg);
      zygote.push_back(argv[++i]);
    } else if (std::regex_match(arg, flags)) {
      zygote.push_back(arg);
    } else {
      return std::nullopt;  // -c, -E, -I, --help, an option with its value attached, ...
    }
  }
  if (i >= argv.size() || argv[i] == "-") return std::nullopt;  // interactive, or stdin
  if (argv[i] == "-m" && i + 1 >= argv.size()) return std::nullopt;
  zygote.insert(zygote.end(), {"-m", "lockstep.zygote", "--"});
  zygote.insert(zygote.end(), argv.begin() + static_cast<std::ptrdiff_t>(i), argv.end());
  return zygote;
}

StatusOr<std::unique_ptr<Zygote>> Zygote::Start(ChildProcess::Options options,
                                                const std::vector<std::string>& zygote_argv) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    return ErrnoStatus("zygote: socketpair", errno);
  }
  std::unique_ptr<Zygote> zygote(new Zygote());
  zygote->control_fd_ = fds[0];
  options.argv = zygote_argv;
  options.output_prefix = "[zygote] ";
  options.inherit_fd = fds[1];
  options.idle_priority = false;
  options.env.push_back(std::string(kZygoteFdEnv) + "=" + std::to_string(fds[1]));
  StatusOr<std::unique_ptr<ChildProcess>> process = ChildProcess::Start(options);
  close(fds[1]);
  if (!process.ok()) return process.status();  // the destructor closes control_fd_
  zygote->process_ = std::move(*process);
  if (!zygote->process_->running()) {
    return FailedPreconditionError("zygote did not start: " + zygote->process_->exit()->Describe());
  }
  return zygote;
}

Zygote::~Zygote() {
  if (control_fd_ >= 0) close(control_fd_);  // the zygote exits at end-of-file
  if (process_) process_->Stop(/*grace_ms=*/1000, /*kill_wait_ms=*/5000);
}

Status Zygote::Broken(Status status) {
  if (!broken_) {
    broken_ = true;
    LOCKSTEP_LOG(WARNING) << "zygote (pid " << pid() << "): " << status
                          << "; processes start without it";
  }
  return status;
}

void Zygote::MarkBroken(Status status) { (void)Broken(std::move(status)); }

bool Zygote::Usable() {
  if (broken_) return false;
  if (std::optional<ChildExit> exit = process_->TryReap()) {
    MarkBroken(UnavailableError("exited: " + exit->Describe()));
    return false;
  }
  return true;
}

bool Zygote::Ready() {
  if (ready_) return Usable();
  if (!Usable()) return false;
  StatusOr<std::string> message = Receive(/*timeout_ms=*/0);
  if (!message.ok()) {
    if (message.status().code() != StatusCode::kDeadlineExceeded) {
      MarkBroken(message.status());
    } else if (ready_by_.expired()) {
      MarkBroken(DeadlineExceededError("its imports not done within " +
                                       std::to_string(kZygoteReadyTimeoutMs / 1000) + " s"));
    }
    return false;
  }
  const nlohmann::json ready = nlohmann::json::parse(*message, nullptr, false);
  if (ready.is_discarded() || !ready.is_object() || ready.value("ready", false) != true) {
    MarkBroken(InvalidArgumentError("expected its \"ready\" message, got: " + *message));
    return false;
  }
  ready_ = true;
  const auto elastic = ready.find("elastic");
  script_imports_elastic_ = elastic != ready.end() && elastic->is_boolean() && elastic->get<bool>();
  LOCKSTEP_LOG(INFO) << "zygote (pid " << pid() << ") ready; preloaded "
                     << ready.value("preloaded", nlohmann::json::array()).dump() << " ("
                     << ready.value("threads", 0) << " thread(s))"
                     << (ready.value("not_found", nlohmann::json::array()).empty()
                             ? std::string()
                             : ", not found " + ready["not_found"].dump());
  return true;
}

StatusOr<std::string> Zygote::Receive(int64_t timeout_ms) {
  struct pollfd readable {
    control_fd_, POLLIN, 0
  };
  int ready;
  LOCKSTEP_SYSCALL_RETRY(ready, poll(&readable, 1, static_cast<int>(timeout_ms)));
  if (ready < 0) return ErrnoStatus("zygote: poll", errno);
  if (ready == 0)
    return DeadlineExceededError("zygote: no answer within " + std::to_string(timeout_ms) + " ms");
  std::string buffer(kMaxMessageBytes, '\0');
  ssize_t got;
  LOCKSTEP_SYSCALL_RETRY(got, recv(control_fd_, buffer.data(), buffer.size(), MSG_DONTWAIT));
  if (got < 0) return ErrnoStatus("zygote: recv", errno);
  if (got == 0) return UnavailableError("zygote closed its control socket");
  buffer.resize(static_cast<size_t>(got));
  return buffer;
}

StatusOr<std::unique_ptr<ChildProcess>> Zygote::Fork(const ChildProcess::Options& options,
                                                     int channel_fd) {
  if (!ready_ || !Usable()) return FailedPreconditionError("zygote: not ready");
  // Pipes: the spare's stdout and stderr, and the go pipe it waits on until it is supervised.
  int pipes[3][2];
  for (int i = 0; i < 3; ++i) {
    if (pipe2(pipes[i], O_CLOEXEC) != 0) {
      const int error = errno;
      for (int j = 0; j < i; ++j) close(pipes[j][0]), close(pipes[j][1]);
      return ErrnoStatus("zygote: pipe", error);
    }
  }
  auto [out_read, out_write] = pipes[0];
  auto [err_read, err_write] = pipes[1];
  auto [go_read, go_write] = pipes[2];
  std::string request;  // the environment as execve takes it: bytes, whatever they are
  for (const std::string& entry : options.env) request.append(entry).push_back('\0');
  const int passed[kForkedFds] = {out_write, err_write, channel_fd, go_read};
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(passed))] = {};
  struct iovec data {
    request.data(), request.size()
  };
  struct msghdr message {};
  message.msg_iov = &data;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  struct cmsghdr* rights = CMSG_FIRSTHDR(&message);
  rights->cmsg_level = SOL_SOCKET;
  rights->cmsg_type = SCM_RIGHTS;
  rights->cmsg_len = CMSG_LEN(sizeof(passed));
  std::memcpy(CMSG_DATA(rights), passed, sizeof(passed));
  ssize_t sent;
  LOCKSTEP_SYSCALL_RETRY(sent, sendmsg(control_fd_, &message, MSG_NOSIGNAL | MSG_DONTWAIT));
  const int send_error = errno;
  close(out_write);
  close(err_write);
  close(go_read);
  // Closing the go pipe unwritten makes a spare that was forked exit before it runs anything.
  auto give_up = [&](Status status) {
    close(out_read);
    close(err_read);
    close(go_write);
    return Broken(std::move(status));
  };
  if (sent != static_cast<ssize_t>(request.size())) {
    return give_up(ErrnoStatus("zygote: sendmsg", sent < 0 ? send_error : EMSGSIZE));
  }
  StatusOr<std::string> answer = Receive(kZygoteForkTimeoutMs);
  if (!answer.ok()) return give_up(answer.status());
  const nlohmann::json reply = nlohmann::json::parse(*answer, nullptr, false);
  if (!reply.is_object() || !reply.contains("pid") || !reply["pid"].is_number_integer() ||
      reply["pid"].get<int64_t>() <= 1) {
    return give_up(UnavailableError("fork failed: " + *answer));
  }
  const auto pid = static_cast<pid_t>(reply["pid"].get<int64_t>());
  StatusOr<std::unique_ptr<ChildProcess>> spare =
      ChildProcess::Adopt(pid, out_read, err_read, options);
  if (!spare.ok()) {
    close(go_write);
    return Broken(spare.status());
  }
  const char go = 'g';
  ssize_t written;
  LOCKSTEP_SYSCALL_RETRY(written, write(go_write, &go, 1));
  close(go_write);
  if (written != 1) {
    // It died before it read the go (a closed pipe): supervised all the same, it is reaped.
    LOCKSTEP_LOG(WARNING) << "zygote: the spare (pid " << pid << ") did not take its go";
  }
  return spare;
}

}  // namespace lockstep::agent
