// See kubelet_simulator.h.
#include "tests/support/kube/kubelet_simulator.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/base64.h"
#include "common/termination_message.h"
#include "tests/support/process/process.h"

namespace lockstep::testing {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// Every pod runs on loopback: pod IP and host IP alike.
constexpr char kPodIp[] = "127.0.0.1";
// "<type>://<id>", as containerStatuses[].containerID and imageID are written by a runtime.
constexpr char kRuntimeScheme[] = "lockstep-sim://";
// A kubelet retries a pod whose config it cannot build (missing Secret) on its next sync.
constexpr int64_t kRetryMs = 1000;
// spec.terminationGracePeriodSeconds defaults to 30.
constexpr int64_t kDefaultGraceSeconds = 30;
constexpr int64_t kRequestTimeoutMs = 10000;

// RFC 3339 in UTC with second precision, as metav1.Time is serialized.
std::string Rfc3339Now() {
  std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string PercentEncode(const std::string& text) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string StringAt(const json& object, const json::json_pointer& pointer) {
  if (!object.contains(pointer)) return "";
  const json& value = object.at(pointer);
  return value.is_string() ? value.get<std::string>() : "";
}

std::string ResponseError(const KubeTestEnv::Response& response) {
  if (response.status == 0) return response.error;
  return "HTTP " + std::to_string(response.status) + ": " +
         (response.body.is_object() && response.body.contains("message")
              ? response.body["message"].get<std::string>()
              : response.raw.substr(0, 300));
}

std::string Key(const std::string& namespace_, const std::string& name) {
  return namespace_ + "/" + name;
}

// The exit code a container runtime reports for a wait(2) status.
int ExitCodeOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 255;
}

// `word` with the first mount path it starts with (as a path: followed by '/' or the end)
// replaced by that mount's local directory. `mounts` is sorted longest path first.
std::string RewriteMounts(const std::string& word,
                          const std::vector<std::pair<std::string, std::string>>& mounts) {
  for (const auto& [mount_path, local] : mounts) {
    if (word.compare(0, mount_path.size(), mount_path) == 0 &&
        (word.size() == mount_path.size() || word[mount_path.size()] == '/')) {
      return local + word.substr(mount_path.size());
    }
  }
  return word;
}

// The value of a downward-API fieldPath (env valueFrom.fieldRef) for `pod`; the subset the
// API server accepts for env: metadata.name/namespace/uid, metadata.labels['k'],
// metadata.annotations['k'], spec.nodeName, spec.serviceAccountName, status.hostIP,
// status.podIP (status.podIPs is 1.20's too: one IP here).
StatusOr<std::string> FieldValue(const json& pod, const std::string& node_name,
                                 const std::string& path) {
  if (path == "metadata.name") return StringAt(pod, "/metadata/name"_json_pointer);
  if (path == "metadata.namespace") return StringAt(pod, "/metadata/namespace"_json_pointer);
  if (path == "metadata.uid") return StringAt(pod, "/metadata/uid"_json_pointer);
  if (path == "spec.nodeName") return node_name;
  if (path == "spec.serviceAccountName") {
    std::string account = StringAt(pod, "/spec/serviceAccountName"_json_pointer);
    return account.empty() ? std::string("default") : account;
  }
  if (path == "status.podIP" || path == "status.hostIP" || path == "status.podIPs") {
    return std::string(kPodIp);
  }
  for (const char* map : {"labels", "annotations"}) {
    const std::string prefix = std::string("metadata.") + map + "['";
    if (path.compare(0, prefix.size(), prefix) == 0 && path.size() > prefix.size() + 2 &&
        path.compare(path.size() - 2, 2, "']") == 0) {
      const std::string key = path.substr(prefix.size(), path.size() - prefix.size() - 2);
      const json& values = pod["metadata"].value(map, json::object());
      return values.contains(key) && values[key].is_string() ? values[key].get<std::string>()
                                                             : std::string();
    }
  }
  return InvalidArgumentError("fieldRef " + path + " is not supported by the kubelet simulator");
}

// The absolute path of `name` on a PATH list, or "" when none is executable.
std::string SearchPath(const std::string& name, const std::string& path_list) {
  std::stringstream dirs(path_list);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

void WriteFileWithMode(const fs::path& path, const std::string& bytes, int mode) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  out.close();
  chmod(path.c_str(), static_cast<mode_t>(mode));
}

// The LIST of the pods a simulator looks after.
std::string ListPath(const KubeletSimulatorOptions& options) {
  return (options.namespace_.empty() ? std::string("/api/v1/pods")
                                     : "/api/v1/namespaces/" + options.namespace_ + "/pods") +
         "?labelSelector=" + PercentEncode(options.label_selector);
}

// Runs `body` (returning Status), turning a JSON type error (a field of an unexpected type in
// an object read from the API) into an error Status.
template <typename Body>
Status CatchJsonErrors(Body&& body) {
  try {
    return body();
  } catch (const json::exception& error) {
    return InternalError(std::string("kubelet simulator: unexpected object: ") + error.what());
  }
}

}  // namespace

// One pod this node runs (or had a test drive), by uid.
struct KubeletSimulator::Pod {
  enum class State { kWaiting, kRunning, kTerminated };

  std::string namespace_, name, uid;
  json object;      // as last read from the API (spec, metadata, status)
  std::string dir;  // volumes/, log
  std::string log_path;
  std::string container;  // the container that runs
  State state = State::kWaiting;
  pid_t pid = 0;            // > 0 while the process is not reaped
  bool report_exit = true;  // false once a test wrote the terminal status itself
  int exit_code = 0;
  bool evicted = false;
  std::string eviction_message;
  std::string waiting_reason, waiting_message;  // why the container cannot start (yet)
  // The container's terminationMessagePath, as a file of this pod; what the container wrote there
  // (at most 4096 bytes) becomes state.terminated.message when it exits.
  std::string termination_log;
  std::string termination_message;
  std::string start_time, started_at, finished_at, ready_since;
  bool last_ready = false;
  bool status_dirty = false;  // a status write is due
  std::string last_error;     // last failed API request, for Describe
  Clock::time_point next_start_attempt{};
  // Stopping: the pod has a deletionTimestamp or is gone from the API.
  bool stopping = false;
  bool gone = false;
  bool sigkill_sent = false;
  Clock::time_point sigkill_at{};
  bool forget = false;
};

KubeletSimulator::KubeletSimulator(const KubeTestEnv* kube, KubeletSimulatorOptions options)
    : kube_(kube), options_(std::move(options)) {}

StatusOr<std::unique_ptr<KubeletSimulator>> KubeletSimulator::Start(
    const KubeTestEnv* kube, KubeletSimulatorOptions options) {
  if (kube == nullptr) return InvalidArgumentError("KubeletSimulator needs a KubeTestEnv");
  if (options.poll_interval_ms <= 0) options.poll_interval_ms = 100;
  std::unique_ptr<KubeletSimulator> simulator(new KubeletSimulator(kube, std::move(options)));
  const std::string path = ListPath(simulator->options_);
  KubeTestEnv::Response response =
      kube->Request("GET", path, nullptr, "application/json", kRequestTimeoutMs);
  if (response.status != 200) {
    return UnavailableError("kubelet simulator: cannot list pods (" + path +
                            "): " + ResponseError(response));
  }
  if (simulator->options_.work_dir.empty()) {
    simulator->work_dir_ = MakeTempDir("lockstep-kubelet");
    const char* keep = std::getenv("LOCKSTEP_KEEP_KUBE_TESTENV");
    simulator->remove_work_dir_ = !(keep && *keep && std::string(keep) != "0");
  } else {
    simulator->work_dir_ = simulator->options_.work_dir;
    std::error_code ignored;
    fs::create_directories(simulator->work_dir_, ignored);
  }
  KubeletSimulator* self = simulator.get();
  simulator->poller_ = std::thread([self] { self->PollLoop(); });
  return simulator;
}

KubeletSimulator::~KubeletSimulator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (poller_.joinable()) poller_.join();  // the poll thread stops the processes (ShutDown)
  if (remove_work_dir_) {
    std::error_code ignored;
    fs::remove_all(work_dir_, ignored);
  }
}

void KubeletSimulator::PollLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    SyncOnce();
    lock.lock();
    ++rounds_;
    changed_.notify_all();
    changed_.wait_for(lock, std::chrono::milliseconds(options_.poll_interval_ms),
                      [this] { return stopping_; });
  }
  lock.unlock();
  // Processes are started by this thread with PR_SET_PDEATHSIG (so that a crashed test leaves
  // none behind), which fires when this thread ends: stop them gracefully before that.
  ShutDown();
}

void KubeletSimulator::SyncOnce() {
  const std::string path = ListPath(options_);
  KubeTestEnv::Response list =
      kube_->Request("GET", path, nullptr, "application/json", kRequestTimeoutMs);

  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) return;
  if (list.status == 200 && list.body.is_object() && list.body["items"].is_array()) {
    std::set<std::string> listed;
    for (const json& item : list.body["items"]) {
      const std::string uid = StringAt(item, "/metadata/uid"_json_pointer);
      if (uid.empty()) continue;
      // A pod whose fields have unexpected types must not take the poll thread down.
      Status synced = CatchJsonErrors([&] {
        auto found = pods_.find(uid);
        if (found == pods_.end()) {
          json claimed;
          if (!Claim(item, &claimed)) return OkStatus();
          found = pods_.find(Track(claimed)->uid);
        }
        listed.insert(uid);
        SyncPod(found->second.get(), item);
        return OkStatus();
      });
      if (!synced.ok()) {
        listed.insert(uid);  // not a deletion
        auto found = pods_.find(uid);
        if (found != pods_.end()) found->second->last_error = synced.message();
      }
    }
    for (auto& [uid, pod] : pods_) {
      if (listed.count(uid) || pod->gone) continue;
      // Deleted (an unbound or terminal pod goes at once) or its labels changed: a kubelet
      // stops the containers of a pod that is no longer its own.
      pod->gone = true;
      if (!pod->stopping) {
        const json& grace = pod->object["spec"].value("terminationGracePeriodSeconds", json());
        BeginStop(pod.get(),
                  (grace.is_number_integer() ? grace.get<int64_t>() : kDefaultGraceSeconds) * 1000);
      }
    }
  }
  // Processes exit whether or not the LIST worked.
  for (auto& [uid, pod] : pods_) {
    ReapAndEnforce(pod.get());
    if (pod->gone && pod->pid == 0) pod->forget = true;
  }
  for (auto it = pods_.begin(); it != pods_.end();) {
    it = it->second->forget ? pods_.erase(it) : std::next(it);
  }
}

bool KubeletSimulator::Claim(const json& object, json* claimed) {
  *claimed = object;
  const std::string node = StringAt(object, "/spec/nodeName"_json_pointer);
  if (node == options_.node_name) return true;
  if (!node.empty()) return false;
  if (options_.bound_pods_only) return false;  // a scheduler (the test) binds them
  if (!options_.bind_pods) return true;
  if (object["metadata"].contains("deletionTimestamp")) return false;
  // What a scheduler does: POST a Binding; the API server sets spec.nodeName and the
  // PodScheduled condition. 409 when another node (simulator) bound it first.
  const std::string name = StringAt(object, "/metadata/name"_json_pointer);
  const std::string namespace_ = StringAt(object, "/metadata/namespace"_json_pointer);
  json binding = {
      {"apiVersion", "v1"},
      {"kind", "Binding"},
      {"metadata", {{"name", name}, {"namespace", namespace_}}},
      {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", options_.node_name}}}};
  KubeTestEnv::Response response =
      kube_->Request("POST", "/api/v1/namespaces/" + namespace_ + "/pods/" + name + "/binding",
                     binding, "application/json", kRequestTimeoutMs);
  if (response.status != 201 && response.status != 200) return false;
  (*claimed)["spec"]["nodeName"] = options_.node_name;
  return true;
}

void KubeletSimulator::SyncPod(Pod* pod, const json& object) {
  // Keep the node name this simulator bound the pod to while the LIST predates the binding.
  const std::string node = StringAt(pod->object, "/spec/nodeName"_json_pointer);
  pod->object = object;
  if (StringAt(object, "/spec/nodeName"_json_pointer).empty() && !node.empty()) {
    pod->object["spec"]["nodeName"] = node;
  }
  const json& metadata = object["metadata"];
  if (metadata.contains("deletionTimestamp") && !pod->stopping) {
    const json& grace = metadata.value("deletionGracePeriodSeconds", json());
    BeginStop(pod,
              (grace.is_number_integer() ? grace.get<int64_t>() : kDefaultGraceSeconds) * 1000);
  }
  if (options_.run_containers && pod->state == Pod::State::kWaiting && !pod->stopping &&
      Clock::now() >= pod->next_start_attempt &&
      StringAt(object, "/status/phase"_json_pointer) != "Running") {
    Status started = StartContainer(pod);
    if (!started.ok()) {
      pod->next_start_attempt = Clock::now() + std::chrono::milliseconds(kRetryMs);
      if (pod->waiting_message != started.message()) {
        pod->waiting_message = started.message();
        pod->status_dirty = true;
      }
    }
  }
  ReapAndEnforce(pod);
  if (pod->status_dirty) {
    Status written = WriteStatus(pod);
    if (!written.ok()) pod->last_error = written.message();
  }
  if (pod->stopping && pod->pid == 0 && !pod->status_dirty) {
    Status deleted = FinishDeletion(pod);
    if (!deleted.ok()) pod->last_error = deleted.message();
  }
}

void KubeletSimulator::BeginStop(Pod* pod, int64_t grace_ms) {
  pod->stopping = true;
  grace_ms = std::max<int64_t>(0, std::min(grace_ms, options_.max_grace_period_ms));
  pod->sigkill_at = Clock::now() + std::chrono::milliseconds(grace_ms);
  // The runtime signals the container's main process (PID 1); its children are the program's
  // business until the grace period ends.
  if (pod->pid > 0) kill(pod->pid, SIGTERM);
}

void KubeletSimulator::ReapAndEnforce(Pod* pod) {
  if (pod->pid <= 0) return;
  const pid_t pid = pod->pid;
  int wait_status = 0;
  const pid_t reaped = waitpid(pid, &wait_status, WNOHANG);
  if (reaped == pid || (reaped < 0 && errno == ECHILD)) {
    // The container's PID namespace ends with its main process.
    kill(-pid, SIGKILL);
    pod->pid = 0;
    OnExit(pod, reaped == pid ? ExitCodeOf(wait_status) : 255);
    return;
  }
  if (pod->stopping && !pod->sigkill_sent && Clock::now() >= pod->sigkill_at) {
    kill(-pod->pid, SIGKILL);
    pod->sigkill_sent = true;
  }
}

void KubeletSimulator::OnExit(Pod* pod, int exit_code) {
  changed_.notify_all();
  if (!pod->report_exit) return;
  pod->state = Pod::State::kTerminated;
  pod->exit_code = exit_code;
  pod->finished_at = Rfc3339Now();
  pod->termination_message = ReadTerminationMessage(pod->termination_log);
  pod->status_dirty = true;
}

Status KubeletSimulator::StartContainer(Pod* pod) {
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::string cwd;
  Status prepared = PrepareContainer(pod, &argv, &env, &cwd);
  if (!prepared.ok()) return prepared;

  // Everything the child touches is built before fork: after it, this multi-threaded process
  // may only make async-signal-safe calls.
  std::vector<char*> argv_ptrs;
  std::vector<char*> env_ptrs;
  for (std::string& word : argv) argv_ptrs.push_back(word.data());
  argv_ptrs.push_back(nullptr);
  for (std::string& item : env) env_ptrs.push_back(item.data());
  env_ptrs.push_back(nullptr);
  const int log_fd = open(pod->log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (log_fd < 0 || null_fd < 0) {
    if (log_fd >= 0) close(log_fd);
    if (null_fd >= 0) close(null_fd);
    return InternalError("cannot open " + pod->log_path + ": " + std::strerror(errno));
  }
  static const char kExecFailed[] = "kubelet simulator: exec failed\n";
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(137);
    dup2(null_fd, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    if (chdir(cwd.c_str()) != 0) _exit(128);
    execve(argv_ptrs[0], argv_ptrs.data(), env_ptrs.data());
    ssize_t ignored = write(STDERR_FILENO, kExecFailed, sizeof(kExecFailed) - 1);
    (void)ignored;
    _exit(127);
  }
  const int fork_errno = errno;
  close(log_fd);
  close(null_fd);
  if (pid < 0) return InternalError(std::string("fork: ") + std::strerror(fork_errno));
  setpgid(pid, pid);
  pod->pid = pid;
  pod->state = Pod::State::kRunning;
  pod->started_at = Rfc3339Now();
  pod->waiting_reason.clear();
  pod->waiting_message.clear();
  pod->status_dirty = true;
  logs_[Key(pod->namespace_, pod->name)] = pod->log_path;
  changed_.notify_all();
  return OkStatus();
}

StatusOr<json> KubeletSimulator::ReadData(const std::string& namespace_, const std::string& kind,
                                          const std::string& name, bool optional) {
  const bool secret = kind == "secrets";
  KubeTestEnv::Response response =
      kube_->Request("GET", "/api/v1/namespaces/" + namespace_ + "/" + kind + "/" + name, nullptr,
                     "application/json", kRequestTimeoutMs);
  if (response.status == 404) {
    if (optional) return json::object();
    return NotFoundError((secret ? "secret \"" : "configmap \"") + name + "\" not found");
  }
  if (response.status != 200) {
    return UnavailableError("reading " + kind + " " + namespace_ + "/" + name + ": " +
                            ResponseError(response));
  }
  json data = json::object();
  const json encoded = response.body.value("data", json::object());
  for (const auto& [key, value] : encoded.items()) {
    if (!secret) {
      data[key] = value;
      continue;
    }
    // Secret data is base64 (https://kubernetes.io/docs/concepts/configuration/secret/).
    StatusOr<std::string> decoded = Base64Decode(value.get<std::string>());
    if (!decoded.ok()) return decoded.status().WithContext("secret " + name + " key " + key);
    data[key] = *decoded;
  }
  if (!secret) {
    const json binary = response.body.value("binaryData", json::object());
    for (const auto& [key, value] : binary.items()) {
      StatusOr<std::string> decoded = Base64Decode(value.get<std::string>());
      if (!decoded.ok()) return decoded.status().WithContext("configmap " + name + " key " + key);
      data[key] = *decoded;
    }
  }
  return data;
}

StatusOr<std::string> KubeletSimulator::ReadKey(const std::string& namespace_,
                                                const std::string& kind, const std::string& name,
                                                const std::string& key, bool optional) {
  StatusOr<json> data = ReadData(namespace_, kind, name, optional);
  if (!data.ok()) return data.status();
  if (!data->contains(key)) {
    if (optional) return NotFoundError("optional");
    return NotFoundError("couldn't find key " + key + " in " +
                         (kind == "secrets" ? "Secret " : "ConfigMap ") + namespace_ + "/" + name);
  }
  return (*data)[key].get<std::string>();
}

Status KubeletSimulator::PrepareContainer(Pod* pod, std::vector<std::string>* argv,
                                          std::vector<std::string>* env, std::string* cwd) {
  const json& spec = pod->object["spec"];
  const json& containers = spec.value("containers", json::array());
  if (!containers.is_array() || containers.empty()) {
    return InvalidArgumentError("pod has no containers");
  }
  json container = containers.front();
  for (const json& candidate : containers) {
    if (candidate.value("name", "") == options_.container_name) container = candidate;
  }
  pod->container = container.value("name", "");

  // Volumes -> directories (ContainerCreating until they can be set up, as FailedMount).
  pod->waiting_reason = "ContainerCreating";
  std::map<std::string, std::string> volume_dirs;
  for (const json& volume : spec.value("volumes", json::array())) {
    const std::string name = volume.value("name", "");
    std::string local = pod->dir + "/volumes/" + name;
    std::error_code error;
    fs::create_directories(local, error);
    const bool secret = volume.contains("secret");
    if (secret || volume.contains("configMap")) {
      const json& source = volume[secret ? "secret" : "configMap"];
      const std::string object_name = source.value(secret ? "secretName" : "name", "");
      StatusOr<json> data = ReadData(pod->namespace_, secret ? "secrets" : "configmaps",
                                     object_name, source.value("optional", false));
      if (!data.ok()) {
        return data.status().WithContext("MountVolume.SetUp failed for volume \"" + name + "\"");
      }
      const int default_mode = source.value("defaultMode", 0644);
      if (source.contains("items")) {
        for (const json& item : source["items"]) {
          const std::string key = item.value("key", "");
          if (!data->contains(key)) {
            if (source.value("optional", false)) continue;
            return NotFoundError("MountVolume.SetUp failed for volume \"" + name +
                                 "\": references non-existent key " + key);
          }
          WriteFileWithMode(fs::path(local) / item.value("path", key), (*data)[key],
                            item.value("mode", default_mode));
        }
      } else {
        for (const auto& [key, value] : data->items()) {
          WriteFileWithMode(fs::path(local) / key, value.get<std::string>(), default_mode);
        }
      }
    } else if (volume.contains("hostPath")) {
      local = volume["hostPath"].value("path", local);
    }
    // emptyDir and the rest: an empty directory.
    volume_dirs[name] = local;
  }
  std::vector<std::pair<std::string, std::string>> mounts;
  for (const json& mount : container.value("volumeMounts", json::array())) {
    const std::string volume = mount.value("name", "");
    if (!volume_dirs.count(volume)) {
      return InvalidArgumentError("volumeMount names an unknown volume " + volume);
    }
    std::string mount_path = mount.value("mountPath", "");
    while (mount_path.size() > 1 && mount_path.back() == '/') mount_path.pop_back();
    std::string local = volume_dirs[volume];
    const std::string sub_path = mount.value("subPath", "");
    if (!sub_path.empty()) local += "/" + sub_path;
    mounts.emplace_back(mount_path, local);
  }
  // The kubelet creates the file at terminationMessagePath (default /dev/termination-log) for
  // each container and reads it when the container ends:
  // https://kubernetes.io/docs/tasks/debug/debug-application/determine-reason-pod-failure/
  pod->termination_log = pod->dir + "/termination-log";
  WriteFileWithMode(pod->termination_log, "", 0666);
  mounts.emplace_back(container.value("terminationMessagePath", "/dev/termination-log"),
                      pod->termination_log);
  std::sort(mounts.begin(), mounts.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });

  // Env, in order: envFrom, then env (later entries win), then the test's extra env.
  pod->waiting_reason = "CreateContainerConfigError";
  std::vector<std::pair<std::string, std::string>> values;
  const char* path = std::getenv("PATH");
  std::string hostname = StringAt(pod->object, "/spec/hostname"_json_pointer);
  values.emplace_back("PATH", path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
  values.emplace_back("HOME", pod->dir);
  values.emplace_back("HOSTNAME", hostname.empty() ? pod->name : hostname);
  for (const json& source : container.value("envFrom", json::array())) {
    const bool secret = source.contains("secretRef");
    const json& ref = source[secret ? "secretRef" : "configMapRef"];
    StatusOr<json> data = ReadData(pod->namespace_, secret ? "secrets" : "configmaps",
                                   ref.value("name", ""), ref.value("optional", false));
    if (!data.ok()) return data.status();
    for (const auto& [key, value] : data->items()) {
      values.emplace_back(source.value("prefix", "") + key, value.get<std::string>());
    }
  }
  for (const json& entry : container.value("env", json::array())) {
    const std::string name = entry.value("name", "");
    if (entry.contains("value")) {
      values.emplace_back(name, RewriteMounts(entry["value"].get<std::string>(), mounts));
      continue;
    }
    if (!entry.contains("valueFrom")) {
      values.emplace_back(name, "");
      continue;
    }
    const json& from = entry["valueFrom"];
    if (from.contains("fieldRef")) {
      StatusOr<std::string> value =
          FieldValue(pod->object, options_.node_name, from["fieldRef"].value("fieldPath", ""));
      if (!value.ok()) return value.status();
      values.emplace_back(name, *value);
    } else if (from.contains("secretKeyRef") || from.contains("configMapKeyRef")) {
      const bool secret = from.contains("secretKeyRef");
      const json& ref = from[secret ? "secretKeyRef" : "configMapKeyRef"];
      const bool optional = ref.value("optional", false);
      StatusOr<std::string> value = ReadKey(pod->namespace_, secret ? "secrets" : "configmaps",
                                            ref.value("name", ""), ref.value("key", ""), optional);
      if (!value.ok()) {
        if (optional && value.status().code() == StatusCode::kNotFound) continue;
        return value.status();
      }
      values.emplace_back(name, RewriteMounts(*value, mounts));
    } else {
      return InvalidArgumentError("env " + name + ": valueFrom " + from.dump() +
                                  " is not supported by the kubelet simulator");
    }
  }
  for (const auto& item : options_.extra_env) values.push_back(item);
  std::map<std::string, size_t> position;  // last definition wins, in first-definition order
  std::vector<std::pair<std::string, std::string>> ordered;
  for (const auto& [name, value] : values) {
    auto found = position.find(name);
    if (found == position.end()) {
      position[name] = ordered.size();
      ordered.emplace_back(name, value);
    } else {
      ordered[found->second].second = value;
    }
  }
  env->clear();
  std::string container_path;
  for (const auto& [name, value] : ordered) {
    env->push_back(name + "=" + value);
    if (name == "PATH") container_path = value;
  }

  // runAsNonRoot, as kuberuntime's verifyRunAsNonRoot judges it (after the env, still
  // CreateContainerConfigError): the container's field wins over the pod's.
  const json pod_context = spec.value("securityContext", json::object());
  const json container_context = container.value("securityContext", json::object());
  const auto effective = [&](const char* field) {
    if (container_context.is_object() && container_context.contains(field)) {
      return container_context[field];
    }
    return pod_context.is_object() ? pod_context.value(field, json()) : json();
  };
  if (effective("runAsNonRoot") == true) {
    const std::string which = "(pod: \"" + pod->name + "_" + pod->namespace_ + "(" +
                              StringAt(pod->object, "/metadata/uid"_json_pointer) +
                              ")\", container: " + pod->container + ")";
    const json run_as_user = effective("runAsUser");
    if (run_as_user.is_number_integer() ? run_as_user == 0 : options_.image_user == 0) {
      return FailedPreconditionError(
          run_as_user.is_number_integer()
              ? "container's runAsUser breaks non-root policy " + which
              : "container has runAsNonRoot and image will run as root " + which);
    }
  }

  // command + args; command[0] mapped to a local executable.
  argv->clear();
  for (const char* field : {"command", "args"}) {
    for (const json& word : container.value(field, json::array())) {
      argv->push_back(RewriteMounts(word.get<std::string>(), mounts));
    }
  }
  if (container.value("command", json::array()).empty()) {
    return InvalidArgumentError(
        "container " + pod->container +
        " has no command: the simulator runs no images, so it cannot know the entrypoint");
  }
  const std::string word = argv->front();
  std::string executable;
  auto mapped = options_.executables.find(word);
  if (mapped == options_.executables.end()) {
    mapped = options_.executables.find(fs::path(word).filename().string());
  }
  if (mapped != options_.executables.end()) {
    executable = mapped->second;
  } else if (!word.empty() && word[0] == '/') {
    executable = word;
  } else {
    executable = SearchPath(word, container_path);
  }
  if (executable.empty() || access(executable.c_str(), X_OK) != 0) {
    return NotFoundError("executable " + word + " not found (mapped to \"" + executable +
                         "\"); add it to KubeletSimulatorOptions::executables");
  }
  argv->front() = executable;

  const std::string working_dir = container.value("workingDir", "");
  *cwd = working_dir.empty() ? pod->dir : RewriteMounts(working_dir, mounts);
  return OkStatus();
}

Status KubeletSimulator::WriteStatus(Pod* pod) {
  json status = pod->object.value("status", json::object());
  if (!status.is_object()) status = json::object();
  const bool terminated = pod->state == Pod::State::kTerminated;
  const bool running = pod->state == Pod::State::kRunning;
  std::string phase = pod->evicted ? "Failed"
                      : running    ? "Running"
                      : terminated ? (pod->exit_code == 0 ? "Succeeded" : "Failed")
                                   : "Pending";
  const bool ready = running && !pod->evicted;
  const std::string now = Rfc3339Now();
  if (ready != pod->last_ready || pod->ready_since.empty()) {
    pod->ready_since = now;
    pod->last_ready = ready;
  }
  // https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-phase and
  // #pod-conditions: phase; hostIP/podIP(s) once the pod is on a node; startTime when the
  // kubelet acknowledged the pod; conditions with lastTransitionTime.
  status["phase"] = phase;
  status["hostIP"] = kPodIp;
  status["podIP"] = kPodIp;
  status["podIPs"] = json::array({{{"ip", kPodIp}}});
  status["startTime"] = pod->start_time;
  status.erase("reason");
  status.erase("message");

  std::string scheduled_since = pod->start_time;
  for (const json& condition : status.value("conditions", json::array())) {
    if (condition.value("type", "") == "PodScheduled" && condition.contains("lastTransitionTime")) {
      scheduled_since = condition["lastTransitionTime"].get<std::string>();
    }
  }
  auto condition = [](const std::string& type, bool value, const std::string& since,
                      const std::string& reason, const std::string& message) {
    json c = {{"type", type},
              {"status", value ? "True" : "False"},
              {"lastProbeTime", nullptr},
              {"lastTransitionTime", since}};
    if (!reason.empty()) c["reason"] = reason;
    if (!message.empty()) c["message"] = message;
    return c;
  };
  // Ready/ContainersReady False: PodCompleted when every container succeeded, else
  // ContainersNotReady naming them (pkg/kubelet/status/generate.go).
  const std::string not_ready_reason = phase == "Succeeded" ? "PodCompleted"
                                       : ready              ? ""
                                                            : "ContainersNotReady";
  const std::string not_ready_message =
      not_ready_reason == "ContainersNotReady"
          ? "containers with unready status: [" + pod->container + "]"
          : "";
  status["conditions"] = json::array(
      {condition("Initialized", true, pod->start_time, "", ""),
       condition("Ready", ready, pod->ready_since, not_ready_reason, not_ready_message),
       condition("ContainersReady", ready, pod->ready_since, not_ready_reason, not_ready_message),
       condition("PodScheduled", true, scheduled_since, "", "")});

  if (pod->evicted) {
    // An evicted pod's status is the eviction: phase Failed, reason Evicted, the message; no
    // container reports an exit (pkg/kubelet/eviction: the status a kubelet writes).
    status["reason"] = "Evicted";
    status["message"] = pod->eviction_message;
    status.erase("containerStatuses");
  } else {
    // https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#container-states
    const std::string image = [&] {
      for (const json& c : pod->object["spec"].value("containers", json::array())) {
        if (c.value("name", "") == pod->container) return c.value("image", std::string());
      }
      return std::string();
    }();
    const std::string container_id = std::string(kRuntimeScheme) + pod->uid + "-" +
                                     (pod->container.empty() ? "worker" : pod->container);
    json state;
    if (running) {
      state["running"] = {{"startedAt", pod->started_at}};
    } else if (terminated) {
      state["terminated"] = {{"exitCode", pod->exit_code},
                             {"reason", pod->exit_code == 0 ? "Completed" : "Error"},
                             {"startedAt", pod->started_at.empty() ? now : pod->started_at},
                             {"finishedAt", pod->finished_at.empty() ? now : pod->finished_at},
                             {"containerID", container_id}};
      if (!pod->termination_message.empty()) {
        state["terminated"]["message"] = pod->termination_message;
      }
    } else {
      json waiting = {{"reason", pod->waiting_reason.empty() ? std::string("ContainerCreating")
                                                             : pod->waiting_reason}};
      if (!pod->waiting_message.empty()) waiting["message"] = pod->waiting_message;
      state["waiting"] = waiting;
    }
    json container_status = {{"name", pod->container.empty() ? "worker" : pod->container},
                             {"state", state},
                             {"lastState", json::object()},
                             {"ready", ready},
                             {"started", running},
                             {"restartCount", 0},
                             {"image", image},
                             {"imageID", std::string(kRuntimeScheme) + image}};
    if (running || terminated) container_status["containerID"] = container_id;
    status["containerStatuses"] = json::array({container_status});
  }

  // The uid test keeps the write off a new pod that took the name.
  json patch = json::array({{{"op", "test"}, {"path", "/metadata/uid"}, {"value", pod->uid}},
                            {{"op", "add"}, {"path", "/status"}, {"value", status}}});
  KubeTestEnv::Response response = kube_->Request(
      "PATCH", "/api/v1/namespaces/" + pod->namespace_ + "/pods/" + pod->name + "/status", patch,
      "application/json-patch+json", kRequestTimeoutMs);
  if (response.status == 200) {
    pod->object = response.body;
    pod->status_dirty = false;
    return OkStatus();
  }
  if (response.status == 404) {
    pod->status_dirty = false;  // gone: the next LIST forgets it
    return NotFoundError("pod " + Key(pod->namespace_, pod->name) + " is gone");
  }
  return UnavailableError("writing status of " + Key(pod->namespace_, pod->name) + ": " +
                          ResponseError(response));
}

Status KubeletSimulator::FinishDeletion(Pod* pod) {
  // The kubelet's last word on a graceful deletion: containers are gone, delete now.
  json options = {{"apiVersion", "v1"},
                  {"kind", "DeleteOptions"},
                  {"gracePeriodSeconds", 0},
                  {"preconditions", {{"uid", pod->uid}}}};
  KubeTestEnv::Response response =
      kube_->Request("DELETE", "/api/v1/namespaces/" + pod->namespace_ + "/pods/" + pod->name,
                     options, "application/json", kRequestTimeoutMs);
  // 409: the uid precondition failed, the name belongs to a new pod: ours is gone.
  if (response.status == 200 || response.status == 202 || response.status == 404 ||
      response.status == 409) {
    pod->gone = true;
    pod->forget = true;
    return OkStatus();
  }
  return UnavailableError("deleting " + Key(pod->namespace_, pod->name) + ": " +
                          ResponseError(response));
}

KubeletSimulator::Pod* KubeletSimulator::Find(const std::string& namespace_,
                                              const std::string& name) const {
  Pod* found = nullptr;
  for (const auto& [uid, pod] : pods_) {
    if (pod->namespace_ != namespace_ || pod->name != name || pod->forget) continue;
    // A deleted pod and its successor may both be known: the live one wins.
    if (found == nullptr || (found->gone && !pod->gone)) found = pod.get();
  }
  return found;
}

StatusOr<KubeletSimulator::Pod*> KubeletSimulator::Adopt(const std::string& namespace_,
                                                         const std::string& name) {
  KubeTestEnv::Response response =
      kube_->Request("GET", "/api/v1/namespaces/" + namespace_ + "/pods/" + name, nullptr,
                     "application/json", kRequestTimeoutMs);
  if (response.status == 404) return NotFoundError("pod " + Key(namespace_, name) + " not found");
  if (response.status != 200) {
    return UnavailableError("reading pod " + Key(namespace_, name) + ": " +
                            ResponseError(response));
  }
  const std::string uid = StringAt(response.body, "/metadata/uid"_json_pointer);
  auto known = pods_.find(uid);
  if (known != pods_.end()) return known->second.get();
  json claimed;
  if (!Claim(response.body, &claimed)) {
    return FailedPreconditionError("pod " + Key(namespace_, name) + " is bound to node \"" +
                                   StringAt(response.body, "/spec/nodeName"_json_pointer) +
                                   "\", not " + options_.node_name);
  }
  return Track(claimed);
}

KubeletSimulator::Pod* KubeletSimulator::Track(const json& claimed) {
  auto pod = std::make_unique<Pod>();
  pod->namespace_ = StringAt(claimed, "/metadata/namespace"_json_pointer);
  pod->name = StringAt(claimed, "/metadata/name"_json_pointer);
  pod->uid = StringAt(claimed, "/metadata/uid"_json_pointer);
  pod->object = claimed;
  // A pod first seen past Pending (the simulator started late, or another one ran it) is taken
  // as it is: no process is started for it.
  const std::string phase = StringAt(claimed, "/status/phase"_json_pointer);
  pod->state = phase == "Running"                          ? Pod::State::kRunning
               : phase == "Succeeded" || phase == "Failed" ? Pod::State::kTerminated
                                                           : Pod::State::kWaiting;
  pod->start_time = StringAt(claimed, "/status/startTime"_json_pointer);
  if (pod->start_time.empty()) pod->start_time = Rfc3339Now();
  const json& containers = claimed["spec"].value("containers", json::array());
  pod->container = containers.empty() ? "" : containers.front().value("name", "");
  for (const json& c : containers) {
    if (c.value("name", "") == options_.container_name) pod->container = options_.container_name;
  }
  pod->dir = work_dir_ + "/" + pod->namespace_ + "_" + pod->name + "_" + pod->uid.substr(0, 8);
  std::error_code ignored;
  fs::create_directories(pod->dir, ignored);
  pod->log_path = pod->dir + "/log";
  Pod* raw = pod.get();
  pods_[raw->uid] = std::move(pod);
  return raw;
}

Status KubeletSimulator::SetRunning(const std::string& namespace_, const std::string& name) {
  return CatchJsonErrors([&]() -> Status {
    std::unique_lock<std::mutex> lock(mutex_);
    StatusOr<Pod*> adopted = Adopt(namespace_, name);
    if (!adopted.ok()) return adopted.status();
    Pod* pod = *adopted;
    if (options_.run_containers && pod->state == Pod::State::kWaiting) {
      // Processes are started by the poll thread only (PR_SET_PDEATHSIG follows the thread that
      // forks): wait for it to start this one, or to fail to.
      const std::string uid = pod->uid;
      const bool settled = changed_.wait_for(lock, std::chrono::seconds(10), [&] {
        auto found = pods_.find(uid);
        return stopping_ || found == pods_.end() || found->second->state != Pod::State::kWaiting ||
               !found->second->waiting_message.empty();
      });
      auto found = pods_.find(uid);
      if (found == pods_.end()) return NotFoundError("pod " + Key(namespace_, name) + " is gone");
      if (found->second->state == Pod::State::kRunning) return OkStatus();
      return UnavailableError("the container of " + Key(namespace_, name) + " did not start" +
                              (settled ? ": " + found->second->waiting_message : " within 10 s"));
    }
    pod->state = Pod::State::kRunning;
    if (pod->started_at.empty()) pod->started_at = Rfc3339Now();
    pod->evicted = false;
    return WriteStatus(pod);
  });
}

Status KubeletSimulator::SetTerminated(const std::string& namespace_, const std::string& name,
                                       int exit_code) {
  return CatchJsonErrors([&]() -> Status {
    std::lock_guard<std::mutex> lock(mutex_);
    StatusOr<Pod*> adopted = Adopt(namespace_, name);
    if (!adopted.ok()) return adopted.status();
    Pod* pod = *adopted;
    if (pod->pid > 0) {
      pod->report_exit = false;
      kill(-pod->pid, SIGKILL);
    }
    if (pod->started_at.empty()) pod->started_at = Rfc3339Now();
    pod->state = Pod::State::kTerminated;
    pod->exit_code = exit_code;
    pod->finished_at = Rfc3339Now();
    return WriteStatus(pod);
  });
}

Status KubeletSimulator::SetEvicted(const std::string& namespace_, const std::string& name,
                                    const std::string& message) {
  return CatchJsonErrors([&]() -> Status {
    std::lock_guard<std::mutex> lock(mutex_);
    StatusOr<Pod*> adopted = Adopt(namespace_, name);
    if (!adopted.ok()) return adopted.status();
    Pod* pod = *adopted;
    if (pod->pid > 0) {
      pod->report_exit = false;
      kill(-pod->pid, SIGKILL);  // a hard eviction: no grace period
    }
    pod->evicted = true;
    pod->eviction_message = message;
    if (pod->state != Pod::State::kTerminated) {
      pod->state = Pod::State::kTerminated;
      pod->exit_code = 137;
      pod->finished_at = Rfc3339Now();
    }
    return WriteStatus(pod);
  });
}

Status KubeletSimulator::KillContainer(const std::string& namespace_, const std::string& name,
                                       int signal) {
  std::lock_guard<std::mutex> lock(mutex_);
  Pod* pod = Find(namespace_, name);
  if (pod == nullptr || pod->pid <= 0) {
    return NotFoundError("no container process runs for pod " + Key(namespace_, name));
  }
  if (kill(signal == SIGKILL ? -pod->pid : pod->pid, signal) != 0) {
    return InternalError("kill " + std::to_string(pod->pid) + ": " + std::strerror(errno));
  }
  return OkStatus();
}

std::vector<pid_t> KubeletSimulator::Pids() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<pid_t> pids;
  for (const auto& [uid, pod] : pods_) {
    if (pod->pid > 0) pids.push_back(pod->pid);
  }
  return pids;
}

pid_t KubeletSimulator::PidOf(const std::string& namespace_, const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Pod* pod = Find(namespace_, name);
  return pod == nullptr ? 0 : pod->pid;
}

int KubeletSimulator::RunningCount() const { return static_cast<int>(Pids().size()); }

std::string KubeletSimulator::LogOf(const std::string& namespace_, const std::string& name) const {
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = logs_.find(Key(namespace_, name));
    if (found == logs_.end()) return "";
    path = found->second;
  }
  return ReadFile(path);
}

std::string KubeletSimulator::Describe() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream out;
  out << "kubelet simulator " << options_.node_name << " (" << pods_.size() << " pods, " << rounds_
      << " rounds, dir " << work_dir_ << ")\n";
  for (const auto& [uid, pod] : pods_) {
    static const char* const kStates[] = {"waiting", "running", "terminated"};
    out << "  " << Key(pod->namespace_, pod->name) << " uid " << uid << ": "
        << kStates[static_cast<int>(pod->state)] << " pid " << pod->pid;
    if (pod->state == Pod::State::kTerminated) out << " exit " << pod->exit_code;
    if (pod->evicted) out << " evicted";
    if (pod->stopping) out << (pod->gone ? " gone" : " terminating");
    if (!pod->waiting_message.empty()) out << " waiting: " << pod->waiting_message;
    if (!pod->last_error.empty()) out << " last error: " << pod->last_error;
    out << "\n";
  }
  for (const auto& [key, path] : logs_) {
    std::string log = ReadFile(path);
    if (log.size() > 2000) log = "..." + log.substr(log.size() - 2000);
    out << "--- log of " << key << " ---\n"
        << log << (log.empty() || log.back() == '\n' ? "" : "\n");
  }
  return out.str();
}

bool KubeletSimulator::WaitForSync(int64_t timeout_ms) const {
  std::unique_lock<std::mutex> lock(mutex_);
  // The round in progress may have listed before this call: the one after it did not.
  const int64_t target = rounds_ + 2;
  return changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    return rounds_ >= target || stopping_;
  }) && rounds_ >= target;
}

void KubeletSimulator::ShutDown() {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.max_grace_period_ms);
  for (auto& [uid, pod] : pods_) {
    if (pod->pid > 0) kill(pod->pid, SIGTERM);
  }
  // SIGKILLed processes go at once unless stuck in the kernel (uninterruptible sleep): those
  // are left unreaped after another 5 s rather than hang the test.
  const auto give_up = deadline + std::chrono::seconds(5);
  bool sigkilled = false;
  while (true) {
    bool any = false;
    for (auto& [uid, pod] : pods_) {
      if (pod->pid <= 0) continue;
      int wait_status = 0;
      const pid_t reaped = waitpid(pod->pid, &wait_status, WNOHANG);
      if (reaped == pod->pid || reaped < 0) {
        kill(-pod->pid, SIGKILL);
        pod->pid = 0;
      } else {
        any = true;
      }
    }
    if (!any || Clock::now() >= give_up) break;
    if (!sigkilled && Clock::now() >= deadline) {
      for (auto& [uid, pod] : pods_) {
        if (pod->pid > 0) kill(-pod->pid, SIGKILL);
      }
      sigkilled = true;
    }
    poll(nullptr, 0, 10);
  }
}

}  // namespace lockstep::testing
