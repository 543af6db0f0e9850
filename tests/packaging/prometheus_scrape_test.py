#!/usr/bin/env python3
"""A real Prometheus (Debian's) scrapes a running `lockstep run` on loopback, loads the chart's
alert rules, and every PromQL expression of the Grafana dashboard and of the rules returns data.

    prometheus_scrape_test.py --lockstep build/bin/lockstep --source REPO --rules DIR/rules/alerts.yaml

What it does:
  1. starts `lockstep run` on a manifest derived from examples/digits.yaml: 2 workers, enough
     steps to outlast the test, checkpoints every 2000 steps (about one a second), metrics on free ports;
  2. `promtool check metrics` on each worker's /metrics;
  3. starts Prometheus (1 s scrape and rule evaluation) with SCRAPE_TARGETS and the rules;
  4. evaluates through /api/v1/query every dashboard query (panels and template variables, with
     $namespace, $job and $__rate_interval filled in), every recording rule, and every alert's
     signal (its top-level comparison made `bool`, so the alert's series show whether it fires
     or not); each must return at least one finite sample.
Expressions about lockstep-operator metrics need an operator target: until one is in
SCRAPE_TARGETS they are listed as not evaluated (not failed). Adding the operator is one line in
scrape_targets() (a running operator's --metrics-port).
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import yaml

WORKERS = 2


def scrape_targets(worker_ports):
    """(scrape job name, targets, honor_labels, static labels). Workers keep their own `job`
    label (the TrainingJob, as the PodMonitor's honorLabels does) and get the `namespace` label
    the PodMonitor adds from the pod. The operator, once a test runs one, is one more entry:
        ("lockstep-operator", ["127.0.0.1:%d" % operator_metrics_port], False,
         {"namespace": "lockstep-system", "pod": "lockstep-operator-0"}),
    """
    return [
        ("lockstep-workers", ["127.0.0.1:%d" % p for p in worker_ports], True, {"namespace": "default"}),
    ]


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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lockstep", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--rules", required=True)
    parser.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus")
    parser.add_argument("--promtool", default=shutil.which("promtool") or "/usr/bin/promtool")
    options = parser.parse_args()
    for tool in (options.prometheus, options.promtool):
        if not os.path.exists(tool):
            print("FAIL %s not found: scripts/setup.sh installs Debian's prometheus package" % tool)
            return 1

    work = tempfile.mkdtemp(prefix="lockstep-prometheus-")
    processes = []
    failures = []
    try:
        worker_base = free_port_run(WORKERS)
        with open(os.path.join(options.source, "examples", "digits.yaml")) as f:
            manifest = yaml.safe_load(f)
        manifest["metadata"]["name"] = "digits-scrape"
        manifest["spec"]["trainer"]["steps"] = 1000000  # stopped by the test
        manifest["spec"]["trainer"]["logIntervalSteps"] = 10
        manifest["spec"]["checkpoint"] = {"uri": "file://" + os.path.join(work, "ckpt"),
                                          "intervalSteps": 2000, "keep": 2}
        manifest["spec"]["metrics"] = {"port": worker_base}
        manifest_path = os.path.join(work, "job.yaml")
        with open(manifest_path, "w") as f:
            yaml.safe_dump(manifest, f)
        run_log = open(os.path.join(work, "lockstep-run.log"), "w")
        lockstep = subprocess.Popen(
            [options.lockstep, "run", manifest_path, "--log-dir", os.path.join(work, "logs")],
            stdout=run_log, stderr=subprocess.STDOUT, cwd=options.source, start_new_session=True)
        processes.append(lockstep)
        worker_ports = [worker_base + i for i in range(WORKERS)]

        def training():
            if lockstep.poll() is not None:
                raise SystemExit("lockstep run exited early (%s); see %s" % (lockstep.returncode, run_log.name))
            for port in worker_ports:
                text = http_get("http://127.0.0.1:%d/metrics" % port)
                if not re.search(r"^lockstep_checkpoint_last_step\{[^}]*\} [1-9]", text, re.M) and port == worker_ports[0]:
                    return False
                if not re.search(r"^lockstep_train_steps_total\{[^}]*\} [1-9]", text, re.M):
                    return False
            return True
        try:
            wait_for(training, 120, "both workers training and a first checkpoint")
        except RuntimeError:
            with open(run_log.name) as f:
                print(f.read()[-3000:])
            raise

        for port in worker_ports:
            text = http_get("http://127.0.0.1:%d/metrics" % port)
            lint = subprocess.run([options.promtool, "check", "metrics"], input=text,
                                  capture_output=True, text=True)
            if lint.returncode != 0:
                failures.append("promtool check metrics on worker :%d: %s%s" % (port, lint.stdout, lint.stderr))
            else:
                print("promtool check metrics: worker :%d passes" % port)

        prometheus_port = free_port_run(1)
        targets = scrape_targets(worker_ports)
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
            stdout=prometheus_log, stderr=subprocess.STDOUT, start_new_session=True)
        processes.append(prometheus)
        api = "http://127.0.0.1:%d/api/v1/" % prometheus_port

        def query(expr):
            body = json.loads(http_get(api + "query?" + urllib.parse.urlencode({"query": expr}), timeout=10))
            if body.get("status") != "success":
                raise RuntimeError(body)
            return body["data"]["result"]

        def targets_up():
            if prometheus.poll() is not None:
                raise SystemExit("prometheus exited (%s); see %s" % (prometheus.returncode, prometheus_log.name))
            return len([s for s in query("up == 1")]) == sum(len(t[1]) for t in targets)
        wait_for(targets_up, 60, "Prometheus scraping every target")
        rules_loaded = json.loads(http_get(api + "rules"))["data"]["groups"]
        if not rules_loaded:
            failures.append("Prometheus loaded no rule group from %s" % options.rules)
        time.sleep(12)  # rate windows ($__rate_interval = 10s) need samples on both sides

        job = query("lockstep_world_size")[0]["metric"]["job"]
        with open(os.path.join(options.source, "charts", "lockstep", "files", "dashboards", "lockstep.json")) as f:
            dashboard = json.load(f)
        with open(options.rules) as f:
            rules = yaml.safe_load(f)
        # As Grafana fills a regex variable in: metacharacters escaped, the backslash doubled for
        # the PromQL string.
        job_regex = re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\\\1", job)
        substitutions = {"$namespace": "default", "$job": job_regex, "$__rate_interval": "10s"}
        operator_scraped = any(n == "lockstep-operator" for n, *_ in targets)
        evaluated, deferred = 0, []
        for where, expr in dashboard_queries(dashboard) + rule_queries(rules):
            for variable, value in substitutions.items():
                expr = expr.replace(variable, value)
            if "$" in re.sub(r"\{\{.*?\}\}", "", expr):
                failures.append("%s: unsubstituted variable in %s" % (where, expr))
                continue
            if "lockstep_operator_" in expr and not operator_scraped:
                deferred.append((where, expr))
                continue
            try:
                result = query(expr)
            except Exception as e:
                failures.append("%s: %s fails: %s" % (where, expr, e))
                continue
            values = [float(s["value"][1]) for s in result]
            if not any(math.isfinite(v) for v in values):
                failures.append("%s: %s returns %s" % (where, expr, "no data" if not values else values))
            else:
                evaluated += 1
        print("%d expressions of the dashboard and the rules return data (job %s)" % (evaluated, job))
        for where, expr in deferred:
            print("not evaluated (no lockstep-operator target yet): %s: %s" % (where, expr))
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        if failures and os.environ.get("LOCKSTEP_KEEP_TEST_DIR") != "1":
            print("logs: set LOCKSTEP_KEEP_TEST_DIR=1 to keep %s" % work)
        if os.environ.get("LOCKSTEP_KEEP_TEST_DIR") != "1":
            shutil.rmtree(work, ignore_errors=True)
    for failure in failures:
        print("FAIL " + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
