#include "worker/ps/ps_command.h"

#include <signal.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <sstream>
#include <vector>

#include "common/command_line.h"
#include "common/env.h"
#include "common/spec/training_job.h"
#include "common/status.h"
#include "worker/agent/wake_pipe.h"
#include "worker/ps/ps_credentials.h"
#include "worker/ps/ps_job.h"
#include "worker/ps/ps_metrics.h"
#include "worker/ps/ps_server.h"

namespace lockstep::ps {
namespace {

int Refuse(const std::string& message) {
  std::cerr << "lockstep-worker ps: " << message << "\n";
  return 2;
}

// A field of a --table value as a number, or nothing (a message naming it is returned through
// `error`).
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
    *error =
        "--table \"" + value + "\": expected NAME:ROWS:DIM[:LEARNING_RATE[:SEED[:INIT_SCALE]]]";
    return false;
  }
  table->name = parts[0];
  return ParseNumber(parts[1], "rows", &table->rows, error) &&
         ParseNumber(parts[2], "dim", &table->dim, error) &&
         (parts.size() < 4 ||
          ParseNumber(parts[3], "learning rate", &table->learning_rate, error)) &&
         (parts.size() < 5 || ParseNumber(parts[4], "seed", &table->seed, error)) &&
         (parts.size() < 6 || ParseNumber(parts[5], "init scale", &table->init_scale, error));
}

}  // namespace

int RunParameterServerCommand(const std::vector<std::string>& args) {
  ShardServerOptions options;
  options.listen_address = "0.0.0.0:7470";
  std::string manifest_path;
  int64_t manifest_metrics_port = 0;
  std::vector<std::string> table_texts;
  CLI::App app{"Serves one shard of a job's embedding tables to its workers until SIGTERM.",
               "lockstep-worker ps"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--job", options.job, "the job, NAMESPACE/NAME (default: the manifest's)")
      ->type_name("JOB");
  app.add_option("--shard", options.shard, "this server's shard")
      ->transform(DecimalInteger())
      ->type_name("N");
  app.add_option("--shards", options.shards, "the job's shards")
      ->transform(DecimalInteger())
      ->type_name("N");
  app.add_option("--workers", options.workers, "the job's workers, whose clocks this server keeps")
      ->transform(DecimalInteger())
      ->type_name("N");
  app.add_option("--listen", options.listen_address, "the address to serve on")
      ->type_name("HOST:PORT");
  app.add_option("--manifest", manifest_path,
                 "the job's manifest: its tables, workers, shards and checkpoints (default: "
                 "$LOCKSTEP_SPEC when no --table is given)")
      ->type_name("FILE");
  app.add_option("--table", table_texts,
                 "tables to hold, instead of a manifest's (repeatable; one flag may name several)")
      ->type_name("NAME:ROWS:DIM[:LEARNING_RATE[:SEED[:INIT_SCALE]]]")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  const CommandLineParse parsed = ParseCommandLine(app, args);
  if (parsed.help) {
    std::cout << app.help();
    return 0;
  }
  if (!parsed.error.empty()) return Refuse(parsed.error + " (see --help)");
  for (const std::string& text : table_texts) {
    TableSpec table;
    std::string error;
    if (!ParseTable(text, &table, &error)) return Refuse(error);
    options.tables.push_back(table);
  }
  if (!manifest_path.empty() ||
      (options.tables.empty() && !EnvString("LOCKSTEP_SPEC", "").empty())) {
    // The job's own tables and workers, from its manifest (a pod's LOCKSTEP_SPEC).
    if (!options.tables.empty()) return Refuse("--table and a manifest: give one of them");
    StatusOr<spec::TrainingJob> job = spec::LoadTrainingJobFileOrEnv(manifest_path);
    if (!job.ok()) return Refuse(job.status().message());
    StatusOr<std::vector<TableSpec>> tables = JobTables(*job);
    if (!tables.ok()) return Refuse(tables.status().message());
    options.tables = *tables;
    options.workers = job->spec.replicas;
    options.shards = job->spec.parameter_servers.replicas;
    options.checkpoint_uri = job->spec.checkpoint.uri;
    options.checkpoint_interval_steps = job->spec.checkpoint.interval_steps;
    options.checkpoint_keep = job->spec.checkpoint.keep;
    manifest_metrics_port = job->spec.metrics.port;
    if (options.job.empty()) {
      options.job = EnvString("LOCKSTEP_JOB", job->metadata.namespace_ + "/" + job->metadata.name);
    }
  }
  if (options.job.empty()) return Refuse("--job is required");
  StatusOr<PsServerCredentials> credentials = PsServerCredentialsFromEnvironment();
  if (!credentials.ok()) return Refuse(credentials.status().message());
  options.token = credentials->token;
  options.tls_cert_pem = credentials->tls_cert_pem;
  options.tls_key_pem = credentials->tls_key_pem;
  if (options.tables.empty()) return Refuse("no --table: a server must hold a table");

  if (Status installed = agent::InstallWakePipe({SIGTERM, SIGINT}); !installed.ok()) {
    std::cerr << "lockstep-worker ps: " << installed << "\n";
    return 1;
  }
  StatusOr<std::unique_ptr<ShardServer>> server = ShardServer::Start(options);
  if (!server.ok()) {
    std::cerr << "lockstep-worker ps: " << server.status() << "\n";
    return server.status().code() == StatusCode::kInvalidArgument ||
                   server.status().code() == StatusCode::kResourceExhausted
               ? 2
               : 1;
  }
  // Metrics on LOCKSTEP_METRICS_PORT, else the manifest's spec.metrics.port (0: none).
  const int64_t metrics_port = EnvInt("LOCKSTEP_METRICS_PORT", manifest_metrics_port);
  StatusOr<std::unique_ptr<PsMetrics>> metrics =
      PsMetrics::Create(options.job, options.shard, static_cast<int>(metrics_port), **server);
  if (!metrics.ok()) {
    std::cerr << "lockstep-worker ps: " << metrics.status() << "\n";
    return metrics.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::cout << "parameter server " << options.shard << " of " << options.shards << " of job "
            << options.job << " listening on port " << (*server)->port() << std::endl;
  if (const int64_t restored = (*server)->stats().restored_step; restored >= 0) {
    std::cout << "parameter server " << options.shard << " restored its shard from the checkpoint "
              << "of step " << restored << " under " << options.checkpoint_uri
              << ": what the workers pushed to it after that step is lost" << std::endl;
  }
  // Serve until a signal arrives (the wake pipe carries its number).
  int signal_number = 0;
  while (signal_number == 0) {
    for (unsigned char what : agent::WaitForWakes(/*timeout_ms=*/1000)) signal_number = what;
  }
  const ShardServerStats stats = (*server)->stats();
  std::cout << "parameter server " << options.shard << " stopping (signal " << signal_number
            << "): " << stats.pulls << " pulls, " << stats.pushes << " pushes, " << stats.refused
            << " refused" << std::endl;
  // Calls still in flight a second after the signal are cancelled.
  (*server)->Shutdown(/*deadline_ms=*/1000);
  return 0;
}

}  // namespace lockstep::ps
