"""What the end-to-end tests need of the cluster scripts/cluster.sh starts: kubectl against it,
TrainingJobs and their pods, and waits that always end.

Every wait has a deadline and says what it waited for when it gives up; the cluster's state at that
moment (pods, events, the job) goes with the failure.
"""
import datetime
import json
import os
import re
import subprocess
import time
import uuid

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATE = os.environ.get("LOCKSTEP_CLUSTER_DIR", "/var/lib/lockstep-cluster")
KUBECONFIG = os.path.join(STATE, "admin.kubeconfig")
CLUSTER_SH = os.path.join(REPO, "scripts", "cluster.sh")
NODES = ("lockstep-node-1", "lockstep-node-2")
JOB_LABEL = "lockstep.io/job-name"
INDEX_LABEL = "lockstep.io/replica-index"


class Timeout(AssertionError):
    pass


def kubectl(*args, input=None, timeout=60, check=True):
    """kubectl's stdout; a failure raises with its stderr."""
    result = subprocess.run(["kubectl", "--kubeconfig", KUBECONFIG, *args], input=input,
                            capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError("kubectl %s: %s" % (" ".join(args), result.stderr.strip()))
    return result.stdout


def helm(*args, timeout=180, check=True):
    """Helm v4 (scripts/helm-tools.sh) against the cluster: its stdout; a failure raises with its
    stderr."""
    binary = subprocess.run([os.path.join(REPO, "scripts", "helm-tools.sh")], capture_output=True,
                            text=True, check=True, timeout=300).stdout.strip()
    result = subprocess.run([binary, "--kubeconfig", KUBECONFIG, *args], capture_output=True,
                            text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError("helm %s: %s" % (" ".join(args), result.stderr.strip()))
    return result.stdout


def get_json(*args, timeout=30):
    return json.loads(kubectl("get", "-o", "json", *args, timeout=timeout))


def wait_for(what, probe, timeout, interval=0.5):
    """Calls probe until it returns something truthy, at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = probe()
            if value:
                return value
        except (AssertionError, OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as error:
            last_error = error
        if time.monotonic() >= deadline:
            raise Timeout("%s: not within %ss%s" % (what, timeout,
                                                   "" if last_error is None else " (%s)" % last_error))
        time.sleep(interval)


def example(name):
    """An example manifest of examples/ as an object."""
    with open(os.path.join(REPO, "examples", name), encoding="utf-8") as f:
        return yaml.safe_load(f)


def spread_over_nodes(job, unless_labelled=None):
    """Adds what a user writes to spread a job's pods over nodes: a topology spread constraint
    on the hostname, through the job's pod template; 4 pods on 2 nodes are 2 and 2.

    Kubernetes 1.20 still counts a lost (tainted) node's domain, so a replacement could never go
    to the other node (nodeTaintsPolicy: Honor is 1.26). With `unless_labelled`, the pods also
    require nodes without that label; the scheduler leaves the nodes a pod cannot have out of the
    spread, so a test takes a lost node out by labelling it."""
    spec = job["spec"].setdefault("template", {}).setdefault("spec", {})
    spec["topologySpreadConstraints"] = [{
        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {JOB_LABEL: job["metadata"]["name"]}}}]
    if unless_labelled:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": unless_labelled, "operator": "DoesNotExist"}]}]}}}
    return job


def shared_checkpoints(job, directory):
    """Puts the job's checkpoints on a hostPath directory both nodes share (as an NFS mount would
    be: $state/shared is the same directory in both nodes' filesystems), owned by the workers'
    user, mounted at /checkpoints in every worker."""
    os.makedirs(directory, exist_ok=True)
    os.chown(directory, 65532, 65532)
    job["spec"]["checkpoint"] = dict(job["spec"].get("checkpoint", {}),
                                     uri="file:///checkpoints/" + job["metadata"]["name"])
    pod = job["spec"].setdefault("template", {}).setdefault("spec", {})
    pod["volumes"] = [{"name": "checkpoints", "hostPath": {"path": directory, "type": "Directory"}}]
    pod["containers"] = [{"name": "worker", "volumeMounts": [
        {"name": "checkpoints", "mountPath": "/checkpoints"}]}]
    return job


# The images of users' own that tests/e2e/cluster_up.sh builds and loads into both nodes.
USER_IMAGE = "localhost/lockstep/pytorch-example:dev"   # examples/pytorch: trixie's torch 2.6
NO_SHELL_IMAGE = "localhost/lockstep/no-shell:dev"       # a static busybox alone


def user_image_archive():
    """The docker-archive of USER_IMAGE that tests/e2e/cluster_up.sh loaded into the nodes."""
    with open(os.path.join(STATE, "user-image.archive"), encoding="utf-8") as f:
        return f.read().strip()


def shared_volume(namespace, name):
    """A ReadWriteMany claim `name` in `namespace` on the storage both nodes share (GlusterFS;
    cluster.sh shared-volume)."""
    subprocess.run([CLUSTER_SH, "shared-volume", namespace, name], capture_output=True, text=True,
                   timeout=60, check=True)


def delete_shared_volume(namespace, name):
    """The PersistentVolume shared_volume made (the claim goes with its namespace)."""
    kubectl("delete", "pv", "%s-%s" % (namespace, name), "--wait=false", check=False)


def user_image_job(namespace, name, steps, in_place=False, replicas=4, extra_args=()):
    """examples/pytorch-ddp-cluster.yaml named `name`: the DDP script in USER_IMAGE for `steps`
    steps, in place with lockstep.elastic when asked. Its checkpoint (every 50 steps) and its
    timeline (a line per step of every rank: timeline()) are in `namespace`'s own folder of the
    claim "checkpoints", so a test run again never finds an earlier run's."""
    job = example("pytorch-ddp-cluster.yaml")
    job["metadata"]["name"] = name
    spec = job["spec"]
    spec["replicas"] = replicas
    folder = "/checkpoints/%s/%s" % (namespace, name)
    command = ["python3", "train_ddp.py", "--steps", str(steps), "--batch-size", "64",
               "--checkpoint", folder + "/ckpt.pt", "--checkpoint-every", "50",
               "--timeline", folder + "/timeline.jsonl"]
    spec["command"] = command + (["--in-place"] if in_place else []) + list(extra_args)
    return job


def timeline(namespace, name):
    """The steps user_image_job's ranks recorded ({rank, step, time, world, generation, ...}),
    read from the GlusterFS brick on this machine."""
    path = os.path.join(STATE, "gluster", "brick", namespace, name, "timeline.jsonl")
    events = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line being written
    except OSError:
        pass
    return [e for e in events if e.get("event") == "step"]


def first_step_after(namespace, name, generation, world=None):
    """The first step any rank recorded in a generation after `generation` (at world size
    `world`, when given), or None."""
    later = [e for e in timeline(namespace, name) if e.get("generation", 0) > generation and
             world in (None, e.get("world"))]
    return min(later, key=lambda e: e["time"]) if later else None


TIMESTAMPED = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z (.*)$")


def kubelet_time(stamp):
    """Seconds since the epoch of `kubectl logs --timestamps`' RFC 3339 nanosecond stamp."""
    whole, fraction = stamp.split(".")
    seconds = datetime.datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(
        tzinfo=datetime.timezone.utc).timestamp()
    return seconds + float("0." + fraction)


def stamped_lines(ns, pod, pattern, after=0.0, container=None, previous=False):
    """(time, match) of each line of `pod`'s log matching `pattern` at or after `after`, timed by
    the container runtime (kubectl logs --timestamps): for programs whose lines carry no time."""
    args = ["logs", "-n", ns.name, pod, "--timestamps"]
    if container:
        args += ["-c", container]
    if previous:
        args.append("--previous")
    found = []
    for line in kubectl(*args, timeout=30, check=False).splitlines():
        stamped = TIMESTAMPED.match(line)
        if not stamped:
            continue
        at = kubelet_time(stamped.group(1))
        match = re.search(pattern, stamped.group(2))
        if match and at >= after:
            found.append((at, match))
    return found


def first_stamped_line(ns, job_name, pattern, after):
    """The time of the first line matching `pattern` at or after `after` in any of the job's
    pods, or None."""
    times = [found[0][0] for found in (stamped_lines(ns, p["metadata"]["name"], pattern, after)
                                       for p in ns.pods(job_name)) if found]
    return min(times) if times else None


class Namespace:
    """A namespace of its own for one test, deleted (without waiting) at the end."""

    def __init__(self, prefix):
        self.name = "%s-%s" % (prefix, uuid.uuid4().hex[:6])

    def __enter__(self):
        kubectl("create", "namespace", self.name)
        return self

    def __exit__(self, *exc):
        kubectl("delete", "namespace", self.name, "--wait=false", check=False)

    def apply(self, obj):
        return kubectl("apply", "-n", self.name, "-f", "-", input=json.dumps(obj))

    def job(self, name):
        return get_json("trainingjob", name, "-n", self.name)

    def pods(self, job_name):
        """The job's pods that are not being deleted, by replica index."""
        items = get_json("pods", "-n", self.name, "-l", "%s=%s" % (JOB_LABEL, job_name))["items"]
        return sorted((p for p in items if not p["metadata"].get("deletionTimestamp")),
                      key=lambda p: int(p["metadata"]["labels"].get(INDEX_LABEL, 0)))

    def wait_job(self, name, what, predicate, timeout):
        """Waits until predicate(job) holds; the job, its pods and the events explain a failure."""
        return self.wait(name, "job %s/%s: %s" % (self.name, name, what),
                         lambda: (lambda j: j if predicate(j) else None)(self.job(name)), timeout)

    def wait(self, name, what, probe, timeout):
        """wait_for, with job `name`'s state (describe) in the failure."""
        try:
            return wait_for(what, probe, timeout)
        except Timeout as error:
            raise Timeout("%s\n%s" % (error, self.describe(name))) from None

    def describe(self, name):
        """What explains a failure, the most telling first (a long report may be cut in its
        middle): the job's pods and each one's last log lines, the operators' lines about the job
        and the replicas' state (leader, label, restarts), then the job's status, the events, the
        nodes and what the node lifecycle controller did (why a lost node's pods were not
        evicted)."""
        parts = ["$ kubectl -n %s get pods -o wide\n%s" % (
            self.name, kubectl("get", "pods", "-o", "wide", "-n", self.name, check=False))]
        try:
            items = job_pods_any_state(self.name, name)
        except AssertionError as error:
            items = []
            parts.append("(the job's pods: %s)" % error)
        for pod in items:
            pod_name = pod["metadata"]["name"]
            try:
                log = kubectl("logs", "-n", self.name, pod_name, "--tail=12",
                              "--request-timeout=10s", check=False, timeout=15)
            except subprocess.TimeoutExpired:
                log = "(no log: its node does not answer)"
            parts.append("$ kubectl logs %s --tail=12\n%s" % (pod_name, log.rstrip()))
        args = ("logs", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/component=operator",
                "--tail=2000", "--prefix")
        about = [line for line in kubectl(*args, check=False).splitlines()
                 if "%s/%s" % (self.name, name) in line]
        parts.append("$ kubectl %s | grep %s/%s | tail -30\n%s" % (
            " ".join(args), self.name, name, "\n".join(about[-30:])))
        parts.append(operator_summary())
        status = kubectl("get", "trainingjob", name, "-n", self.name, "-o", "jsonpath={.status}",
                         check=False)
        parts.append("$ kubectl -n %s get trainingjob %s -o jsonpath={.status}\n%s" % (
            self.name, name, status))
        parts.append("$ kubectl -n %s get events --sort-by=.lastTimestamp\n%s" % (
            self.name, kubectl("get", "events", "--sort-by=.lastTimestamp", "-n", self.name,
                               check=False)))
        parts.append("$ kubectl get nodes -o wide\n%s" % kubectl("get", "nodes", "-o", "wide",
                                                                 check=False))
        log = os.path.join(STATE, "logs", "kube-controller-manager.log")
        try:
            with open(log, errors="replace") as f:
                lines = [line.rstrip() for line in f
                         if "node_lifecycle" in line or "taint" in line.lower()]
        except OSError as error:
            lines = ["(cannot read %s: %s)" % (log, error)]
        parts.append("$ grep node_lifecycle|taint %s | tail -20\n%s" % (log,
                                                                     "\n".join(lines[-20:])))
        return "\n".join(parts)

    def logs(self, pod, previous=False):
        return kubectl("logs", "-n", self.name, pod, *(["--previous"] if previous else []),
                       timeout=30)


def log_time(stamp):
    """Seconds since the epoch of a Lockstep log line's timestamp (2026-11-25T19:17:32.572Z)."""
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


TRAINING_FROM = re.compile(r"^(\S+) I .*training from step (\d+) at world size (\d+)", re.M)


def first_training(logs, after=0.0, world=None):
    """(time, step, world) of the first "training from step" line at or after `after` (and at
    world size `world`, when given)."""
    for stamp, step, size in TRAINING_FROM.findall(logs):
        if log_time(stamp) >= after and world in (None, int(size)):
            return log_time(stamp), int(step), int(size)
    return None


def first_training_of_any_pod(ns, job_name, after, world):
    """The time of the first "training from step" line at world size `world` at or after `after`
    in any of the job's pods, or None."""
    for pod in ns.pods(job_name):
        found = first_training(ns.logs(pod["metadata"]["name"]), after=after, world=world)
        if found:
            return found[0]
    return None


STEP_LINE = re.compile(r" step (\d+)/\d+ loss ")


def wait_logged_step(ns, job_name, step, timeout):
    """Waits until rank 0's log (whichever pod it is) shows a training step >= `step`: the
    workers' own pace, seen within a second, where status.progress lags by the operator's
    progress interval."""
    def reached():
        for pod in ns.pods(job_name):
            try:
                steps = [int(s) for s in STEP_LINE.findall(ns.logs(pod["metadata"]["name"]))]
            except AssertionError:
                continue  # not started yet
            if steps and max(steps) >= step:
                return max(steps)
        return None
    return wait_for("%s logging step %d" % (job_name, step), reached, timeout=timeout)


def table_step(text):
    """The STEP column of `kubectl get tj NAME`: kubectl aligns each value under its header."""
    lines = [l for l in text.splitlines() if l.strip()]
    at = lines[0].find(" STEP ")
    if at < 0 or len(lines) < 2:
        return None
    words = lines[1][at + 1:].split()
    return int(words[0]) if words and words[0].isdigit() else None


def phase(job):
    return job.get("status", {}).get("phase", "")


def step(job):
    return job.get("status", {}).get("progress", {}).get("step", 0) or 0


def condition(job, kind):
    for c in job.get("status", {}).get("conditions", []):
        if c.get("type") == kind:
            return c
    return None


def container_id(pod):
    statuses = pod.get("status", {}).get("containerStatuses", [])
    return statuses[0].get("containerID", "") if statuses else ""


def containers(pods):
    """{pod name: (container id, restart count)}: the same later means each kept its process."""
    return {p["metadata"]["name"]: (container_id(p), restart_count(p)) for p in pods}


def job_pods_any_state(ns_name, job_name):
    """Every pod of the job, those being deleted included."""
    return get_json("pods", "-n", ns_name, "-l", "%s=%s" % (JOB_LABEL, job_name))["items"]


def restart_count(pod):
    statuses = pod.get("status", {}).get("containerStatuses", [])
    return statuses[0].get("restartCount", 0) if statuses else 0


def node_exec(node, *command, timeout=30):
    """COMMAND in NODE's network and mount namespaces (what runs on that machine)."""
    ns = os.path.join(STATE, "ns", node)
    return subprocess.run(["nsenter", "--net=/run/netns/" + node, "--mount=" + ns, "--", *command],
                          capture_output=True, text=True, timeout=timeout, check=True).stdout


def node_ready(node):
    for c in get_json("node", node)["status"].get("conditions", []):
        if c["type"] == "Ready":
            return c["status"] == "True"
    return False


OPERATOR_NAMESPACE = "lockstep-system"
LEASE = "lockstep-operator"


TIMED_STEP_LINE = re.compile(r"^(\S+) I .* step (\d+)/\d+ loss ", re.M)


def step_times(ns, job_name):
    """(time, step) of every step line of rank 0, whichever pod logs them."""
    for pod in ns.pods(job_name):
        found = [(log_time(stamp), int(step))
                 for stamp, step in TIMED_STEP_LINE.findall(ns.logs(pod["metadata"]["name"]))]
        if found:
            return found
    return []


def longest_pause(ns, job_name, start, end):
    """(longest, usual): the longest gap between rank 0's step lines from 5 s before `start` to
    10 s after `end`, and the longest before `start` (the job's own pace)."""
    times = [t for t, _ in step_times(ns, job_name) if start - 5 <= t <= end + 10]
    if len(times) <= 2:
        raise AssertionError("rank 0 logged %d steps around %.0f..%.0f\n%s" % (
            len(times), start, end, ns.describe(job_name)))
    before = [t for t in times if t < start]
    return (max(b - a for a, b in zip(times, times[1:])),
            max((b - a for a, b in zip(before, before[1:])), default=0.0))


def train_elastic_job_at_world_4(ns, steps):
    """examples/elastic.yaml over both nodes, `steps` long with a checkpoint every 2,000 steps
    on storage both nodes share, applied in `ns` and waited for until its 4 workers train and rank
    0 logged step 200: (its name, its generation, containers() of its 4 pods)."""
    job = spread_over_nodes(example("elastic.yaml"))
    name = job["metadata"]["name"]
    job["spec"]["trainer"]["steps"] = steps
    job["spec"]["checkpoint"]["intervalSteps"] = 2000
    shared_checkpoints(job, os.path.join(STATE, "shared", ns.name))
    ns.apply(job)
    trained = ns.wait_job(name, "training at world 4", lambda j: step(j) > 0 and
                          j["status"].get("rendezvous", {}).get("worldSize") == 4, timeout=300)
    wait_logged_step(ns, name, 200, timeout=300)
    workers = containers(ns.pods(name))
    if len(workers) != 4:
        raise AssertionError("%d worker pods\n%s" % (len(workers), ns.describe(name)))
    return name, trained["status"]["rendezvous"]["generation"], workers


def wait_generation_taken_up(ns, job_name, generation, step_at_lead, leader, workers):
    """Waits until the job's status (written by the new leader `leader`) shows `generation` at
    world 4 training past `step_at_lead`: taken up, not re-formed (that numbers the next one).
    A failure ends with what the workers saw of the service going away and coming back."""
    def taken_up():
        j = ns.job(job_name)
        rendezvous = j["status"].get("rendezvous", {})
        if phase(j) in ("Succeeded", "Failed"):
            raise AssertionError("the job ended before the new leader showed it: size its steps "
                                 "up for this machine\n" + ns.describe(job_name))
        return (rendezvous.get("worldSize") == 4 and rendezvous.get("generation") == generation
                and step(j) > step_at_lead)
    try:
        ns.wait(job_name, "the new leader %s showing generation %d training" % (leader, generation),
                taken_up, timeout=120)
    except (Timeout, AssertionError) as error:
        def tail(pod):
            lines = [line for line in ns.logs(pod).splitlines() if "rendezvous" in line]
            return "\n".join(lines[-12:])
        raise AssertionError("%s\n%s" % (error, "\n".join(
            "$ kubectl logs %s | grep rendezvous (last lines)\n%s" % (pod, tail(pod))
            for pod in workers))) from None


def assert_ended_undisturbed(ns, job_name, steps, generation, workers):
    """Waits for the job to end and asserts that the operator's change under it cost nothing:
    Succeeded at exactly `steps`, no restart, still `generation` (never re-formed), and every
    worker of `workers` (containers()) kept its pod, container and restart count."""
    done = ns.wait_job(job_name, "finished", lambda j: phase(j) in ("Succeeded", "Failed"),
                       timeout=1200)
    if phase(done) != "Succeeded":
        raise AssertionError("the job %s\n%s" % (phase(done), ns.describe(job_name)))
    if step(done) != steps:
        raise AssertionError("the job ended at step %d, not %d" % (step(done), steps))
    if done["status"].get("restarts", 0) != 0:
        raise AssertionError("%d restarts counted\n%s" % (done["status"]["restarts"],
                                                          ns.describe(job_name)))
    if done["status"]["rendezvous"]["generation"] != generation:
        raise AssertionError("the workers re-formed (generation %d, was %d):\n%s" % (
            done["status"]["rendezvous"]["generation"], generation, ns.describe(job_name)))
    after = containers(job_pods_any_state(ns.name, job_name))
    for pod, kept in workers.items():
        if after.get(pod) != kept:
            raise AssertionError("worker %s did not keep its pod, container and restart count: "
                                 "%s, now %s" % (pod, kept, after.get(pod)))


def operator_leader():
    """(pod, node) of the operator replica holding the leader Lease, when the leader label is on
    that pod alone (a hand-over in progress answers None)."""
    try:
        holder = get_json("lease", LEASE, "-n", OPERATOR_NAMESPACE)["spec"].get("holderIdentity")
    except AssertionError:
        return None
    labelled = get_json("pods", "-n", OPERATOR_NAMESPACE, "-l",
                        "lockstep.io/rendezvous-leader=true")["items"]
    if not holder or [p["metadata"]["name"] for p in labelled] != [holder]:
        return None
    return holder, labelled[0]["spec"].get("nodeName")


def operator_pods():
    return get_json("pods", "-n", OPERATOR_NAMESPACE, "-l",
                    "app.kubernetes.io/component=operator")["items"]


def pod_ready(pod):
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod.get("status", {}).get("conditions", []))


def operator_summary():
    """A few lines on the operators: the Lease, each replica (node, ready, restarts, leader
    label) and its last log lines, for a failure message's end, which survives truncation."""
    lines = []
    try:
        lease = kubectl("get", "lease", LEASE, "-n", OPERATOR_NAMESPACE, "-o",
                        "jsonpath={.spec.holderIdentity} acquired {.spec.acquireTime} renewed "
                        "{.spec.renewTime} transitions {.spec.leaseTransitions}", check=False,
                        timeout=30)
        lines.append("operator lease: holder " + lease.strip())
        pods = operator_pods()
    except (AssertionError, subprocess.TimeoutExpired) as error:
        return "\n".join(lines + ["(the operators' state: %s)" % error])
    for pod in pods:
        name = pod["metadata"]["name"]
        ready = pod_ready(pod)
        lines.append("operator %s on %s: phase %s, ready %s, restarts %d, leader label %s%s" % (
            name, pod["spec"].get("nodeName"), pod["status"].get("phase"), ready,
            restart_count(pod), pod["metadata"].get("labels", {}).get(
                "lockstep.io/rendezvous-leader", "-"),
            ", deleting" if pod["metadata"].get("deletionTimestamp") else ""))
        try:  # a replica on a lost node has no kubelet to answer
            log = kubectl("logs", "-n", OPERATOR_NAMESPACE, name, "--tail=12",
                          "--request-timeout=10s", check=False, timeout=15)
        except subprocess.TimeoutExpired:
            log = "(no log: its node does not answer)"
        lines.extend("  " + line for line in log.splitlines())
    return "\n".join(lines)


def kill_container(pod):
    """SIGKILL to the main process of the pod's container, through its node's containerd."""
    cid = container_id(pod).split("://", 1)[-1]
    node_exec(pod["spec"]["nodeName"], "ctr", "--namespace", "k8s.io", "tasks", "kill",
              "--signal", "SIGKILL", cid)
