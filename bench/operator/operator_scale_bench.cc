// operator_scale_bench: N TrainingJobs of M workers applied at once to a real kube-apiserver
// 1.20.2 + etcd on loopback (tests/support/kube), with lockstep-operator creating their pods;
// beside it, in the same run and against the same server, a plain client (lockstep's own
// KubeClient, several threads) creating the same N*M pods directly: the API server's own rate.
//
//   operator_scale_bench --jobs 1000 --workers-per-job 4            # the issue's figure
//   operator_scale_bench --jobs 50                                  # quick smoke check
//   operator_scale_bench --operator-qps 50 --operator-burst 100      # what users get by default
//
// Phases, each timed with a steady clock:
//   1. server "before": T threads create the N*M pods directly into namespace bench-direct-1
//      (pods as the operator would build them, DesiredPod(), without the job label and owner, so
//      the operator's informer never sees them);
//   2. the operator: started and ready (caches synced) first; then T threads create the N jobs
//      into bench-ops; a pod watch and a job watch in that namespace time every pod's arrival
//      and every job's first status; done when N*M pods exist and every job has a phase;
//   3. server "after": the same as 1 into bench-direct-2, with the operator idle beside it.
// Reconcile quantiles come from the operator's histogram lockstep_operator_reconcile_duration_
// seconds, interpolated within buckets as Prometheus' histogram_quantile() does. Memory is the
// operator's VmHWM and VmRSS from /proc/<pid>/status (and a 50 ms RSS sampler); CPU seconds of
// the operator, kube-apiserver, etcd and this process come from /proc/<pid>/stat.
//
// With --webhook the operator also serves its admission webhook, registered (failurePolicy Fail)
// for every TrainingJob write, so each of the N creates of phase 2 passes through it; reported:
// the operator's own review time (lockstep_operator_admission_duration_seconds), the API
// server's time per webhook call (apiserver_admission_webhook_admission_duration_seconds: TLS,
// the request and the review), and, side by side in the same run after phase 2, the client's
// latency of creating N suspended jobs (no pods) into a namespace the webhook covers and N into
// one it skips (interleaved on the same threads), whose difference is what the webhook adds to
// an apply.
//
// No kubelet runs: pods stay Pending. Exit status 0 when every pod appeared, 1 otherwise.
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/spec/training_job.h"
#include "operator/kube/kube_client.h"
#include "operator/kube/kube_config.h"
#include "operator/kube/resource.h"
#include "operator/trainingjob/children.h"
#include "tests/support/kube/kube_testenv.h"
#include "tests/support/kube/training_job_manifest.h"
#include "tests/support/kube/training_job_webhook.h"
#include "tests/support/process/process.h"

namespace lockstep::bench {
namespace {

using json = nlohmann::json;
using testing::JobManifest;
using testing::KubeTestEnv;
namespace kube = op::kube;
namespace res = op::kube::resources;

const std::string kSource = LOCKSTEP_SOURCE_DIR;
const std::string kOperatorBinary = LOCKSTEP_OPERATOR_BINARY;

struct Options {
  int jobs = 1000;
  int workers_per_job = 4;
  int client_threads = 8;   // threads creating jobs (and direct pods)
  double operator_qps = 0;  // 0: no client-side limit
  int operator_burst = 1000;
  int operator_workers = 4;  // concurrent reconciles (the operator's default)
  bool server_baseline = true;
  bool webhook = false;
  int64_t timeout_s = 900;
  std::string json_path;
  std::vector<std::string> extra_operator_flags;
  std::vector<std::pair<std::string, std::string>> operator_env;
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// --- /proc -------------------------------------------------------------------------------------

// kB of a /proc/<pid>/status field (VmHWM, VmRSS); -1 when unreadable.
int64_t StatusKb(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, field.size() + 1, field + ":") == 0) {
      return std::atoll(line.c_str() + field.size() + 1);
    }
  }
  return -1;
}

// utime + stime of a process, seconds; 0 when gone.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string f;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14 || i == 15) ticks += std::atof(f.c_str());
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double SelfCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 + usage.ru_stime.tv_sec +
         usage.ru_stime.tv_usec / 1e6;
}

// The first process whose argv[0] ends with `name` and whose command line mentions `marker`.
pid_t FindProcess(const std::string& name, const std::string& marker) {
  DIR* proc = opendir("/proc");
  if (!proc) return 0;
  pid_t found = 0;
  while (dirent* entry = readdir(proc)) {
    const pid_t pid = std::atoi(entry->d_name);
    if (pid <= 0) continue;
    std::ifstream in(std::string("/proc/") + entry->d_name + "/cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string argv0 = cmdline.substr(0, cmdline.find('\0'));
    if (argv0.size() >= name.size() &&
        argv0.compare(argv0.size() - name.size(), name.size(), name) == 0 &&
        cmdline.find(marker) != std::string::npos) {
      found = pid;
      break;
    }
  }
  closedir(proc);
  return found;
}

struct CpuSnapshot {
  double op = 0, apiserver = 0, etcd = 0, self = 0, wall = 0;
};
struct Pids {
  pid_t op = 0, apiserver = 0, etcd = 0;
  CpuSnapshot Take() const {
    return {op ? CpuSeconds(op) : 0, CpuSeconds(apiserver), CpuSeconds(etcd), SelfCpuSeconds(),
            Now()};
  }
};
CpuSnapshot Delta(const CpuSnapshot& a, const CpuSnapshot& b) {
  return {b.op - a.op, b.apiserver - a.apiserver, b.etcd - a.etcd, b.self - a.self,
          b.wall - a.wall};
}

// --- manifests ---------------------------------------------------------------------------------

std::string JobName(int i) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "job-%05d", i);
  return buffer;
}

void CreateNamespace(KubeTestEnv& env, const std::string& name) {
  env.Request("POST", "/api/v1/namespaces",
              json{{"apiVersion", "v1"}, {"kind", "Namespace"}, {"metadata", {{"name", name}}}});
}

// Runs body(i) for i in [0, n) on `threads` threads; returns the wall seconds.
double ParallelFor(int n, int threads, const std::function<void(int)>& body) {
  std::atomic<int> next{0};
  const double start = Now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = next++; i < n; i = next++) body(i);
    });
  }
  for (std::thread& thread : pool) thread.join();
  return Now() - start;
}

// The pods the operator would create for the bench's jobs, without what ties them to a job.
std::vector<json> DirectPods(const Options& o, const op::trainingjob::OperatorSettings& settings,
                             std::string* error) {
  std::vector<json> pods;
  for (int j = 0; j < o.jobs; ++j) {
    json manifest = JobManifest(JobName(j), o.workers_per_job);
    manifest["metadata"]["namespace"] = "bench-direct";
    manifest["metadata"]["uid"] = "00000000-0000-0000-0000-" + std::to_string(100000000000 + j);
    StatusOr<spec::TrainingJob> job = spec::ParseTrainingJobJson(manifest, JobName(j));
    if (!job.ok()) {
      *error = job.status().message();
      return {};
    }
    for (int i = 0; i < o.workers_per_job; ++i) {
      json pod = op::trainingjob::DesiredPod(*job, i, settings);
      json& meta = pod["metadata"];
      meta.erase("ownerReferences");
      meta.erase("namespace");
      json& labels = meta["labels"];
      labels["bench.lockstep.io/job-name"] = labels[op::trainingjob::kJobNameLabel];
      labels.erase(op::trainingjob::kJobNameLabel);
      pods.push_back(std::move(pod));
    }
  }
  return pods;
}

struct DirectResult {
  int created = 0, failed = 0;
  double seconds = 0;
  double pods_per_second() const { return seconds > 0 ? created / seconds : 0; }
  std::string first_error;
};

DirectResult CreateDirect(kube::KubeClient* client, const std::string& ns,
                          const std::vector<json>& pods, int threads) {
  DirectResult r;
  std::atomic<int> created{0}, failed{0};
  std::mutex mutex;
  r.seconds = ParallelFor(static_cast<int>(pods.size()), threads, [&](int i) {
    StatusOr<json> done = client->Create(res::kPods, ns, pods[i]);
    if (done.ok()) {
      ++created;
    } else {
      ++failed;
      std::lock_guard<std::mutex> lock(mutex);
      if (r.first_error.empty()) r.first_error = done.status().message();
    }
  });
  r.created = created;
  r.failed = failed;
  return r;
}

// --- watching the operator's work --------------------------------------------------------------

// Watches `resource` in `ns` from `resource_version` until *stop, re-opening the watch when the
// server closes it; calls on_event for every event.
std::thread WatchLoop(kube::KubeClient* client, const kube::Resource& resource,
                      const std::string& ns, std::string resource_version,
                      const std::atomic<bool>* stop,
                      std::function<void(const kube::WatchEvent&)> on_event) {
  return std::thread([=, &resource] {
    std::string rv = resource_version;
    while (!stop->load()) {
      kube::WatchOptions options;
      options.resource_version = rv;
      options.timeout_seconds = 600;
      Status s = client->Watch(
          resource, ns, options,
          [&](const kube::WatchEvent& event) {
            const std::string v = event.object["metadata"].value("resourceVersion", std::string());
            if (!v.empty()) rv = v;
            on_event(event);
            return true;
          },
          stop);
      if (!s.ok() && !stop->load()) {
        std::cerr << "watch " << resource.plural << ": " << s.message() << "\n";
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
  });
}

// --- the operator ------------------------------------------------------------------------------

std::string HttpGet(int port, const std::string& path, int* code) {
  testing::ProcessResult r =
      testing::RunProcess({"/usr/bin/curl", "-s", "-m", "10", "-w", "\n%{http_code}",
                           "http://127.0.0.1:" + std::to_string(port) + path},
                          {}, 15000);
  std::string out = r.out;
  const size_t newline = out.rfind('\n');
  *code = 0;
  if (newline != std::string::npos) {
    *code = std::atoi(out.c_str() + newline + 1);
    out.resize(newline);
  }
  return out;
}

// histogram_quantile(q, ...) over one histogram in Prometheus' text format: linear interpolation
// within the bucket that holds the q-th observation (lower bound 0 for the first bucket; the
// highest finite bound when it falls in +Inf).
struct Histogram {
  std::vector<std::pair<double, double>> buckets;  // (le, cumulative count), +Inf last
  double sum = 0, count = 0;
  double Quantile(double q) const {
    if (buckets.empty() || count <= 0) return NAN;
    const double rank = q * buckets.back().second;
    double lower = 0, below = 0;
    for (size_t i = 0; i < buckets.size(); ++i) {
      const auto& [le, cumulative] = buckets[i];
      if (cumulative >= rank) {
        if (std::isinf(le)) return i > 0 ? buckets[i - 1].first : NAN;
        if (cumulative == below) return le;
        return lower + (le - lower) * (rank - below) / (cumulative - below);
      }
      lower = le;
      below = cumulative;
    }
    return NAN;
  }
  // Share of observations at most `le` (a bucket bound of the histogram).
  double FractionAtMost(double le) const {
    for (const auto& [bound, cumulative] : buckets) {
      if (bound == le && count > 0) return cumulative / count;
    }
    return NAN;
  }
  // The bucket bounds the q-th observation lies between (for honesty about the resolution).
  std::string Bounds(double q) const {
    const double rank = q * buckets.back().second;
    double lower = 0;
    for (const auto& [le, cumulative] : buckets) {
      if (cumulative >= rank) {
        std::ostringstream s;
        s << lower << ".." << le;
        return s.str();
      }
      lower = le;
    }
    return "?";
  }
};

// The histogram `name`; with `labels` (e.g. `operation="CREATE"`), only its series whose label
// set contains that text, summed bucket by bucket (as sum by (le) would).
Histogram ParseHistogram(const std::string& text, const std::string& name,
                         const std::string& labels = "") {
  Histogram h;
  std::map<double, double> buckets;
  std::istringstream lines(text);
  std::string line;
  auto series = [&](const std::string& suffix) {
    const std::string stem = name + suffix;
    if (line.compare(0, stem.size(), stem) != 0 || line.size() <= stem.size()) return false;
    const char next = line[stem.size()];
    if (next != ' ' && next != '{') return false;
    return labels.empty() || line.find(labels) != std::string::npos;
  };
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const double value = std::atof(line.c_str() + line.rfind(' ') + 1);
    if (series("_bucket")) {
      const size_t le = line.find("le=\"");
      const std::string bound = line.substr(le + 4, line.find('"', le + 4) - le - 4);
      buckets[bound == "+Inf" ? INFINITY : std::atof(bound.c_str())] += value;
    } else if (series("_sum")) {
      h.sum += value;
    } else if (series("_count")) {
      h.count += value;
    }
  }
  h.buckets.assign(buckets.begin(), buckets.end());
  std::sort(h.buckets.begin(), h.buckets.end());
  return h;
}

double MetricValue(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.compare(0, name.size() + 1, name + " ") == 0) {
      return std::atof(line.c_str() + name.size() + 1);
    }
  }
  return NAN;
}

// apiserver_request_total summed by "VERB resource[/subresource]", from the server's /metrics.
std::map<std::string, double> ServerRequests(KubeTestEnv& env) {
  std::map<std::string, double> out;
  KubeTestEnv::Response r =
      env.Request("GET", "/metrics", nullptr, "application/json", 30000, "text/plain");
  std::istringstream lines(r.raw);
  std::string line;
  auto label = [](const std::string& l, const std::string& name) {
    const size_t at = l.find("," + name + "=\"") != std::string::npos
                          ? l.find("," + name + "=\"") + 1
                          : l.find("{" + name + "=\"") + 1;
    if (at == 0) return std::string();
    const size_t start = at + name.size() + 2;
    return l.substr(start, l.find('"', start) - start);
  };
  while (std::getline(lines, line)) {
    if (line.compare(0, 24, "apiserver_request_total{") != 0) continue;
    const std::string verb = label(line, "verb"), resource = label(line, "resource"),
                      sub = label(line, "subresource");
    if (resource.empty()) continue;
    out[verb + " " + resource + (sub.empty() ? "" : "/" + sub)] +=
        std::atof(line.c_str() + line.rfind(' ') + 1);
  }
  return out;
}

// The requests between two snapshots, most first: "POST pods 4000, ..."; *writes: the total of
// POST, PUT, PATCH and DELETE.
std::string RequestMix(const std::map<std::string, double>& a,
                       const std::map<std::string, double>& b, double* writes, double* all) {
  std::vector<std::pair<double, std::string>> rows;
  *writes = *all = 0;
  for (const auto& [key, value] : b) {
    auto it = a.find(key);
    const double d = value - (it == a.end() ? 0 : it->second);
    if (d <= 0) continue;
    rows.emplace_back(d, key);
    *all += d;
    const std::string verb = key.substr(0, key.find(' '));
    if (verb == "POST" || verb == "PUT" || verb == "PATCH" || verb == "DELETE") *writes += d;
  }
  std::sort(rows.rbegin(), rows.rend());
  std::ostringstream s;
  for (size_t i = 0; i < rows.size(); ++i) {
    s << (i ? ", " : "") << rows[i].second << " " << static_cast<int64_t>(rows[i].first);
  }
  return s.str();
}

int64_t CountObjects(kube::KubeClient* client, const kube::Resource& resource,
                     const std::string& ns, const std::string& selector = "") {
  kube::ListOptions options;
  options.limit = 500;
  options.label_selector = selector;
  int64_t n = 0;
  options.on_page = [&](std::vector<json>& page) { n += static_cast<int64_t>(page.size()); };
  StatusOr<kube::ListResult> list = client->List(resource, ns, options);
  return list.ok() ? n : -1;
}

// --- the admission webhook ---------------------------------------------------------------------

constexpr char kWebhookConfiguration[] = "bench-webhook";
constexpr char kNoWebhookLabel[] = "lockstep.io/bench-no-webhook";
constexpr char kNoWebhookNamespace[] = "bench-no-webhook";
constexpr char kWebhookNamespace[] = "bench-webhook";

// The chart's webhook (Fail) for every namespace but kNoWebhookNamespace.
bool RegisterWebhook(KubeTestEnv& env, int port, std::string* error) {
  KubeTestEnv::Response r = env.Request(
      "POST", testing::kValidatingWebhookConfigurations,
      testing::TrainingJobWebhookConfiguration(
          kWebhookConfiguration, port, "Fail",
          {{"matchExpressions", {{{"key", kNoWebhookLabel}, {"operator", "DoesNotExist"}}}}}));
  if (r.status != 201) *error = r.raw;
  KubeTestEnv::Response ns = env.Request(
      "POST", "/api/v1/namespaces",
      json{{"apiVersion", "v1"},
           {"kind", "Namespace"},
           {"metadata", {{"name", kNoWebhookNamespace}, {"labels", {{kNoWebhookLabel, "true"}}}}}});
  CreateNamespace(env, kWebhookNamespace);
  return r.status == 201 && ns.status == 201;
}

// Bounded: a dry-run create of a job whose elastic range excludes its replicas is refused.
bool WaitUntilWebhookAnswers(KubeTestEnv& env, int workers_per_job) {
  json invalid = JobManifest("probe", workers_per_job);
  invalid["spec"]["elastic"] = {{"minReplicas", workers_per_job + 1},
                                {"maxReplicas", workers_per_job + 1}};
  return testing::WaitUntilWebhookRefuses(env, "bench-ops", invalid, 60000);
}

struct CreateLatencies {
  int count = 0;
  int failed = 0;
  std::pair<double, double> with{NAN, NAN}, without{NAN, NAN};  // p50, p99 in seconds
};

// N creates of the bench's job, suspended (the operator makes no pods for it), into
// kWebhookNamespace (through the webhook) and N into the namespace it skips, alternating on the
// same threads, so both see the same server load.
CreateLatencies CompareCreates(kube::KubeClient* client, const Options& o) {
  std::mutex mutex;
  int failed = 0;
  std::vector<double> with, without;
  ParallelFor(2 * o.jobs, o.client_threads, [&](int i) {
    const bool through_webhook = i % 2 == 0;
    const std::string ns = through_webhook ? kWebhookNamespace : kNoWebhookNamespace;
    json job = JobManifest("suspended-" + std::to_string(i), o.workers_per_job);
    job["spec"]["runPolicy"] = {{"suspend", true}};
    const double start = Now();
    StatusOr<json> created = client->Create(res::kTrainingJobs, ns, job);
    const double seconds = Now() - start;
    std::lock_guard<std::mutex> lock(mutex);
    if (created.ok()) {
      (through_webhook ? with : without).push_back(seconds);
    } else {
      ++failed;
    }
  });
  auto quantiles = [](std::vector<double> v) {
    if (v.empty()) return std::pair<double, double>{NAN, NAN};
    std::sort(v.begin(), v.end());
    return std::pair<double, double>{v[v.size() / 2],
                                     v[std::min(v.size() - 1, v.size() * 99 / 100)]};
  };
  CreateLatencies result;
  result.count = static_cast<int>(std::min(with.size(), without.size()));
  result.failed = failed;
  result.with = quantiles(with);
  result.without = quantiles(without);
  return result;
}

// --- the run -----------------------------------------------------------------------------------

std::string Fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

int Run(const Options& o) {
  const int total_pods = o.jobs * o.workers_per_job;
  std::string error;
  std::cerr << "operator_scale_bench: starting kube-apiserver + etcd\n";
  std::unique_ptr<KubeTestEnv> env = KubeTestEnv::Start({}, &error);
  if (!env) {
    std::cerr << "kube test env: " << error << "\n";
    return 2;
  }
  if (!env->InstallCrds(kSource + "/crds/trainingjob.yaml", &error)) {
    std::cerr << error << "\n";
    return 2;
  }
  Pids pids;
  pids.apiserver = FindProcess("kube-apiserver", env->dir());
  pids.etcd = FindProcess("etcd", env->dir());

  StatusOr<kube::KubeConfig> config = kube::LoadKubeconfig(env->kubeconfig());
  if (!config.ok()) {
    std::cerr << config.status().message() << "\n";
    return 2;
  }
  kube::ClientOptions unlimited;
  unlimited.qps = 0;
  unlimited.request_timeout_ms = 60000;
  unlimited.user_agent = "operator-scale-bench";
  auto client = kube::KubeClient::Create(*config, unlimited);
  if (!client.ok()) {
    std::cerr << client.status().message() << "\n";
    return 2;
  }
  kube::KubeClient* kc = client->get();
  for (const char* ns : {"bench-direct-1", "bench-ops", "bench-direct-2"}) {
    CreateNamespace(*env, ns);
  }

  const std::vector<int> ports = testing::FreePorts(2);
  if (ports.size() != 2) {
    std::cerr << "no free loopback ports\n";
    return 2;
  }
  const int metrics_port = ports[0];
  const int rendezvous_port = ports[1];
  op::trainingjob::OperatorSettings settings;
  settings.rendezvous_address = "127.0.0.1:" + std::to_string(rendezvous_port);
  settings.default_worker_image = "lockstep-worker:bench";
  std::vector<json> direct_pods = DirectPods(o, settings, &error);
  if (direct_pods.empty()) {
    std::cerr << "building pods: " << error << "\n";
    return 2;
  }
  const size_t pod_bytes = direct_pods[0].dump().size();

  // Warm-up: connections open, the server's caches and etcd's first writes done.
  {
    CreateNamespace(*env, "bench-warmup");
    std::vector<json> warm(direct_pods.begin(),
                           direct_pods.begin() + std::min<size_t>(direct_pods.size(), 100));
    CreateDirect(kc, "bench-warmup", warm, o.client_threads);
  }

  // 1. The server's own rate, before.
  DirectResult before, after;
  std::map<std::string, double> before_requests;
  std::string before_mix;
  double before_writes = 0, before_all = 0;
  CpuSnapshot before_cpu, after_cpu;
  if (o.server_baseline) {
    std::cerr << "server baseline: " << total_pods << " pods from " << o.client_threads
              << " threads\n";
    CpuSnapshot c0 = pids.Take();
    before_requests = ServerRequests(*env);
    before = CreateDirect(kc, "bench-direct-1", direct_pods, o.client_threads);
    before_cpu = Delta(c0, pids.Take());
    before_mix = RequestMix(before_requests, ServerRequests(*env), &before_writes, &before_all);
  }

  // 2. The operator.
  const std::string log_dir = testing::MakeTempDir("operator-scale-bench-");
  const std::string log_path = log_dir + "/operator.log";
  std::vector<std::string> argv = {"/bin/sh",
                                   "-c",
                                   "exec \"$0\" \"$@\" 2>>" + log_path,
                                   kOperatorBinary,
                                   "--kubeconfig=" + env->kubeconfig(),
                                   "--identity=bench-operator",
                                   "--leader-elect=false",
                                   "--leader-election-namespace=default",
                                   "--metrics-host=127.0.0.1",
                                   "--metrics-port=" + std::to_string(metrics_port),
                                   "--rendezvous-host=127.0.0.1",
                                   "--rendezvous-port=" + std::to_string(rendezvous_port),
                                   "--rendezvous-address=" + settings.rendezvous_address,
                                   "--progress-interval-ms=3600000",
                                   "--worker-image=lockstep-worker:bench",
                                   "--qps=" + Fixed(o.operator_qps, 0),
                                   "--burst=" + std::to_string(o.operator_burst),
                                   "--workers=" + std::to_string(o.operator_workers)};
  if (o.webhook) {
    const std::vector<int> webhook_port = testing::FreePorts(1);
    if (webhook_port.size() != 1 || !RegisterWebhook(*env, webhook_port[0], &error)) {
      std::cerr << "registering the webhook: " << error << "\n";
      return 2;
    }
    for (const std::string& flag : {std::string("--webhook-host=127.0.0.1"),
                                    "--webhook-port=" + std::to_string(webhook_port[0]),
                                    std::string("--webhook-configuration=") + kWebhookConfiguration,
                                    std::string("--webhook-ca-check-ms=200")}) {
      argv.push_back(flag);
    }
  }
  for (const std::string& flag : o.extra_operator_flags) argv.push_back(flag);
  std::string operator_command;
  for (size_t i = 3; i < argv.size(); ++i) operator_command += (i > 3 ? " " : "") + argv[i];
  // What varies between runs: the environment, the rate limit and the workers.
  std::string operator_summary = operator_command.substr(operator_command.find("--qps"));
  for (const auto& [key, value] : o.operator_env) {
    operator_summary = key + "=" + value + " " + operator_summary;
  }
  auto operator_process = std::make_unique<testing::ChildProcess>(argv, o.operator_env);
  pids.op = operator_process->pid();
  int code = 0;
  if (!KubeTestEnv::WaitFor(
          [&] {
            HttpGet(metrics_port, "/readyz", &code);
            return code == 200;
          },
          60000)) {
    std::cerr << "lockstep-operator not ready within 60 s:\n" << testing::ReadFile(log_path);
    return 2;
  }
  if (o.webhook && !WaitUntilWebhookAnswers(*env, o.workers_per_job)) {
    std::cerr << "the webhook never answered:\n" << testing::ReadFile(log_path);
    return 2;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const int64_t idle_rss_kb = StatusKb(pids.op, "VmRSS");
  const int64_t idle_anon_kb = StatusKb(pids.op, "RssAnon");

  // Watches first, from the (empty) namespace's resourceVersion.
  std::atomic<bool> stop{false};
  std::mutex mutex;
  double t0 = 0;
  std::vector<double> pod_times;  // seconds after t0, in arrival order
  std::set<std::string> pod_names;
  std::map<std::string, int> pods_per_job;
  std::set<std::string> jobs_with_status;
  double status_done_at = 0;
  auto list_rv = [&](const kube::Resource& resource) {
    kube::ListOptions options;
    options.limit = 1;
    StatusOr<kube::ListResult> r = kc->List(resource, "bench-ops", options);
    return r.ok() ? r->resource_version : std::string();
  };
  std::thread pod_watch = WatchLoop(
      kc, res::kPods, "bench-ops", list_rv(res::kPods), &stop, [&](const kube::WatchEvent& e) {
        if (e.type != kube::WatchEventType::kAdded) return;
        const double t = Now();
        std::lock_guard<std::mutex> lock(mutex);
        if (!pod_names.insert(e.object["metadata"].value("name", "")).second) return;
        pod_times.push_back(t - t0);
        const json labels = e.object["metadata"].value("labels", json::object());
        ++pods_per_job[labels.value(op::trainingjob::kJobNameLabel, std::string("?"))];
      });
  std::thread job_watch =
      WatchLoop(kc, res::kTrainingJobs, "bench-ops", list_rv(res::kTrainingJobs), &stop,
                [&](const kube::WatchEvent& e) {
                  if (e.type == kube::WatchEventType::kBookmark) return;
                  if (!e.object.contains("status") || !e.object["status"].is_object()) return;
                  if (e.object["status"].value("phase", "").empty()) return;
                  const double t = Now();
                  std::lock_guard<std::mutex> lock(mutex);
                  if (jobs_with_status.insert(e.object["metadata"].value("name", "")).second &&
                      static_cast<int>(jobs_with_status.size()) == o.jobs) {
                    status_done_at = t - t0;
                  }
                });
  std::atomic<int64_t> sampled_peak_kb{0};
  std::thread sampler([&] {
    while (!stop.load()) {
      const int64_t kb = StatusKb(pids.op, "VmRSS");
      if (kb > sampled_peak_kb.load()) sampled_peak_kb.store(kb);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // watches open

  std::cerr << "applying " << o.jobs << " TrainingJobs of " << o.workers_per_job << " workers from "
            << o.client_threads << " threads\n";
  std::atomic<int> apply_failed{0};
  std::string apply_error;
  const CpuSnapshot op_c0 = pids.Take();
  const std::map<std::string, double> op_requests0 = ServerRequests(*env);
  t0 = Now();
  const double apply_seconds = ParallelFor(o.jobs, o.client_threads, [&](int j) {
    StatusOr<json> created =
        kc->Create(res::kTrainingJobs, "bench-ops", JobManifest(JobName(j), o.workers_per_job));
    if (!created.ok()) {
      ++apply_failed;
      std::lock_guard<std::mutex> lock(mutex);
      if (apply_error.empty()) apply_error = created.status().message();
    }
  });
  const double deadline = t0 + static_cast<double>(o.timeout_s);
  bool all_pods = false, all_status = false;
  double pods_done_at = 0;
  while (Now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      all_pods = static_cast<int>(pod_times.size()) >= total_pods;
      all_status = static_cast<int>(jobs_with_status.size()) >= o.jobs;
      if (all_pods && pods_done_at == 0) pods_done_at = pod_times.back();
    }
    if (all_pods && all_status) break;
    // Pods are what is measured; a status that never comes is reported, not waited for long.
    if (all_pods && Now() - t0 - pods_done_at > 60) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const CpuSnapshot op_cpu = Delta(op_c0, pids.Take());
  double op_writes = 0, op_all = 0;
  const std::string op_mix = RequestMix(op_requests0, ServerRequests(*env), &op_writes, &op_all);
  // Let the tail (events, the second reconcile of each job after its pods appear) settle.
  double settle_start = Now();
  std::string metrics_text;
  double depth = NAN;
  while (Now() - settle_start < 60) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    metrics_text = HttpGet(metrics_port, "/metrics", &code);
    depth = MetricValue(metrics_text, "lockstep_operator_workqueue_depth");
    if (depth == 0) break;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  metrics_text = HttpGet(metrics_port, "/metrics", &code);
  const int64_t hwm_kb = StatusKb(pids.op, "VmHWM");
  const int64_t end_rss_kb = StatusKb(pids.op, "VmRSS");
  const int64_t end_anon_kb = StatusKb(pids.op, "RssAnon");
  const int64_t end_file_kb = StatusKb(pids.op, "RssFile");
  const int64_t threads = StatusKb(pids.op, "Threads");
  const Histogram reconcile =
      ParseHistogram(metrics_text, "lockstep_operator_reconcile_duration_seconds");
  const double reconcile_errors =
      MetricValue(metrics_text, "lockstep_operator_reconcile_errors_total");
  Histogram admission, server_admission;
  CreateLatencies side_by_side;
  if (o.webhook) {
    admission = ParseHistogram(metrics_text, "lockstep_operator_admission_duration_seconds");
    KubeTestEnv::Response server_metrics =
        env->Request("GET", "/metrics", nullptr, "application/json", 30000, "text/plain");
    server_admission =
        ParseHistogram(server_metrics.raw, "apiserver_admission_webhook_admission_duration_seconds",
                       "name=\"trainingjobs.lockstep.io\",operation=\"CREATE\"");
    std::cerr << "creates with and without the webhook\n";
    side_by_side = CompareCreates(kc, o);
  }

  // 3. The server's own rate, after (operator idle beside it).
  if (o.server_baseline) {
    std::cerr << "server baseline (after)\n";
    CpuSnapshot c0 = pids.Take();
    after = CreateDirect(kc, "bench-direct-2", direct_pods, o.client_threads);
    after_cpu = Delta(c0, pids.Take());
  }
  stop.store(true);
  pod_watch.join();
  job_watch.join();
  sampler.join();

  // Ground truth from the server: pods in the namespace, and pods per job.
  const int64_t listed_pods = CountObjects(kc, res::kPods, "bench-ops");
  const int64_t listed_events = CountObjects(kc, res::kEvents, "bench-ops");
  int jobs_short = 0, jobs_over = 0;
  for (int j = 0; j < o.jobs; ++j) {
    const int n = pods_per_job[JobName(j)];
    if (n < o.workers_per_job) ++jobs_short;
    if (n > o.workers_per_job) ++jobs_over;
  }

  kill(-pids.op, SIGTERM);
  testing::ProcessResult stopped = operator_process->Wait(20000);
  const std::string log = testing::ReadFile(log_path);
  size_t warnings = 0;
  for (size_t at = log.find(" W"); at != std::string::npos; at = log.find(" W", at + 1)) {
    if (at > 0 && log[at - 1] == ']') ++warnings;
  }

  // Rates.
  std::vector<double> times = pod_times;
  std::sort(times.begin(), times.end());
  const int n_pods = static_cast<int>(times.size());
  const double first_pod = n_pods ? times.front() : NAN;
  const double last_pod = n_pods ? times.back() : NAN;
  const double op_rate = n_pods && last_pod > 0 ? n_pods / last_pod : 0;
  double steady_rate = NAN;
  if (n_pods >= 10) {
    const int a = n_pods / 10, b = n_pods * 9 / 10;
    steady_rate = (b - a) / std::max(1e-9, times[b - 1] - times[a - 1]);
  }
  const double server_rate =
      o.server_baseline ? std::max(before.pods_per_second(), after.pods_per_second()) : NAN;

  auto mb = [](int64_t kb) { return Fixed(kb / 1024.0, 1) + " MiB"; };
  auto ms = [](double s) { return Fixed(s * 1000, 1) + " ms"; };
  auto share = [](double cpu, double wall) {
    return Fixed(cpu, 1) + " s (" + Fixed(wall > 0 ? cpu / wall : 0, 2) + " cores)";
  };
  std::ostringstream t;
  t << "\n## operator_scale_bench: " << o.jobs << " TrainingJobs x " << o.workers_per_job
    << " workers = " << total_pods << " pods\n\n";
  t << "operator: " << operator_summary << "\n";
  t << "client threads: " << o.client_threads << "; pod object: " << pod_bytes
    << " bytes of JSON\n\n";
  t << "| measure | value |\n|---|---|\n";
  t << "| jobs applied (" << o.client_threads << " threads) | " << o.jobs - apply_failed.load()
    << " in " << Fixed(apply_seconds, 2) << " s (" << Fixed(o.jobs / apply_seconds, 0)
    << " jobs/s) |\n";
  t << "| first pod after the first apply | " << Fixed(first_pod, 3) << " s |\n";
  t << "| every pod exists (" << n_pods << "/" << total_pods << ") | " << Fixed(last_pod, 2)
    << " s |\n";
  t << "| every job has a status.phase (" << jobs_with_status.size() << "/" << o.jobs << ") | "
    << Fixed(status_done_at, 2) << " s |\n";
  t << "| operator pods/s (all pods / time to the last) | " << Fixed(op_rate, 1) << " |\n";
  t << "| operator pods/s (10%..90% of pods) | " << Fixed(steady_rate, 1) << " |\n";
  if (o.server_baseline) {
    t << "| server pods/s, direct, before (" << o.client_threads << " threads, no limit) | "
      << Fixed(before.pods_per_second(), 1) << " (" << before.created << " in "
      << Fixed(before.seconds, 2) << " s) |\n";
    t << "| server pods/s, direct, after (operator idle) | " << Fixed(after.pods_per_second(), 1)
      << " (" << after.created << " in " << Fixed(after.seconds, 2) << " s) |\n";
    t << "| **operator ÷ server** (best of before/after) | **" << Fixed(op_rate / server_rate, 2)
      << "** |\n";
  }
  t << "| reconciles (count; errors) | " << reconcile.count << "; " << reconcile_errors << " |\n";
  t << "| reconcile mean | " << ms(reconcile.count ? reconcile.sum / reconcile.count : NAN)
    << " |\n";
  t << "| reconcile p50 (histogram_quantile, bucket " << reconcile.Bounds(0.5) << " s) | "
    << ms(reconcile.Quantile(0.5)) << " |\n";
  t << "| reconcile p99 (histogram_quantile, bucket " << reconcile.Bounds(0.99) << " s) | "
    << ms(reconcile.Quantile(0.99)) << " |\n";
  if (o.webhook) {
    t << "| webhook reviews (operator's count) | " << admission.count << " |\n";
    t << "| review time in the operator: mean; p50; p99 (bucket " << admission.Bounds(0.99)
      << " s) | " << ms(admission.count ? admission.sum / admission.count : NAN) << "; "
      << ms(admission.Quantile(0.5)) << "; " << ms(admission.Quantile(0.99)) << " |\n";
    t << "| webhook call as the API server times it (TLS, request, review): mean; p50; p99 "
         "(bucket "
      << server_admission.Bounds(0.99) << " s) | "
      << ms(server_admission.count ? server_admission.sum / server_admission.count : NAN) << "; "
      << ms(server_admission.Quantile(0.5)) << "; " << ms(server_admission.Quantile(0.99))
      << " |\n";
    t << "| ... share of those calls within 5 ms; within 25 ms (the server's buckets) | "
      << Fixed(100 * server_admission.FractionAtMost(0.005), 1) << "%; "
      << Fixed(100 * server_admission.FractionAtMost(0.025), 1) << "% |\n";
    t << "| create of a suspended job, client latency p50 / p99: webhook vs none ("
      << side_by_side.count << " each, " << o.client_threads << " threads, interleaved; "
      << side_by_side.failed << " failed) | " << ms(side_by_side.with.first) << " / "
      << ms(side_by_side.with.second) << " vs " << ms(side_by_side.without.first) << " / "
      << ms(side_by_side.without.second) << " |\n";
  }
  t << "| operator RSS idle (synced, no jobs; of which anonymous) | " << mb(idle_rss_kb) << " ("
    << mb(idle_anon_kb) << ") |\n";
  t << "| operator peak RSS (VmHWM) | " << mb(hwm_kb) << " |\n";
  t << "| operator peak RSS (50 ms sampler) | " << mb(sampled_peak_kb.load()) << " |\n";
  t << "| operator RSS at the end: anonymous + file-backed (shared libraries) | " << mb(end_rss_kb)
    << ": " << mb(end_anon_kb) << " + " << mb(end_file_kb) << " |\n";
  t << "| operator threads at the end | " << threads << " |\n";
  t << "| CPU during the operator phase (" << Fixed(op_cpu.wall, 1) << " s wall): operator | "
    << share(op_cpu.op, op_cpu.wall) << " |\n";
  t << "| ... kube-apiserver | " << share(op_cpu.apiserver, op_cpu.wall) << " |\n";
  t << "| ... etcd | " << share(op_cpu.etcd, op_cpu.wall) << " |\n";
  t << "| ... this bench (apply + watches) | " << share(op_cpu.self, op_cpu.wall) << " |\n";
  if (o.server_baseline) {
    t << "| CPU during the direct run before (" << Fixed(before_cpu.wall, 1)
      << " s): kube-apiserver / etcd / bench | " << Fixed(before_cpu.apiserver, 1) << " / "
      << Fixed(before_cpu.etcd, 1) << " / " << Fixed(before_cpu.self, 1) << " s |\n";
  }
  t << "| API requests during the operator phase (writes/s) | " << Fixed(op_writes / op_cpu.wall, 0)
    << " writes/s, " << Fixed(op_all / op_cpu.wall, 0) << " requests/s: " << op_mix << " |\n";
  if (o.server_baseline) {
    t << "| API requests during the direct run before | "
      << Fixed(before_writes / before_cpu.wall, 0) << " writes/s: " << before_mix << " |\n";
  }
  t << "| pods listed at the end; jobs with fewer / more than " << o.workers_per_job << " pods | "
    << listed_pods << "; " << jobs_short << " / " << jobs_over << " |\n";
  t << "| Events in the namespace | " << listed_events << " |\n";
  t << "| operator warnings logged; exit | " << warnings << "; "
    << (stopped.signaled ? -stopped.signal : stopped.exit_code) << " |\n";
  std::cout << t.str() << std::flush;
  if (apply_failed.load()) std::cerr << "apply failures: " << apply_error << "\n";
  if (before.failed || after.failed) {
    std::cerr << "direct create failures: " << before.first_error << after.first_error << "\n";
  }

  if (!o.json_path.empty()) {
    json j = {
        {"jobs", o.jobs},
        {"workers_per_job", o.workers_per_job},
        {"client_threads", o.client_threads},
        {"operator_flags", operator_summary},
        {"apply_seconds", apply_seconds},
        {"first_pod_seconds", first_pod},
        {"all_pods_seconds", last_pod},
        {"all_status_seconds", status_done_at},
        {"operator_pods_per_second", op_rate},
        {"operator_pods_per_second_10_90", steady_rate},
        {"server_pods_per_second_before", before.pods_per_second()},
        {"server_pods_per_second_after", after.pods_per_second()},
        {"ratio", op_rate / server_rate},
        {"reconciles", reconcile.count},
        {"reconcile_mean_seconds", reconcile.count ? reconcile.sum / reconcile.count : 0},
        {"reconcile_p50_seconds", reconcile.Quantile(0.5)},
        {"reconcile_p99_seconds", reconcile.Quantile(0.99)},
        {"idle_rss_kib", idle_rss_kb},
        {"vmhwm_kib", hwm_kb},
        {"end_rss_kib", end_rss_kb},
        {"end_rss_anon_kib", end_anon_kb},
        {"end_rss_file_kib", end_file_kb},
        {"idle_rss_anon_kib", idle_anon_kb},
        {"cpu_operator_seconds", op_cpu.op},
        {"cpu_apiserver_seconds", op_cpu.apiserver},
        {"cpu_etcd_seconds", op_cpu.etcd},
        {"cpu_bench_seconds", op_cpu.self},
        {"cpu_wall_seconds", op_cpu.wall},
        {"events", listed_events},
        {"operator_phase_requests", op_mix},
        {"operator_phase_writes_per_second", op_writes / op_cpu.wall},
        {"direct_writes_per_second", before_cpu.wall > 0 ? before_writes / before_cpu.wall : 0},
        {"pods_listed", listed_pods}};
    if (o.webhook) {
      j["webhook_reviews"] = admission.count;
      j["webhook_review_mean_seconds"] = admission.count ? admission.sum / admission.count : 0;
      j["webhook_review_p99_seconds"] = admission.Quantile(0.99);
      j["webhook_call_mean_seconds"] =
          server_admission.count ? server_admission.sum / server_admission.count : 0;
      j["webhook_call_p99_seconds"] = server_admission.Quantile(0.99);
      j["create_p50_seconds_webhook"] = side_by_side.with.first;
      j["create_p99_seconds_webhook"] = side_by_side.with.second;
      j["create_p50_seconds_no_webhook"] = side_by_side.without.first;
      j["create_p99_seconds_no_webhook"] = side_by_side.without.second;
    }
    std::ofstream(o.json_path) << j.dump(2) << "\n";
  }
  const bool ok = all_pods && listed_pods == total_pods && jobs_short == 0 && jobs_over == 0;
  if (!ok) {
    std::cerr << "FAILED: " << n_pods << " of " << total_pods << " pods seen, " << listed_pods
              << " listed; operator log tail:\n"
              << log.substr(log.size() > 4000 ? log.size() - 4000 : 0);
  }
  return ok ? 0 : 1;
}

constexpr char kUsage[] = R"(usage: operator_scale_bench [flags]
  --jobs N                 TrainingJobs applied at once (default 1000)
  --workers-per-job M      spec.replicas of each (default 4)
  --client-threads T       threads applying jobs and creating direct pods (default 8)
  --operator-qps Q         lockstep-operator --qps (default 0: no client-side limit)
  --operator-burst B       lockstep-operator --burst (default 1000)
  --operator-workers W     lockstep-operator --workers, concurrent reconciles (default 4)
  --operator-flag FLAG     another flag for lockstep-operator (repeatable)
  --operator-env KEY=VALUE an environment variable for lockstep-operator (repeatable)
  --no-server-baseline     skip the direct pod creation runs
  --webhook                the operator serves its admission webhook for every job write
  --timeout-s S            give up waiting for the pods after S seconds (default 900)
  --json FILE              also write the figures as JSON
)";

}  // namespace
}  // namespace lockstep::bench

int main(int argc, char** argv) {
  using lockstep::bench::Options;
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    if (size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (arg != "--no-server-baseline" && arg != "--webhook" && arg != "--help" &&
               i + 1 < argc) {
      value = argv[++i];
    }
    if (arg == "--jobs") {
      o.jobs = std::atoi(value.c_str());
    } else if (arg == "--workers-per-job") {
      o.workers_per_job = std::atoi(value.c_str());
    } else if (arg == "--client-threads") {
      o.client_threads = std::max(1, std::atoi(value.c_str()));
    } else if (arg == "--operator-qps") {
      o.operator_qps = std::atof(value.c_str());
    } else if (arg == "--operator-burst") {
      o.operator_burst = std::atoi(value.c_str());
    } else if (arg == "--operator-workers") {
      o.operator_workers = std::atoi(value.c_str());
    } else if (arg == "--operator-flag") {
      o.extra_operator_flags.push_back(value);
    } else if (arg == "--operator-env") {
      const size_t eq = value.find('=');
      if (eq == std::string::npos) {
        std::cerr << "--operator-env wants KEY=VALUE\n";
        return 2;
      }
      o.operator_env.emplace_back(value.substr(0, eq), value.substr(eq + 1));
    } else if (arg == "--no-server-baseline") {
      o.server_baseline = false;
    } else if (arg == "--webhook") {
      o.webhook = true;
    } else if (arg == "--timeout-s") {
      o.timeout_s = std::atoll(value.c_str());
    } else if (arg == "--json") {
      o.json_path = value;
    } else {
      std::cerr << lockstep::bench::kUsage;
      return arg == "--help" ? 0 : 2;
    }
  }
  if (o.jobs < 1 || o.workers_per_job < 1) {
    std::cerr << lockstep::bench::kUsage;
    return 2;
  }
  return lockstep::bench::Run(o);
}
