#include "cli/run_command.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>

#include "cli/console_relay.h"
#include "cli/exit_codes.h"
#include "cli/launcher.h"
#include "cli/progress_display.h"
#include "cli/run_report.h"
#include "cli/run_setup.h"
#include "cli/run_watch.h"
#include "common/command_line.h"
#include "common/deadline.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/rendezvous/server.h"

namespace lockstep::cli {

namespace {

constexpr int64_t kPollIntervalMs = 250;  // also the TTY redraw period
constexpr int64_t kServerShutdownMs = 2000;
constexpr int64_t kMaxRestartBackoffMs = 10000;

int TerminalColumns() {
  struct winsize size {};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

StatusOr<int32_t> ParseReplicas(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < 1 || value > kMaxLocalRanks) {
    return InvalidArgumentError("--replicas: expected an integer in [1, " +
                                std::to_string(kMaxLocalRanks) + "], got \"" + text + "\"");
  }
  return static_cast<int32_t>(value);
}

// `lockstep run`'s command line, defined once for parsing and for --help. The values CLI11
// cannot check as the old parser did (--replicas' bound, --console's words) are read as text and
// checked after, with the same messages.
struct RunFlags {
  RunOptions options;
  std::string replicas;
  std::string console = "all";
};

std::unique_ptr<CLI::App> RunCommandLine(RunFlags& flags) {
  auto app = std::make_unique<CLI::App>(
      "Runs a TrainingJob on this machine: its workers as lockstep-worker processes and an "
      "in-process rendezvous service.",
      "lockstep run");
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app->add_option("FILE", flags.options.manifest_path, "the TrainingJob manifest")->required();
  app->add_option("--replicas", flags.replicas, "number of workers (default: spec.replicas)")
      ->type_name("N");
  app->add_option("--summary", flags.options.summary_path, "write the result as JSON to FILE")
      ->type_name("FILE");
  app->add_option("--log-dir", flags.options.log_dir,
                  "worker logs (default: ./lockstep-logs/<name>-<time>/)")
      ->type_name("DIR");
  app->add_option("--console", flags.console,
                  "an exec job's program output on the console, each line prefixed with its "
                  "rank: all (default), rank0 or none; the logs keep it all")
      ->type_name("WHO");
  return app;
}

}  // namespace

std::string RunUsage() {
  RunFlags flags;
  return RunCommandLine(flags)->help();
}

StatusOr<RunOptions> ParseRunArgs(const std::vector<std::string>& args) {
  RunFlags flags;
  std::unique_ptr<CLI::App> app = RunCommandLine(flags);
  const CommandLineParse parsed = ParseCommandLine(*app, args);
  if (parsed.help) {
    flags.options.help = true;
    return flags.options;
  }
  if (!parsed.error.empty()) return InvalidArgumentError(parsed.error);
  RunOptions& options = flags.options;
  if (app->count("--replicas") > 0) {
    LOCKSTEP_ASSIGN_OR_RETURN(options.replicas, ParseReplicas(flags.replicas));
  }
  if (app->count("--summary") > 0 && options.summary_path.empty()) {
    return InvalidArgumentError("--summary: empty path");
  }
  if (app->count("--log-dir") > 0 && options.log_dir.empty()) {
    return InvalidArgumentError("--log-dir: empty path");
  }
  if (options.manifest_path.empty()) return InvalidArgumentError("FILE: empty path");
  LOCKSTEP_ASSIGN_OR_RETURN(options.console, ParseConsoleRanks(flags.console));
  return options;
}

int RunRunCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  StatusOr<RunOptions> options = ParseRunArgs(args);
  if (!options.ok()) {
    err << "lockstep run: " << options.status().message() << "\n" << RunUsage();
    return kExitBadInput;
  }
  if (options->help) {
    out << RunUsage();
    return kExitOk;
  }
  if (HeartbeatTimeoutMs() < 500 || HeartbeatTimeoutMs() > 600000) {
    err << "lockstep run: LOCKSTEP_HEARTBEAT_TIMEOUT_MS: expected 500..600000 ms, got "
        << HeartbeatTimeoutMs() << "\n";
    return kExitBadInput;
  }

  // 1. Nothing starts unless the manifest and its data are sound.
  LocalRun run;
  if (int code = PrepareLocalRun(*options, err, &run); code != kExitOk) return code;
  // The in-process rendezvous service logs every join and generation at info level; on a
  // terminal that would tear the progress line, so only warnings show unless asked for.
  if (EnvString("LOCKSTEP_LOG_LEVEL", "").empty()) SetLogLevel(LogLevel::kWarning);

  // 2. The rendezvous service, in-process, for this one job.
  StatusOr<std::string> token = GenerateJobToken();
  if (!token.ok()) {
    err << "lockstep run: " << token.status().message() << "\n";
    return kExitFailure;
  }
  rendezvous::ServerOptions server_options;
  server_options.listen_address = "127.0.0.1:0";
  auto server = rendezvous::RendezvousServer::Start(server_options);
  if (!server.ok()) {
    err << "lockstep run: rendezvous service: " << server.status().message() << "\n";
    return kExitFailure;
  }
  if (Status status = (*server)->AddJob(LocalJobConfig(run, *token)); !status.ok()) {
    err << "lockstep run: rendezvous service: " << status.message() << "\n";
    (*server)->Shutdown(kServerShutdownMs);
    return kExitFailure;
  }

  // 3. The workers (and parameter servers). Their servers' key and certificates serve this run
  // only: removed on every way out, failures included.
  struct RemovedAtExit {
    std::string dir;
    ~RemovedAtExit() {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  } ps_tls{LocalParameterServerTlsDir(run.log_dir)};
  int32_t worker_slots = 0;
  StatusOr<std::vector<WorkerCommand>> commands =
      LocalCommands(run, "127.0.0.1:" + std::to_string((*server)->port()), *token, &worker_slots);
  if (!commands.ok()) {
    err << "lockstep run: " << commands.status().message() << "\n";
    (*server)->Shutdown(kServerShutdownMs);
    return kExitFailure;
  }
  Supervisor supervisor(LocalSupervisorOptions(run),
                        std::make_unique<RunPolicyRestarts>(
                            run.job.spec.run_policy, RunRestartBackoffMs(), kMaxRestartBackoffMs,
                            /*workers_restart_their_commands=*/run.exec));
  // Before the workers start: the console shows this run's lines, not a reused log's old ones.
  std::optional<ConsoleRelay> console;
  if (run.exec) {
    std::vector<std::string> log_paths;
    for (const WorkerCommand& command : *commands) log_paths.push_back(command.log_path);
    console.emplace(log_paths, options->console);
  }
  const double started_at = MonotonicSeconds();
  if (Status status = supervisor.Start(*commands); !status.ok()) {
    err << "lockstep run: " << status.message() << "\n";
    (*server)->Shutdown(kServerShutdownMs);
    return kExitFailure;
  }
  out << RunningLine(run) << std::flush;

  // 4. Watch until done, failed or interrupted.
  const bool tty = isatty(STDOUT_FILENO) == 1;
  ProgressDisplayOptions display_options;
  display_options.tty = tty;
  display_options.columns = tty ? TerminalColumns() : 0;
  display_options.plain_interval_ms = std::max<int64_t>(1, RunProgressIntervalMs());
  ProgressDisplay display(out, display_options);
  WatchOptions watch_options;
  watch_options.poll_interval_ms = kPollIntervalMs;
  watch_options.rendezvous_timeout_ms = RendezvousTimeoutMs();
  watch_options.drain_ms = RunCompletionDrainMs();
  watch_options.worker_slots = worker_slots;
  RunEnd end;
  end.outcome = WatchUntilDone(run.job, watch_options, supervisor, **server, display,
                               console ? &*console : nullptr, out, started_at);
  display.Clear();

  // Stop whatever still runs; bounded by the grace period plus the kill wait.
  const int32_t still_running = supervisor.running();
  if (still_running > 0) {
    if (end.outcome.interrupt_signal != 0) {
      out << "lockstep: " << (end.outcome.interrupt_signal == SIGINT ? "interrupted" : "terminated")
          << "; stopping " << still_running << " worker" << (still_running == 1 ? "" : "s") << "\n"
          << std::flush;
    }
    supervisor.StopAll();
  }
  // The last lines, after the exits: the workers write no more, so this drains.
  if (console) {
    do {
      PrintProgramLines(*console, display, out);
    } while (console->read_last_poll());
  }
  end.wall_seconds = MonotonicSeconds() - started_at;
  end.snapshot = end.outcome.snapshot;
  if (StatusOr<rendezvous::JobSnapshot> latest = (*server)->Snapshot(run.key); latest.ok()) {
    end.snapshot = *latest;
  }
  (*server)->Shutdown(kServerShutdownMs);

  // 5. Report.
  return ReportRun(run, end, supervisor, options->summary_path, out, err);
}

}  // namespace lockstep::cli
