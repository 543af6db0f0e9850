#include "worker/ps/ps_command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "common/env.h"
#include "common/status.h"
#include "worker/ps/ps_server.h"

namespace lockstep::ps {
namespace {

int g_stop_pipe[2] = {-1, -1};

extern "C" void ForwardStop(int signal_number) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  [[maybe_unused]] ssize_t ignored = write(g_stop_pipe[1], &byte, 1);
  errno = saved_errno;
}

int Refuse(const std::string& message) {
  std::cerr << "lockstep-worker ps: " << message << "\n";
  return 2;
}

// A number of the --table value, or nothing (a message naming it is returned through `error`).
template <typename T>
bool ParseNumber(const std::string& text, const std::string& field, T* out, std::string* error) {
  std::istringstream in(text);
  in >> *out;
  if (in.fail() || !in.eof()) {
    *error = "--table: " + field + " \"" + text + "\" is not a number";
    return false;
  }
  return true;
}

bool ParseTable(const std::string& value, TableSpec* table, std::string* error) {
  std::vector<std::string> parts;
  std::stringstream stream(value);
  for (std::string part; std::getline(stream, part, ':');) parts.push_back(part);
  if (parts.size() < 3 || parts.size() > 6 || parts[0].empty()) {
    *error = "--table \"" + value + "\": expected NAME:ROWS:DIM[:LEARNING_RATE[:SEED[:INIT_SCALE]]]";
    return false;
  }
  table->name = parts[0];
  return ParseNumber(parts[1], "rows", &table->rows, error) &&
         ParseNumber(parts[2], "dim", &table->dim, error) &&
         (parts.size() < 4 || ParseNumber(parts[3], "learning rate", &table->learning_rate, error)) &&
         (parts.size() < 5 || ParseNumber(parts[4], "seed", &table->seed, error)) &&
         (parts.size() < 6 || ParseNumber(parts[5], "init scale", &table->init_scale, error));
}

}  // namespace

int RunParameterServerCommand(const std::vector<std::string>& args) {
  ShardServerOptions options;
  options.listen_address = "0.0.0.0:7470";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (i + 1 >= args.size()) return Refuse(flag + " needs a value (see --help)");
    const std::string& value = args[++i];
    std::string error;
    if (flag == "--job") {
      options.job = value;
    } else if (flag == "--shard") {
      if (!ParseNumber(value, "--shard", &options.shard, &error)) return Refuse(error);
    } else if (flag == "--shards") {
      if (!ParseNumber(value, "--shards", &options.shards, &error)) return Refuse(error);
    } else if (flag == "--listen") {
      options.listen_address = value;
    } else if (flag == "--table") {
      TableSpec table;
      if (!ParseTable(value, &table, &error)) return Refuse(error);
      options.tables.push_back(table);
    } else {
      return Refuse("unknown flag " + flag);
    }
  }
  options.token = EnvString("LOCKSTEP_JOB_TOKEN", "");
  if (options.job.empty()) return Refuse("--job is required");
  if (options.token.empty()) return Refuse("LOCKSTEP_JOB_TOKEN is not set");
  if (options.tables.empty()) return Refuse("no --table: a server must hold a table");

  if (pipe2(g_stop_pipe, O_CLOEXEC) != 0) {
    std::cerr << "lockstep-worker ps: cannot make the signal pipe\n";
    return 1;
  }
  struct sigaction action {};
  action.sa_handler = ForwardStop;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);

  StatusOr<std::unique_ptr<ShardServer>> server = ShardServer::Start(options);
  if (!server.ok()) {
    std::cerr << "lockstep-worker ps: " << server.status() << "\n";
    return server.status().code() == StatusCode::kInvalidArgument ||
                   server.status().code() == StatusCode::kResourceExhausted
               ? 2
               : 1;
  }
  std::cout << "parameter server " << options.shard << " of " << options.shards << " of job "
            << options.job << " listening on port " << (*server)->port() << std::endl;
  // Serve until a signal arrives (the handler writes its number to the pipe).
  unsigned char byte = 0;
  while (true) {
    struct pollfd watched {g_stop_pipe[0], POLLIN, 0};
    const int ready = poll(&watched, 1, 1000);
    if (ready < 0 && errno != EINTR) break;
    if (ready > 0 && read(g_stop_pipe[0], &byte, 1) == 1) break;
  }
  const ShardServerStats stats = (*server)->stats();
  std::cout << "parameter server " << options.shard << " stopping (signal " << int{byte}
            << "): " << stats.pulls << " pulls, " << stats.pushes << " pushes, " << stats.refused
            << " refused" << std::endl;
  // Calls still in flight a second after the signal are cancelled.
  (*server)->Shutdown(/*deadline_ms=*/1000);
  return 0;
}

}  // namespace lockstep::ps
