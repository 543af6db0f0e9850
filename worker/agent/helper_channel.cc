#include "worker/agent/helper_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <nlohmann/json.hpp>

#include "common/errno_check.h"
#include "common/logging.h"
#include "worker/agent/wake_pipe.h"

namespace lockstep::agent {
namespace {

// A helper says a few lines per generation; more unread than this is a runaway program.
constexpr size_t kMaxQueuedMessages = 4096;
// The reader checks for a stop request this often while the program is quiet.
constexpr int kReadPollMs = 200;

StatusOr<int64_t> NonNegativeField(const nlohmann::json& message, const char* name) {
  auto it = message.find(name);
  if (it == message.end() || !it->is_number_integer() || it->get<int64_t>() < 0) {
    return InvalidArgumentError(std::string("helper message: \"") + name +
                                "\" must be a non-negative integer");
  }
  return it->get<int64_t>();
}

}  // namespace

StatusOr<HelperMessage> ParseHelperMessage(const std::string& line) {
  const nlohmann::json message = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (message.is_discarded() || !message.is_object()) {
    return InvalidArgumentError("helper message: not a JSON object");
  }
  auto type = message.find("type");
  if (type == message.end() || !type->is_string()) {
    return InvalidArgumentError("helper message: \"type\" missing");
  }
  HelperMessage parsed;
  const std::string& name = type->get_ref<const std::string&>();
  if (name == "hello") {
    parsed.type = HelperMessage::Type::kHello;
    return parsed;
  }
  if (name == "awaiting") {
    parsed.type = HelperMessage::Type::kAwaiting;
    auto variable = message.find("variable");
    if (variable == message.end() || !variable->is_string() || variable->empty()) {
      return InvalidArgumentError("helper message: \"variable\" must be a non-empty string");
    }
    parsed.variable = variable->get<std::string>();
    return parsed;
  }
  if (name == "training") {
    parsed.type = HelperMessage::Type::kTraining;
    LOCKSTEP_ASSIGN_OR_RETURN(parsed.step, NonNegativeField(message, "step"));
  } else if (name == "left") {
    parsed.type = HelperMessage::Type::kLeft;
  } else {
    return InvalidArgumentError("helper message: unknown type \"" + name + "\"");
  }
  LOCKSTEP_ASSIGN_OR_RETURN(parsed.generation, NonNegativeField(message, "generation"));
  return parsed;
}

std::string EncodeAssignment(const rendezvous::Assignment& a, const GenerationPlan& plan,
                             const std::vector<std::pair<std::string, std::string>>& variables) {
  nlohmann::json env = nlohmann::json::object();
  for (const auto& [name, value] : variables) env[name] = value;
  nlohmann::json message = {{"type", "assign"},
                            {"generation", a.generation},
                            {"rank", a.rank},
                            {"world_size", a.world_size},
                            {"master_addr", plan.master_addr},
                            {"master_port", plan.master_port},
                            {"restart_count", plan.restart_count},
                            {"env", env}};
  return message.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string EncodeGenerationEnded(int64_t generation) {
  return nlohmann::json{{"type", "ended"}, {"generation", generation}}.dump();
}

void HelperChannel::Pair::CloseProgramEnd() {
  if (program_fd >= 0) close(program_fd);
  program_fd = -1;
}

StatusOr<HelperChannel::Pair> HelperChannel::Create() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return ErrnoStatus("helper channel: socketpair", errno);
  }
  Pair pair;
  pair.channel.reset(new HelperChannel(fds[0]));
  pair.program_fd = fds[1];
  return pair;
}

HelperChannel::HelperChannel(int fd) : fd_(fd) {
  reader_ = std::thread([this] { ReadLoop(); });
}

HelperChannel::~HelperChannel() {
  stop_.store(true);
  shutdown(fd_, SHUT_RDWR);
  if (reader_.joinable()) reader_.join();
  close(fd_);
}

Status HelperChannel::Send(const std::string& line) {
  const std::string out = line + "\n";
  ssize_t sent;
  LOCKSTEP_SYSCALL_RETRY(sent, send(fd_, out.data(), out.size(), MSG_DONTWAIT | MSG_NOSIGNAL));
  if (sent < 0) return ErrnoStatus("helper channel: send", errno);
  if (static_cast<size_t>(sent) != out.size()) {
    return UnavailableError("helper channel: the program does not read its channel");
  }
  return OkStatus();
}

std::vector<HelperMessage> HelperChannel::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<HelperMessage> out;
  out.swap(received_);
  return out;
}

std::string HelperChannel::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void HelperChannel::ReadLoop() {
  std::string pending;
  char buffer[4096];
  auto finish = [this](const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = why;
    }
    closed_.store(true);
    Wake(kWakeHelper);
  };
  while (!stop_.load()) {
    struct pollfd readable {
      fd_, POLLIN, 0
    };
    const int ready = poll(&readable, 1, kReadPollMs);
    if (ready == 0) continue;
    if (ready < 0) {
      if (errno == EINTR) continue;
      return finish(ErrnoStatus("helper channel: poll", errno).message());
    }
    ssize_t got;
    LOCKSTEP_SYSCALL_RETRY(got, read(fd_, buffer, sizeof(buffer)));
    if (got <= 0) return finish(got == 0 ? "" : ErrnoStatus("helper channel", errno).message());
    pending.append(buffer, static_cast<size_t>(got));
    bool any = false;
    size_t start = 0;
    for (size_t newline; (newline = pending.find('\n', start)) != std::string::npos;) {
      StatusOr<HelperMessage> message =
          ParseHelperMessage(pending.substr(start, newline - start));
      start = newline + 1;
      if (!message.ok()) return finish(message.status().message());
      std::lock_guard<std::mutex> lock(mu_);
      if (received_.size() >= kMaxQueuedMessages) {
        error_ = "helper channel: more than " + std::to_string(kMaxQueuedMessages) +
                 " messages unread";
        closed_.store(true);
        Wake(kWakeHelper);
        return;
      }
      received_.push_back(*message);
      any = true;
    }
    pending.erase(0, start);
    if (pending.size() > kMaxHelperLineBytes) {
      return finish("helper channel: a line longer than " +
                    std::to_string(kMaxHelperLineBytes) + " bytes");
    }
    if (any) Wake(kWakeHelper);
  }
}

}  // namespace lockstep::agent
