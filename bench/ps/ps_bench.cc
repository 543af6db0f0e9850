// The sparse click model (worker/ps/sparse_model.h) trained through parameter servers in each
// mode, against the same model with its embedding table all-reduced whole every step (what
// Lockstep's trainer does with every parameter), side by side in one run. Workers are threads,
// servers are in-process ShardServers over real gRPC on loopback, and the all-reduce is Lockstep's
// own Communicator (shared memory between the threads, as between the processes of one host).
//
//   ps_bench [--rows 1048576] [--samples 50000] [--test-samples 10000] [--batch 64]
//            [--epochs 3] [--target-auc 0.72] [--allreduce-steps 40]
//
// One line per configuration: mode, workers, servers, samples/s (all workers), bytes per step
// per worker (what went over the wire: pulls and pushes, or the all-reduce's ring traffic
// 2(W-1)/W x the gradient), the test AUC after --epochs, and the seconds to reach --target-auc
// (from runs of 1 .. --epochs epochs, the first that reaches it; "-" if none). The all-reduce is
// timed over its first --allreduce-steps steps (its rate does not change), and as synchronous SGD
// on the same global batches it takes the sync mode's steps to the target: its time to the target
// is those samples at its rate.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/rendezvous/kv_store.h"
#include "common/spec/training_job.h"
#include "common/tls/certificates.h"
#include "worker/comm/communicator_factory.h"
#include "worker/ps/click_log.h"
#include "worker/ps/ps_job.h"
#include "worker/ps/ps_server.h"
#include "worker/ps/sparse_model.h"

namespace lockstep::ps {
namespace {

struct Options {
  int64_t rows = int64_t{1} << 20;
  int64_t samples = 50000;
  int64_t test_samples = 10000;
  int64_t batch = 64;
  int epochs = 3;
  double target_auc = 0.72;
  int64_t allreduce_steps = 40;
  double learning_rate = 0.5;  // per worker batch; sync and all-reduce use workers x this
};

struct Result {
  double seconds = 0;
  double samples_per_second = 0;
  double bytes_per_step = 0;  // per worker
  double auc = 0;
  int64_t steps = 0;  // per worker
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

spec::TrainingJob Job(const Options& options, const std::string& mode, int workers, int servers,
                      int epochs) {
  const double rate = mode == "sync" ? options.learning_rate * workers : options.learning_rate;
  const std::string yaml =
      "apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: bench}\nspec:\n"
      "  replicas: " +
      std::to_string(workers) + "\n  parameterServers: {replicas: " + std::to_string(servers) +
      "}\n  trainer:\n    model: {hidden: [64], embedding: {fields: 8, "
      "dim: 8, rows: " +
      std::to_string(options.rows) +
      "}}\n    data: {format: clickLog, train: "
      "[t.tsv]}\n    batchSize: " +
      std::to_string(options.batch) + "\n    epochs: " + std::to_string(epochs) +
      "\n    optimizer: {type: sgd, learningRate: " + std::to_string(rate) +
      ", momentum: 0}\n    logIntervalSteps: 1000000\n    sync: "
      "{strategy: parameterServer, parameterServer: {mode: " +
      mode + "}}\n";
  StatusOr<spec::TrainingJob> job = spec::ParseTrainingJobYaml(yaml, "bench");
  if (!job.ok()) {
    std::fprintf(stderr, "%s\n", job.status().ToString().c_str());
    std::exit(1);
  }
  return *job;
}

// The servers' TLS as the operator and `lockstep run` set it up: a CA, a certificate for
// 127.0.0.1 (chain with the CA), the workers trusting the CA.
struct BenchTls {
  std::string cert_pem, key_pem, ca_pem;
};

BenchTls MakeBenchTls() {
  StatusOr<tls::KeyPair> ca = tls::CreateCertificateAuthority("ps_bench ca", 1);
  StatusOr<tls::KeyPair> serving =
      ca.ok() ? tls::IssueServingCertificate(*ca, {}, {"127.0.0.1"}, 1) : ca.status();
  if (!serving.ok()) {
    std::fprintf(stderr, "%s\n", serving.status().ToString().c_str());
    std::exit(1);
  }
  return {serving->cert_pem + ca->cert_pem, serving->key_pem, ca->cert_pem};
}

Result RunThroughServers(const Options& options, const std::string& mode, int workers, int servers,
                         int epochs, const ClickLog& train, const ClickLog& test,
                         const BenchTls* tls = nullptr) {
  const spec::TrainingJob job = Job(options, mode, workers, servers, epochs);
  StatusOr<std::vector<TableSpec>> tables = JobTables(job);
  std::vector<std::unique_ptr<ShardServer>> shards;
  std::vector<std::string> addresses;
  for (int s = 0; s < servers; ++s) {
    ShardServerOptions server;
    server.job = "default/bench";
    server.token = "bench";
    server.shard = s;
    server.shards = servers;
    server.workers = workers;
    server.tables = *tables;
    if (tls != nullptr) {
      server.tls_cert_pem = tls->cert_pem;
      server.tls_key_pem = tls->key_pem;
    }
    StatusOr<std::unique_ptr<ShardServer>> started = ShardServer::Start(server);
    if (!started.ok()) {
      std::fprintf(stderr, "%s\n", started.status().ToString().c_str());
      std::exit(1);
    }
    addresses.push_back("127.0.0.1:" + std::to_string((*started)->port()));
    shards.push_back(std::move(*started));
  }
  std::vector<PsTrainingResult> results(workers);
  std::vector<std::thread> threads;
  const double started = Now();
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      PsClientOptions client_options;
      client_options.servers = addresses;
      client_options.job = "default/bench";
      client_options.token = "bench";
      if (tls != nullptr) client_options.tls_ca_pem = tls->ca_pem;
      auto client = PsClient::Connect(client_options);
      PsTrainingOptions training;
      training.job = job;
      training.worker = w;
      StatusOr<PsTrainingResult> result =
          TrainThroughServers(training, train, w == 0 ? &test : nullptr, **client);
      if (!result.ok()) {
        std::fprintf(stderr, "worker %d: %s\n", w, result.status().ToString().c_str());
        std::exit(1);
      }
      results[w] = *result;
    });
  }
  for (std::thread& thread : threads) thread.join();
  Result out;
  out.seconds = Now() - started;
  uint64_t bytes = 0;
  for (const PsTrainingResult& result : results) {
    bytes += result.traffic.request_bytes + result.traffic.response_bytes;
    out.steps = std::max(out.steps, result.steps);
  }
  out.samples_per_second = static_cast<double>(out.steps * workers * options.batch) / out.seconds;
  out.bytes_per_step = static_cast<double>(bytes) / static_cast<double>(out.steps * workers);
  out.auc = results[0].test_auc;
  return out;
}

// A table held whole in this worker whose pushes are gradients to keep (not applied): what a
// data-parallel trainer all-reduces.
class GradientTable final : public TableRows {
 public:
  GradientTable(std::vector<float>& values, std::vector<float>& gradients, int32_t dim)
      : values_(values), gradients_(gradients), dim_(dim) {}
  int32_t dim() const override { return dim_; }
  Status Pull(const std::vector<uint64_t>& rows, float* out) override {
    for (size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(out + i * dim_, values_.data() + rows[i] * dim_, dim_ * sizeof(float));
    }
    return OkStatus();
  }
  Status Push(const std::vector<uint64_t>& rows, const float* values, PushKind) override {
    for (size_t i = 0; i < rows.size(); ++i) {
      float* target = gradients_.data() + rows[i] * dim_;
      for (int32_t j = 0; j < dim_; ++j) target[j] += values[i * dim_ + j];
    }
    return OkStatus();
  }

 private:
  std::vector<float>& values_;
  std::vector<float>& gradients_;
  const int32_t dim_;
};

// Data parallelism with the table replicated: each step every worker's gradient of the whole
// table and the MLP is summed over the workers (all-reduce) and every replica applies it.
Result RunAllreduce(const Options& options, int workers, const ClickLog& train,
                    const ClickLog& test) {
  const spec::TrainingJob job = Job(options, "sync", workers, 1, 1);
  StatusOr<SparseModelSpec> spec = SparseModelSpecOf(job);
  std::unique_ptr<rendezvous::KeyValueStore> store = rendezvous::NewInMemoryStore();
  std::vector<Result> results(workers);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  const double learning_rate = spec->learning_rate;
  const int64_t steps = options.allreduce_steps;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      comm::CommunicatorOptions comm_options;
      comm_options.rank = w;
      comm_options.size = workers;
      comm_options.job_name = "ps-bench-" + std::to_string(getpid());
      auto communicator = comm::CreateCommunicator(comm_options, *store);
      auto model = SparseModel::Create(*spec);
      if (!communicator.ok() || !model.ok()) {
        ++failures;
        return;
      }
      const TableSpec table = EmbeddingTable(*spec);
      const int64_t mlp = static_cast<int64_t>((*model)->mlp_params().size());
      const int64_t dense_rows = (mlp + kDenseRowWidth - 1) / kDenseRowWidth;
      // One buffer: the table's rows, then the MLP padded to whole rows of 64.
      const size_t table_floats = static_cast<size_t>(table.rows * table.dim);
      std::vector<float> embeddings(table_floats), dense(dense_rows * kDenseRowWidth, 0.0f);
      for (int64_t r = 0; r < table.rows; ++r) {
        for (int32_t j = 0; j < table.dim; ++j) {
          embeddings[r * table.dim + j] = InitialValue(table, static_cast<uint64_t>(r), j);
        }
      }
      std::copy((*model)->mlp_params().begin(), (*model)->mlp_params().end(), dense.begin());
      std::vector<float> gradient(table_floats + dense.size());
      std::vector<float> embedding_gradient(table_floats), dense_gradient(dense.size());
      GradientTable embedding_rows(embeddings, embedding_gradient, table.dim);
      GradientTable dense_table(dense, dense_gradient, kDenseRowWidth);
      const int64_t batches = (train.samples + options.batch - 1) / options.batch;
      SparseStepOptions step_options;
      step_options.share = 1.0f / static_cast<float>(workers);
      const double started = Now();
      for (int64_t step = 0; step < steps; ++step) {
        std::fill(embedding_gradient.begin(), embedding_gradient.end(), 0.0f);
        std::fill(dense_gradient.begin(), dense_gradient.end(), 0.0f);
        const int64_t first = ((step * workers + w) % batches) * options.batch;
        const int64_t rows = std::min(options.batch, train.samples - first);
        if (!(*model)->Step(train, first, rows, embedding_rows, &dense_table, step_options).ok()) {
          ++failures;
          return;
        }
        std::copy(embedding_gradient.begin(), embedding_gradient.end(), gradient.begin());
        std::copy(dense_gradient.begin(), dense_gradient.end(), gradient.begin() + table_floats);
        if (!(*communicator)
                 ->AllReduce(gradient.data(), gradient.size(), comm::DataType::kFloat32,
                             comm::ReduceOp::kSum, 60000)
                 .ok()) {
          ++failures;
          return;
        }
        const float scale = -static_cast<float>(learning_rate);
        for (size_t i = 0; i < table_floats; ++i) embeddings[i] += scale * gradient[i];
        for (size_t i = 0; i < dense.size(); ++i) dense[i] += scale * gradient[table_floats + i];
      }
      Result& out = results[w];
      out.seconds = Now() - started;
      out.steps = steps;
      out.bytes_per_step = 2.0 * (workers - 1) / workers * gradient.size() * sizeof(float);
      if (w == 0) {
        auto predicted = (*model)->Predict(test, 0, test.samples, embedding_rows, &dense_table);
        out.auc = predicted.ok() ? Auc(*predicted, test.labels) : 0;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  if (failures > 0) {
    std::fprintf(stderr, "the all-reduce baseline failed\n");
    std::exit(1);
  }
  Result out = results[0];
  double slowest = 0;
  for (const Result& result : results) slowest = std::max(slowest, result.seconds);
  out.samples_per_second = static_cast<double>(steps * workers * options.batch) / slowest;
  return out;
}

std::string Seconds(double seconds) {
  if (seconds < 0) return "-";
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", seconds);
  return text;
}

}  // namespace
}  // namespace lockstep::ps

int main(int argc, char** argv) {
  using namespace lockstep::ps;
  lockstep::SetLogLevel(lockstep::LogLevel::kWarning);
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const double value = std::atof(argv[i + 1]);
    if (flag == "--rows")
      options.rows = static_cast<int64_t>(value);
    else if (flag == "--samples")
      options.samples = static_cast<int64_t>(value);
    else if (flag == "--test-samples")
      options.test_samples = static_cast<int64_t>(value);
    else if (flag == "--batch")
      options.batch = static_cast<int64_t>(value);
    else if (flag == "--epochs")
      options.epochs = static_cast<int>(value);
    else if (flag == "--target-auc")
      options.target_auc = value;
    else if (flag == "--allreduce-steps")
      options.allreduce_steps = static_cast<int64_t>(value);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  ClickLogSpec log_spec;
  log_spec.samples = options.samples + options.test_samples;
  log_spec.vocabulary = 200;
  const ClickLog log = GenerateClickLog(log_spec);
  ClickLog train = log, test;
  train.samples = options.samples;
  train.ids.resize(static_cast<size_t>(options.samples * log.fields));
  train.labels.resize(static_cast<size_t>(options.samples));
  test.samples = options.test_samples;
  test.fields = log.fields;
  test.ids.assign(log.ids.begin() + options.samples * log.fields, log.ids.end());
  test.labels.assign(log.labels.begin() + options.samples, log.labels.end());
  const std::vector<double> truth(log.probabilities.begin() + options.samples,
                                  log.probabilities.end());
  std::printf(
      "click log: %lld train, %lld test samples, 8 fields; ceiling AUC %.4f; table %lld "
      "rows x 8; batch %lld per worker; target AUC %.3f\n",
      static_cast<long long>(options.samples), static_cast<long long>(options.test_samples),
      Auc(truth, test.labels), static_cast<long long>(options.rows),
      static_cast<long long>(options.batch), options.target_auc);
  std::printf("%-10s %7s %7s %12s %14s %8s %10s\n", "mode", "workers", "servers", "samples/s",
              "bytes/step", "AUC", "to target");
  double sync_epochs_to_target[8] = {0};
  for (int workers : {2, 4}) {
    for (const std::string mode : {"sync", "async", "geo"}) {
      for (int servers : {1, 2}) {
        // Epochs 1 .. N: the first whose AUC reaches the target gives the time to it.
        double to_target = -1;
        Result last;
        for (int epochs = 1; epochs <= options.epochs; ++epochs) {
          last = RunThroughServers(options, mode, workers, servers, epochs, train, test);
          if (to_target < 0 && last.auc >= options.target_auc) {
            to_target = last.seconds;
            if (mode == "sync") sync_epochs_to_target[workers] = epochs;
          }
        }
        std::printf("%-10s %7d %7d %12.0f %14.0f %8.4f %10s\n", mode.c_str(), workers, servers,
                    last.samples_per_second, last.bytes_per_step, last.auc,
                    Seconds(to_target).c_str());
        std::fflush(stdout);
      }
    }
    const Result allreduce = RunAllreduce(options, workers, train, test);
    const double epochs = sync_epochs_to_target[workers];
    const double to_target =
        epochs > 0 ? epochs * options.samples / allreduce.samples_per_second : -1;
    std::printf("%-10s %7d %7s %12.0f %14.0f %8s %10s\n", "allreduce", workers, "-",
                allreduce.samples_per_second, allreduce.bytes_per_step, "-",
                Seconds(to_target).c_str());
    std::fflush(stdout);
  }
  // What TLS costs the servers' traffic: async (the mode that sends most), 4 workers, 2 servers,
  // one epoch, plaintext and TLS in turn five times; the median rate of each and their ratio.
  const BenchTls tls = MakeBenchTls();
  std::vector<double> plain_rates, tls_rates;
  for (int i = 0; i < 5; ++i) {
    plain_rates.push_back(
        RunThroughServers(options, "async", 4, 2, 1, train, test).samples_per_second);
    tls_rates.push_back(
        RunThroughServers(options, "async", 4, 2, 1, train, test, &tls).samples_per_second);
  }
  std::sort(plain_rates.begin(), plain_rates.end());
  std::sort(tls_rates.begin(), tls_rates.end());
  std::printf(
      "TLS against plaintext (async, 4 workers, 2 servers, 1 epoch, median of 5 in turn): "
      "%.0f against %.0f samples/s, ratio %.3f\n",
      tls_rates[2], plain_rates[2], tls_rates[2] / plain_rates[2]);
  return 0;
}
