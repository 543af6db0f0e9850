#!/usr/bin/env python3
"""A real Prometheus (Debian's) scrapes a running `lockstep run` and a running lockstep-operator on
loopback, loads the chart's alert rules, and every PromQL expression of the Grafana dashboard and
of the rules returns data.

    prometheus_scrape_test.py --lockstep build/bin/lockstep --source REPO --rules DIR/rules/alerts.yaml
        --operator build/bin/lockstep-operator --kube-testenv-server build/bin/kube_testenv_server

What it does:
  1. starts kube_testenv_server (kube-apiserver 1.20.2 + etcd on loopback, the TrainingJob CRD
     installed; a first run builds kube-apiserver, minutes) and, meanwhile, `lockstep run` on a
     manifest derived from examples/digits.yaml: 4 workers as a pipeline of 2 stages x 2
     replicas, enough steps to outlast the test, hidden [1024, 1024] so that steps take
     milliseconds, checkpoints every 200 steps (about
     one a second), metrics on free ports;
  2. starts lockstep-operator against that API server (no leader election, metrics, rendezvous on
     free loopback ports, progress written every second) and waits for its /readyz;
  3. starts Prometheus (1 s scrape and rule evaluation) with SCRAPE_TARGETS and the rules;
  4. makes the operator's job counters move while Prometheus scrapes, acting as the kubelet where
     needed (no kubelet or scheduler runs: pods stay Pending unless the test writes their status):
     a job that keeps running (reconciled every second, so the reconcile histogram has rates),
     one of its pods marked Failed (a restart), a job whose pod is marked Succeeded, and a job the
     operator fails (elastic.minReplicas > replicas, which only the operator checks);
  5. `promtool check metrics` on each worker's /metrics and on the operator's;
  6. evaluates through /api/v1/query every dashboard query (panels and template variables, with
     $namespace, $job and $__rate_interval filled in), every recording rule, and every alert's
     signal (its top-level comparison made `bool`, so the alert's series show whether it fires
     or not); each must return at least one finite sample, and the operator's job counter
     panels (increase of lockstep_operator_jobs_*_total) a positive one, since step 4 moved each.
Every process it starts is stopped on exit, failures and SIGTERM included.
"""
import argparse
import ctypes
import json
import math
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

# A pipeline of 2 stages x 2 replicas: every data-parallel panel has data (each stage's replicas
# all-reduce their gradients) and so does the pipeline row.
WORKERS = 4


def scrape_targets(worker_ports, operator_metrics_port):
    """(scrape job name, targets, honor_labels, static labels). Workers keep their own `job`
    label (the TrainingJob, as the PodMonitor's honorLabels does) and get the `namespace` label
    the PodMonitor adds from the pod; the operator gets the `namespace` and `pod` labels the
    ServiceMonitor adds."""
    return [
        ("lockstep-workers", ["127.0.0.1:%d" % p for p in worker_ports], True, {"namespace": "default"}),
        ("lockstep-operator", ["127.0.0.1:%d" % operator_metrics_port], False,
         {"namespace": "lockstep-system", "pod": "lockstep-operator-0"}),
    ]


class KubeApi:
    """The API server of kube_testenv_server, as its admin (bearer token, its CA)."""

    def __init__(self, server, token, ca):
        self.server, self.token = server, token
        self.context = ssl.create_default_context(cafile=ca)

    def request(self, method, path, body=None, content_type="application/json"):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Authorization", "Bearer " + self.token)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=10, context=self.context) as response:
                return response.status, json.loads(response.read().decode() or "null")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()


JOBS = "/apis/lockstep.io/v1alpha1/namespaces/default/trainingjobs"


def training_job(name, replicas, **spec):
    """A TrainingJob as the operator tests write them: the digits data, a small MLP."""
    job = {
        "apiVersion": "lockstep.io/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "trainer": {
                "model": {"type": "mlp", "hidden": [32]},
                "data": {"format": "csv", "train": [
                    "file:///usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"]},
                "batchSize": 32, "steps": 200},
            "metrics": {"port": 0},
        },
    }
    job["spec"].update(spec)
    return job


def start_kube(binary, crd, work, processes):
    """kube_testenv_server, started; returns (process, a function that waits for its JSON line).
    Its stdin stays an open pipe: it stops when the pipe closes (also when this script dies)."""
    log = open(os.path.join(work, "kube-testenv-server.log"), "w")
    # Its directory (certificates, etcd data, server logs) under ours: removed with it, even when
    # the server is stopped while it starts (it then exits without cleaning up).
    tmp = os.path.join(work, "kube")
    os.mkdir(tmp)
    process = subprocess.Popen([binary, "--crd", crd], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=log, text=True,
                               env=dict(os.environ, TMPDIR=tmp), start_new_session=True,
                               preexec_fn=die_with_parent)
    processes.append(process)
    lines = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
    reader.start()

    def ready(timeout_s):
        deadline = time.time() + timeout_s
        while time.time() < deadline and reader.is_alive():
            reader.join(timeout=1)
            if process.poll() is not None and reader.is_alive():
                break
        if not lines or not lines[0].strip():
            with open(log.name) as f:
                tail = f.read()[-4000:]
            raise RuntimeError("kube_testenv_server %s within %d s:\n%s" % (
                "exited (%s)" % process.returncode if process.poll() is not None else "not ready",
                timeout_s, tail))
        return json.loads(lines[0])
    return process, ready


def stop_process(process, timeout_s):
    """SIGINT to its process group (closing its stdin first, if a pipe), SIGKILL past timeout_s."""
    if process.poll() is None:
        if process.stdin:
            try:
                process.stdin.close()
            except OSError:
                pass
        try:
            os.killpg(process.pid, signal.SIGINT)
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        except ProcessLookupError:
            process.wait()


_LIBC = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    """preexec_fn of every process started here: SIGTERM when this script dies, even by SIGKILL
    (ctest's timeout), so that nothing it started outlives it."""
    _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port_run(count):
    """A base port P such that P..P+count-1 are free on all interfaces right now."""
    for _ in range(100):
        sockets = []
        try:
            first = socket.socket()
            first.bind(("0.0.0.0", 0))
            base = first.getsockname()[1]
            sockets.append(first)
            for i in range(1, count):
                s = socket.socket()
                s.bind(("0.0.0.0", base + i))
                sockets.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no %d adjacent free ports" % count)


def http_get(url, timeout=3):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def wait_for(condition, timeout_s, what):
    deadline = time.time() + timeout_s
    last_error = None
    while time.time() < deadline:
        try:
            if condition():
                return
        except Exception as e:  # not up yet
            last_error = e
        time.sleep(0.5)
    raise RuntimeError("timed out after %ds waiting for %s (%s)" % (timeout_s, what, last_error))


def alert_signal(expr):
    """The expression with its last top-level comparison turned into `bool`, so it returns the
    signal's series (0 or 1) instead of filtering them."""
    depth, position, operator, i = 0, None, None, 0
    in_string = None
    while i < len(expr):
        c = expr[i]
        if in_string:
            if c == "\\":
                i += 2
                continue
            if c == in_string:
                in_string = None
        elif c in "\"'`":
            in_string = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            for op in ("==", "!=", ">=", "<=", ">", "<"):
                if expr.startswith(op, i) and not expr.startswith("=~", i):
                    position, operator = i, op
                    i += len(op) - 1
                    break
        i += 1
    if position is None:
        raise ValueError("alert expression without a top-level comparison: %s" % expr)
    return expr[: position + len(operator)] + " bool" + expr[position + len(operator):]


def dashboard_queries(dashboard):
    """(title, expr) of every panel target and template variable query."""
    queries = []

    def walk(panels):
        for panel in panels:
            for target in panel.get("targets", []):
                queries.append(("panel %r" % panel["title"], target["expr"]))
            walk(panel.get("panels", []))
    walk(dashboard["panels"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query.strip())
        if not match:
            raise ValueError("variable %s: unsupported query %s" % (variable["name"], query))
        queries.append(("variable $%s" % variable["name"],
                        "count by (%s) (%s)" % (match.group(2), match.group(1))))
    return queries


def rule_queries(rules):
    queries = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                queries.append(("recording rule %s" % rule["record"], rule["expr"]))
            else:
                queries.append(("alert %s" % rule["alert"], alert_signal(rule["expr"])))
    return queries


def metric_values(text, name):
    """{labels text: value} of one metric family's samples in a /metrics text."""
    values = {}
    for match in re.finditer(r"^%s(\{[^}]*\})? (\S+)$" % re.escape(name), text, re.M):
        values[match.group(1) or ""] = float(match.group(2))
    return values


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lockstep", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--rules", required=True)
    parser.add_argument("--operator", required=True, help="the lockstep-operator binary")
    parser.add_argument("--kube-testenv-server", required=True,
                        help="tests/support/kube/kube_testenv_server (its binary)")
    parser.add_argument("--kube-timeout", type=int, default=1500,
                        help="seconds for kube_testenv_server to be ready (a first run builds "
                             "kube-apiserver)")
    parser.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus")
    parser.add_argument("--promtool", default=shutil.which("promtool") or "/usr/bin/promtool")
    options = parser.parse_args()
    for name in ("lockstep", "operator", "kube_testenv_server", "source", "rules"):
        setattr(options, name, os.path.abspath(getattr(options, name)))  # lockstep runs in source
    for tool in (options.prometheus, options.promtool):
        if not os.path.exists(tool):
            print("FAIL %s not found: scripts/setup.sh installs Debian's prometheus package" % tool)
            return 1
    for binary in (options.lockstep, options.operator, options.kube_testenv_server):
        if not os.access(binary, os.X_OK):
            print("FAIL %s not built (ninja builds it)" % binary)
            return 1
    # ctest's timeout (and anyone else) sends SIGTERM: run the cleanup below all the same.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    work = tempfile.mkdtemp(prefix="lockstep-prometheus-")
    processes = []
    failures = []
    completed = False
    try:
        # 1. The API server first: a first run builds kube-apiserver (minutes), longer than the
        #    training below would last.
        _, kube_ready = start_kube(
            options.kube_testenv_server, os.path.join(options.source, "crds", "trainingjob.yaml"),
            work, processes)
        kube = kube_ready(options.kube_timeout)
        api = KubeApi(kube["server"], kube["token"], kube["ca"])
        print("kube-apiserver ready at %s" % kube["server"])

        worker_base = free_port_run(WORKERS)
        with open(os.path.join(options.source, "examples", "digits.yaml")) as f:
            manifest = yaml.safe_load(f)
        manifest["metadata"]["name"] = "digits-scrape"
        # A model big enough that steps take milliseconds: a run of tiny steps ends (or floods its
        # log) before the test is done, however many steps it is given. Stopped by the test.
        manifest["spec"]["trainer"]["model"]["hidden"] = [1024, 1024]
        manifest["spec"]["replicas"] = WORKERS
        manifest["spec"]["trainer"]["pipeline"] = {"stages": 2, "microBatches": 2}
        manifest["spec"]["trainer"]["steps"] = 10000000
        manifest["spec"]["trainer"]["logIntervalSteps"] = 50
        manifest["spec"]["checkpoint"] = {"uri": "file://" + os.path.join(work, "ckpt"),
                                          "intervalSteps": 200, "keep": 2}
        manifest["spec"]["metrics"] = {"port": worker_base}
        manifest_path = os.path.join(work, "job.yaml")
        with open(manifest_path, "w") as f:
            yaml.safe_dump(manifest, f)
        run_log = open(os.path.join(work, "lockstep-run.log"), "w")
        lockstep = subprocess.Popen(
            [options.lockstep, "run", manifest_path, "--log-dir", os.path.join(work, "logs")],
            stdout=run_log, stderr=subprocess.STDOUT, cwd=options.source, start_new_session=True,
            preexec_fn=die_with_parent)
        processes.append(lockstep)
        worker_ports = [worker_base + i for i in range(WORKERS)]

        # A parameter-server job beside it (examples/click-log.yaml: 2 workers, 1 server), for
        # the dashboard's parameter-server row: its server serves metrics after the workers'
        # ports (which its workers do not use).
        click_log = os.path.join(os.path.dirname(options.lockstep), "lockstep-click-log")
        data = os.path.join(work, "click-log")
        subprocess.run([click_log, "--samples", "20000", "--test-samples", "1000", data],
                       check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(options.source, "examples", "click-log.yaml")) as f:
            ps_manifest = yaml.safe_load(f)
        ps_manifest["metadata"]["name"] = "ctr-scrape"
        ps_manifest["spec"]["replicas"] = 2
        ps_manifest["spec"]["parameterServers"] = {"replicas": 1}
        ps_manifest["spec"]["trainer"]["data"] = {
            "format": "clickLog", "train": [os.path.join(data, "train.tsv.gz")]}
        ps_manifest["spec"]["trainer"].pop("epochs", None)
        ps_manifest["spec"]["trainer"]["steps"] = 10000000
        ps_base = free_port_run(3)
        ps_manifest["spec"]["metrics"] = {"port": ps_base}
        ps_manifest_path = os.path.join(work, "ctr.yaml")
        with open(ps_manifest_path, "w") as f:
            yaml.safe_dump(ps_manifest, f)
        ps_run_log = open(os.path.join(work, "lockstep-run-ps.log"), "w")
        ps_run = subprocess.Popen(
            [options.lockstep, "run", ps_manifest_path, "--log-dir", os.path.join(work, "logs-ps")],
            stdout=ps_run_log, stderr=subprocess.STDOUT, cwd=options.source, start_new_session=True,
            preexec_fn=die_with_parent)
        processes.append(ps_run)
        server_ports = [ps_base + 2]

        # 2. The operator, while the workers start.
        operator_metrics_port = free_port_run(2)
        rendezvous_port = operator_metrics_port + 1
        operator_log = open(os.path.join(work, "lockstep-operator.log"), "w")
        operator = subprocess.Popen(
            [options.operator, "--kubeconfig", kube["kubeconfig"], "--leader-elect=false",
             "--identity", "lockstep-operator-0",
             "--metrics-host", "127.0.0.1", "--metrics-port", str(operator_metrics_port),
             "--rendezvous-host", "127.0.0.1", "--rendezvous-port", str(rendezvous_port),
             "--rendezvous-address", "127.0.0.1:%d" % rendezvous_port,
             "--progress-interval-ms", "1000", "--worker-image", "lockstep-worker:test"],
            stdout=operator_log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent)
        processes.append(operator)
        operator_url = "http://127.0.0.1:%d" % operator_metrics_port

        def operator_log_tail():
            with open(operator_log.name) as f:
                return f.read()[-3000:]

        def operator_ready():
            if operator.poll() is not None:
                raise SystemExit("lockstep-operator exited early (%s):\n%s" % (
                    operator.returncode, operator_log_tail()))
            http_get(operator_url + "/readyz")  # 503 raises
            return True
        wait_for(operator_ready, 30, "lockstep-operator /readyz")
        print("lockstep-operator ready (metrics :%d)" % operator_metrics_port)

        def training():
            if lockstep.poll() is not None:
                raise SystemExit("lockstep run exited early (%s); see %s" % (lockstep.returncode, run_log.name))
            committed = False
            for port in worker_ports:
                text = http_get("http://127.0.0.1:%d/metrics" % port)
                # Only rank 0 commits checkpoints, and which worker gets rank 0 is the order they
                # join the rendezvous in, not their index.
                if re.search(r"^lockstep_checkpoint_last_step\{[^}]*\} [1-9]", text, re.M):
                    committed = True
                if not re.search(r"^lockstep_train_steps_total\{[^}]*\} [1-9]", text, re.M):
                    return False
            return committed
        def serving():
            if ps_run.poll() is not None:
                raise SystemExit("lockstep run of the parameter-server job exited early (%s); see %s"
                                 % (ps_run.returncode, ps_run_log.name))
            text = http_get("http://127.0.0.1:%d/metrics" % server_ports[0])
            return re.search(r'^lockstep_ps_requests_total\{[^}]*kind="push"[^}]*\} [1-9]', text, re.M)
        try:
            wait_for(serving, 120, "the parameter server serving pushes")
        except RuntimeError:
            with open(ps_run_log.name) as f:
                print(f.read()[-3000:])
            raise
        try:
            wait_for(training, 120, "every worker training and a first checkpoint")
        except RuntimeError:
            with open(run_log.name) as f:
                print(f.read()[-3000:])
            raise

        def promtool_check(what, text):
            lint = subprocess.run([options.promtool, "check", "metrics"], input=text,
                                  capture_output=True, text=True)
            if lint.returncode != 0:
                failures.append("promtool check metrics on %s: %s%s" % (what, lint.stdout, lint.stderr))
            else:
                print("promtool check metrics: %s passes" % what)

        for port in worker_ports:
            promtool_check("worker :%d" % port, http_get("http://127.0.0.1:%d/metrics" % port))
        for port in server_ports:
            promtool_check("parameter server :%d" % port, http_get("http://127.0.0.1:%d/metrics" % port))

        # 3. Prometheus, before the operator's counters move, so that increase() sees them move.
        prometheus_port = free_port_run(1)
        targets = scrape_targets(worker_ports + server_ports, operator_metrics_port)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [os.path.abspath(options.rules)],
            "scrape_configs": [
                {"job_name": name, "honor_labels": honor,
                 "static_configs": [{"targets": addresses, "labels": labels}]}
                for name, addresses, honor, labels in targets],
        }
        config_path = os.path.join(work, "prometheus.yml")
        with open(config_path, "w") as f:
            yaml.safe_dump(config, f)
        prometheus_log = open(os.path.join(work, "prometheus.log"), "w")
        prometheus = subprocess.Popen(
            [options.prometheus, "--config.file=" + config_path,
             "--storage.tsdb.path=" + os.path.join(work, "tsdb"),
             "--web.listen-address=127.0.0.1:%d" % prometheus_port],
            stdout=prometheus_log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent)
        processes.append(prometheus)
        prometheus_api = "http://127.0.0.1:%d/api/v1/" % prometheus_port

        def query(expr):
            body = json.loads(http_get(prometheus_api + "query?" + urllib.parse.urlencode({"query": expr}), timeout=10))
            if body.get("status") != "success":
                raise RuntimeError(body)
            return body["data"]["result"]

        def targets_up():
            if prometheus.poll() is not None:
                raise SystemExit("prometheus exited (%s); see %s" % (prometheus.returncode, prometheus_log.name))
            return len([s for s in query("up == 1")]) == sum(len(t[1]) for t in targets)
        wait_for(targets_up, 60, "Prometheus scraping every target")
        rules_loaded = json.loads(http_get(prometheus_api + "rules"))["data"]["groups"]
        if not rules_loaded:
            failures.append("Prometheus loaded no rule group from %s" % options.rules)

        # 4. Jobs for the operator. No kubelet runs: the test writes the pods' status where a
        #    kubelet would.
        def apply(job):
            status, body = api.request("POST", JOBS, job)
            if status != 201:
                raise RuntimeError("creating TrainingJob %s: %s %s" % (job["metadata"]["name"], status, body))

        def pods(job_name):
            status, body = api.request("GET", "/api/v1/namespaces/default/pods?labelSelector=" +
                                       urllib.parse.quote("lockstep.io/job-name=" + job_name))
            if status != 200:
                raise RuntimeError("listing pods of %s: %s %s" % (job_name, status, body))
            return sorted(p["metadata"]["name"] for p in body["items"])

        def set_pod_phase(name, phase):
            status, body = api.request("PATCH", "/api/v1/namespaces/default/pods/%s/status" % name,
                                       {"status": {"phase": phase}}, "application/merge-patch+json")
            if status != 200:
                raise RuntimeError("marking pod %s %s: %s %s" % (name, phase, status, body))

        def job_status(name):
            status, body = api.request("GET", JOBS + "/" + name)
            return (body.get("status") or {}) if status == 200 and isinstance(body, dict) else {}

        apply(training_job("scrape-running", 2))  # never completes: reconciled every second
        apply(training_job("scrape-done", 1))
        # Accepted by the CRD's schema, refused by the operator's validation: Failed.
        apply(training_job("scrape-invalid", 2, elastic={"minReplicas": 3, "maxReplicas": 4}))
        try:
            wait_for(lambda: len(pods("scrape-running")) == 2 and len(pods("scrape-done")) == 1,
                     30, "the operator creating the jobs' pods")
            set_pod_phase(pods("scrape-running")[0], "Failed")   # no exit code: replaced (restart)
            set_pod_phase(pods("scrape-done")[0], "Succeeded")   # rank 0 completed: job Succeeded
            wait_for(lambda: job_status("scrape-done").get("phase") == "Succeeded"
                     and job_status("scrape-invalid").get("phase") == "Failed"
                     and job_status("scrape-running").get("restarts", 0) >= 1,
                     30, "scrape-done Succeeded, scrape-invalid Failed, scrape-running restarted")
        except RuntimeError:
            print("jobs: %s" % {name: job_status(name).get("phase") for name in
                                ("scrape-running", "scrape-done", "scrape-invalid")})
            print(operator_log_tail())
            raise
        # What the operator counted for that: 2 jobs' children created, 1 succeeded, 1 failed,
        # 1 restart.
        expected = {"created": 2, "succeeded": 1, "failed": 1, "restarted": 1}

        def counters():
            text = http_get(operator_url + "/metrics")
            return {name: metric_values(text, "lockstep_operator_jobs_%s_total" % name).get("", 0)
                    for name in expected}
        try:
            wait_for(lambda: all(v >= expected[k] for k, v in counters().items()), 10,
                     "the operator's job counters")
        except RuntimeError:
            for name, value in counters().items():
                if value < expected[name]:
                    failures.append("lockstep_operator_jobs_%s_total is %g, expected >= %d (jobs: "
                                    "scrape-done Succeeded, scrape-invalid Failed, scrape-running "
                                    "restarted once)" % (name, value, expected[name]))
        operator_metrics = http_get(operator_url + "/metrics")
        print("operator: jobs by phase %s" % {
            k: v for k, v in metric_values(operator_metrics, "lockstep_operator_jobs").items() if v})

        # 5. The operator's exposition, with every family populated.
        promtool_check("operator :%d" % operator_metrics_port, operator_metrics)
        time.sleep(12)  # rate windows ($__rate_interval = 10s) need samples on both sides

        # 6. Every expression.
        job = query("lockstep_world_size")[0]["metric"]["job"]
        with open(os.path.join(options.source, "charts", "lockstep", "files", "dashboards", "lockstep.json")) as f:
            dashboard = json.load(f)
        with open(options.rules) as f:
            rules = yaml.safe_load(f)
        # As Grafana fills a regex variable in: metacharacters escaped, the backslash doubled for
        # the PromQL string.
        # Both jobs: the pipeline's (every training panel) and the parameter servers' (their row).
        job_regex = "|".join(re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\\\1", name)
                             for name in (job, "default/ctr-scrape"))
        substitutions = {"$namespace": "default", "$job": job_regex, "$__rate_interval": "10s"}
        evaluated, operator_evaluated = 0, 0
        for where, expr in dashboard_queries(dashboard) + rule_queries(rules):
            for variable, value in substitutions.items():
                expr = expr.replace(variable, value)
            if "$" in re.sub(r"\{\{.*?\}\}", "", expr):
                failures.append("%s: unsubstituted variable in %s" % (where, expr))
                continue
            try:
                result = query(expr)
            except Exception as e:
                failures.append("%s: %s fails: %s" % (where, expr, e))
                continue
            values = [float(s["value"][1]) for s in result]
            if not any(math.isfinite(v) for v in values):
                failures.append("%s: %s returns %s" % (where, expr, "no data" if not values else values))
                continue
            # The test made each of these counters move while Prometheus scraped.
            if re.search(r"increase\(lockstep_operator_jobs_\w+_total", expr) and not any(v > 0 for v in values):
                failures.append("%s: %s returns %s, expected > 0" % (where, expr, values))
                continue
            evaluated += 1
            if "lockstep_operator_" in expr:
                operator_evaluated += 1
        print("%d expressions of the dashboard and the rules return data (job %s), %d of them "
              "about lockstep-operator" % (evaluated, job, operator_evaluated))
        if operator_evaluated == 0:
            failures.append("no expression about lockstep-operator metrics was evaluated")
        completed = True
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the cleanup finish
        # Prometheus, then the operator, the workers, and last the API server the operator uses.
        for process in reversed(processes):
            stop_process(process, 40 if process.stdin else 20)
        if (failures or not completed) and os.environ.get("LOCKSTEP_KEEP_TEST_DIR") != "1":
            print("logs: set LOCKSTEP_KEEP_TEST_DIR=1 to keep %s" % work)
        if os.environ.get("LOCKSTEP_KEEP_TEST_DIR") != "1":
            shutil.rmtree(work, ignore_errors=True)
    for failure in failures:
        print("FAIL " + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
