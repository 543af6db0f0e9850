// A kubelet double for tests against KubeTestEnv (kube_testenv.h), where no kubelet and no
// scheduler run: KubeletSimulator plays both for the pods of one node, through the API server.
//
//   KubeletSimulatorOptions options;
//   options.label_selector = "lockstep.io/job-name=fashion";
//   options.executables = {{"lockstep-worker", LOCKSTEP_WORKER_BINARY}};
//   options.extra_env = {{"LOCKSTEP_METRICS_PORT", "0"}};
//   StatusOr<std::unique_ptr<KubeletSimulator>> kubelet = KubeletSimulator::Start(kube, options);
//   ASSERT_TRUE(kubelet.ok()) << kubelet.status();
//   ... the operator creates pods; they run as local processes and their status reads as a
//   kubelet writes it ...
//   ASSERT_TRUE((*kubelet)->KillContainer("default", "fashion-worker-1", SIGKILL).ok());
//
// What it simulates (pod fields: https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/
// and the Pod API reference,
// https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/):
//
//  - Discovery. A poll thread LISTs the pods of `namespace_` (all when empty) that match
//    `label_selector`, every `poll_interval_ms` (the test client is curl, so no watch). A LIST
//    that fails is skipped: it never reads as "every pod was deleted".
//  - Scheduling (bind_pods, the default). A pod without spec.nodeName is bound to `node_name`
//    through the pods/binding subresource, as a scheduler does; the API server then sets nodeName
//    and the PodScheduled condition. Pods bound to another node are left alone, so several
//    simulators (nodes) can share a selector: the one whose Binding wins runs the pod. Binding is
//    what makes deletion faithful: the API server deletes an unbound pod at once, but a bound pod
//    only gets metadata.deletionTimestamp (Terminating) and stays until its kubelet has stopped
//    the containers and deletes it with gracePeriodSeconds=0, which this simulator does. So an
//    operator sees Terminating pods, and a create of the same name is refused (409) until the
//    old pod is gone, as on a real cluster. With bind_pods = false, pods keep an empty nodeName
//    (pods already bound to `node_name` are taken too) and are deleted at once by the server;
//    the simulator then stops the process when it notices the pod is gone.
//  - Containers (run_containers = true). For a pod first seen Pending, its container named
//    `container_name` (or the first one) runs as a local process in its own process group:
//    command + args (an image's entrypoint is unknown, so a container without command fails to
//    start), command[0] mapped through `executables` (by the full word, then by its basename),
//    else an absolute path runs as-is, else it is searched on the container's PATH. Env is
//    resolved in order as the kubelet does: `value`; `valueFrom.secretKeyRef` and
//    `configMapKeyRef` (read through the API, Secret data base64-decoded; `optional` honoured);
//    `valueFrom.fieldRef` for metadata.name/namespace/uid/labels['k']/annotations['k'],
//    spec.nodeName, spec.serviceAccountName, status.podIP/hostIP (127.0.0.1); `envFrom`
//    secretRef/configMapRef (with prefix). The base environment is PATH (the test's), HOME (the
//    pod's directory) and HOSTNAME (spec.hostname or the pod name); `extra_env` is applied last
//    and wins (e.g. LOCKSTEP_METRICS_PORT=0 so that many workers share loopback). Volumes
//    become directories under the pod's directory: secret and configMap volumes are written as
//    files (items key -> path, or every key; defaultMode/mode), emptyDir is empty, hostPath is
//    the host path itself. Each volumeMount's mountPath is mapped to its volume's directory:
//    every env value, command/args word and workingDir that starts with a mountPath (followed
//    by '/' or the end) is rewritten, longest mountPath first. So LOCKSTEP_RENDEZVOUS_CA_FILE=
//    /var/run/lockstep/ca.crt names the Secret's ca.crt on disk. The working directory is the
//    pod's directory unless workingDir is set. stdout and stderr go to the pod's log file
//    (LogOf), kept until the simulator is destroyed. An env or volume that cannot be resolved
//    (a missing Secret) leaves the pod Pending with the container waiting (reason
//    CreateContainerConfigError or ContainerCreating, the message saying why), retried every
//    second, as a kubelet does; so does runAsNonRoot with a root user (options.image_user, or
//    runAsUser 0), with the kubelet's message.
//  - Status, written through the status subresource (JSON patch, guarded by a test of
//    metadata.uid so that it never lands on a new pod of the same name). Running: phase,
//    hostIP, podIP, podIPs, startTime, conditions Initialized/Ready/ContainersReady/PodScheduled
//    True, containerStatuses [{name, ready, started, restartCount 0, image, imageID,
//    containerID, state.running.startedAt}]. Exit: phase Succeeded (exit 0) or Failed,
//    state.terminated {exitCode, reason Completed|Error, startedAt, finishedAt, containerID},
//    Ready and ContainersReady False (reason PodCompleted or ContainersNotReady). A process
//    killed by signal N reports exit code 128+N, as container runtimes do (SIGKILL: 137). When
//    the container's main process exits, the rest of its process group is SIGKILLed (the end of
//    a container's PID namespace).
//  - Stopping. A pod that gets a deletionTimestamp or disappears from the API: SIGTERM to the
//    main process, SIGKILL to the group after the grace period (deletionGracePeriodSeconds or
//    spec.terminationGracePeriodSeconds, default 30 s, capped by max_grace_period_ms); then, for
//    a pod that still exists, the terminal status is written and the pod deleted with
//    gracePeriodSeconds=0 (uid precondition), and the simulator forgets it.
//  - Test drive (run_containers = false, or on top of real processes): SetRunning,
//    SetTerminated, SetEvicted write the status a kubelet would; in that mode no process runs
//    and deletion of a bound pod is finished at once.
//
// What it does not simulate: restarts (restartPolicy is read as Never whatever it says:
// restartCount stays 0), init containers, containers other than the worker one (not run, not in
// containerStatuses), probes, resource limits, images, $(VAR) expansion in
// env/command/args, downward API volumes, projected and service-account token volumes, service
// links env vars, Node objects and node status, Events, the pod network (every pod is
// 127.0.0.1: use ports that do not collide), and the API server's view of a node that stops
// (the destructor kills the processes but leaves the pods as they are).
//
// Threads: every public method may be called from any thread; each takes the simulator's lock,
// which the poll thread holds while it acts on a pod (API requests bounded by their timeout), so
// a call may wait for one such request. Every wait is bounded.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"
#include "tests/support/kube/kube_testenv.h"

namespace lockstep::testing {

struct KubeletSimulatorOptions {
  // Pods of this namespace; empty: every namespace.
  std::string namespace_;
  // A LIST labelSelector (e.g. "lockstep.io/job-name" or "lockstep.io/job-name=fashion").
  std::string label_selector = "lockstep.io/job-name";
  // The node this simulator is; pods are bound to it (bind_pods) and it appears in status.
  std::string node_name = "lockstep-sim-node";
  // Act as the scheduler too (see the file comment: faithful graceful deletion).
  bool bind_pods = true;
  // Only the pods something else bound to node_name, as a kubelet proper (the test schedules,
  // e.g. to place pods on nodes of its choice); bind_pods is then moot.
  bool bound_pods_only = false;
  // true: run the worker container as a process; false: the test drives the status.
  bool run_containers = true;
  // The container that runs; when no container has this name, the first one.
  std::string container_name = "worker";
  // command[0] -> the local executable that stands for it (e.g. "lockstep-worker" ->
  // build/bin/lockstep-worker). Looked up by the word, then by its basename.
  std::map<std::string, std::string> executables;
  // The uid every image runs as when the pod names no runAsUser (the simulator runs no images):
  // Lockstep's worker image's. 0 makes runAsNonRoot refuse to start the container, as a kubelet
  // does for a root image.
  int64_t image_user = 65532;
  // Added to every container's env after its own entries (these win).
  std::vector<std::pair<std::string, std::string>> extra_env;
  // How often the pods are listed and the processes checked. Smaller: faster reactions, more
  // curl processes (each LIST is one).
  int64_t poll_interval_ms = 100;
  // Upper bound of a pod's termination grace period, so that a test never waits 30 s.
  int64_t max_grace_period_ms = 5000;
  // Pod directories (volumes, logs) go here; empty: a fresh temporary directory, removed by the
  // destructor unless LOCKSTEP_KEEP_KUBE_TESTENV=1.
  std::string work_dir;
};

class KubeletSimulator {
 public:
  // Checks that the API server answers the LIST and starts the poll thread. `kube` must outlive
  // the simulator.
  static StatusOr<std::unique_ptr<KubeletSimulator>> Start(const KubeTestEnv* kube,
                                                           KubeletSimulatorOptions options);
  // Stops polling, then SIGTERMs every process and SIGKILLs what is left after
  // max_grace_period_ms, reaps them all and removes the work directory. Leaves the pods in the
  // API as they are (a node that went away).
  ~KubeletSimulator();
  KubeletSimulator(const KubeletSimulator&) = delete;
  KubeletSimulator& operator=(const KubeletSimulator&) = delete;

  // Status as a kubelet writes it, for the pod `namespace_/name` (taken over, and bound if
  // bind_pods, when not seen yet). With run_containers: SetRunning starts the process if it has
  // not started; SetTerminated and SetEvicted SIGKILL a running process first (its own exit is
  // then not reported). SetTerminated: phase Succeeded (0) or Failed, the container terminated
  // with `exit_code`. SetEvicted: phase Failed, reason Evicted, `message`, Ready False; the
  // container gets no terminated state (no exit code: an eviction is not the app's failure).
  // NOT_FOUND when the pod does not exist; FAILED_PRECONDITION when it is bound to another node.
  Status SetRunning(const std::string& namespace_, const std::string& name);
  Status SetTerminated(const std::string& namespace_, const std::string& name, int exit_code);
  Status SetEvicted(const std::string& namespace_, const std::string& name,
                    const std::string& message = "The node was low on resource: memory.");

  // Sends `signal` to the pod's main process; SIGKILL goes to its whole process group (a
  // container's PID 1 killed takes the rest with it). The exit is then reported as any other:
  // SIGKILL reads as exit code 137. NOT_FOUND when no process runs for the pod.
  Status KillContainer(const std::string& namespace_, const std::string& name, int signal);

  // The main process ids of the running containers.
  std::vector<pid_t> Pids() const;
  // The pid running for the pod, or 0.
  pid_t PidOf(const std::string& namespace_, const std::string& name) const;
  // Number of containers running as processes.
  int RunningCount() const;
  // The output of the pod's latest container (also after it exited or the pod was deleted);
  // empty when it never ran.
  std::string LogOf(const std::string& namespace_, const std::string& name) const;
  // One line per pod the simulator tracks (state, pid, exit) plus each log's tail: for
  // failure messages.
  std::string Describe() const;
  // Waits until a whole poll round has run after this call began (so the simulator has seen
  // everything the API server held when the call began); false past timeout_ms.
  bool WaitForSync(int64_t timeout_ms) const;

  const std::string& node_name() const { return options_.node_name; }
  const std::string& work_dir() const { return work_dir_; }

 private:
  struct Pod;

  KubeletSimulator(const KubeTestEnv* kube, KubeletSimulatorOptions options);
  void PollLoop();
  void SyncOnce();
  void ShutDown();

  // All below: called with mutex_ held.
  void SyncPod(Pod* pod, const nlohmann::json& object);
  bool Claim(const nlohmann::json& object, nlohmann::json* claimed);
  Status StartContainer(Pod* pod);
  Status PrepareContainer(Pod* pod, std::vector<std::string>* argv, std::vector<std::string>* env,
                          std::string* cwd);
  StatusOr<std::string> ReadKey(const std::string& namespace_, const std::string& kind,
                                const std::string& name, const std::string& key, bool optional);
  StatusOr<nlohmann::json> ReadData(const std::string& namespace_, const std::string& kind,
                                    const std::string& name, bool optional);
  void ReapAndEnforce(Pod* pod);
  void OnExit(Pod* pod, int exit_code);
  Status WriteStatus(Pod* pod);
  Status FinishDeletion(Pod* pod);
  StatusOr<Pod*> Adopt(const std::string& namespace_, const std::string& name);
  Pod* Track(const nlohmann::json& claimed);
  Pod* Find(const std::string& namespace_, const std::string& name) const;
  void BeginStop(Pod* pod, int64_t grace_ms);

  const KubeTestEnv* const kube_;
  const KubeletSimulatorOptions options_;
  std::string work_dir_;
  bool remove_work_dir_ = false;

  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  bool stopping_ = false;
  int64_t rounds_ = 0;                                // completed poll rounds
  std::map<std::string, std::unique_ptr<Pod>> pods_;  // by uid
  std::map<std::string, std::string> logs_;           // "namespace/name" -> latest log path
  std::thread poller_;
};

}  // namespace lockstep::testing
