"""The worker pods are discovered through `kubernetes_sd_configs` against the real API server, with
the relabeling the chart's PodMonitor makes the Prometheus Operator generate (its selector, its
endpoint's keep on the metrics port names, honorLabels, the namespace and pod target labels), and
every worker expression of the Grafana dashboard, evaluated by Debian's Prometheus, returns data
from that discovery: the dashboard's queries hold against real pods, not only against static
targets (tests/packaging/prometheus_scrape_test.py). The job is a pipeline of 2 stages x 2
replicas, so that the pipeline row has data as well as the data-parallel ones (each stage's
replicas all-reduce their gradients): 4 pods on 2 nodes, activations between pods.

Debian builds Prometheus 2.42 without its Kubernetes discovery (the config field
kubernetes_sd_configs is unknown to /usr/bin/prometheus). So Debian's vmagent (VictoriaMetrics'
scraper, which reads the same scrape configuration and implements Kubernetes discovery itself)
discovers and scrapes the pods and remote-writes to Prometheus (--web.enable-remote-write-receiver),
which evaluates the queries: the agent-plus-Prometheus topology many clusters run."""
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

import yaml

import cluster

sys.path.insert(0, os.path.join(cluster.REPO, "tests", "packaging"))
import prometheus_scrape_test  # noqa: E402  (dashboard_queries: the dashboard's expressions)

BUILD = os.environ.get("LOCKSTEP_BUILD_DIR", os.path.join(cluster.REPO, "build"))


def pod_monitor():
    """The chart's PodMonitor, rendered by Helm with monitoring.podMonitor.enabled."""
    rendered = cluster.helm(
        "template", "lockstep", os.path.join(cluster.REPO, "charts", "lockstep"),
        "--namespace", "lockstep-system",
        "--values", os.path.join(cluster.REPO, "scripts", "cluster", "values.yaml"),
        "--set", "monitoring.podMonitor.enabled=true",
        "--show-only", "templates/podmonitor.yaml")
    return yaml.safe_load(rendered)


def sanitize(name):
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def scrape_config(monitor):
    """The scrape job the Prometheus Operator generates for a PodMonitor (its
    generatePodMonitorConfig: role pod, a keep per matchLabel, Failed/Succeeded pods dropped,
    namespace/pod/container target labels, then the endpoint's relabelings)."""
    spec = monitor["spec"]
    endpoint = spec["podMetricsEndpoints"][0]
    relabel = [{"source_labels": ["__meta_kubernetes_pod_label_" + sanitize(k)], "regex": v,
                "action": "keep"} for k, v in spec["selector"]["matchLabels"].items()]
    relabel.append({"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)",
                    "action": "drop"})
    for source, target in (("__meta_kubernetes_namespace", "namespace"),
                           ("__meta_kubernetes_pod_name", "pod"),
                           ("__meta_kubernetes_pod_container_name", "container")):
        relabel.append({"source_labels": [source], "target_label": target})
    for r in endpoint.get("relabelings", []):
        relabel.append({"source_labels": r["sourceLabels"], "regex": r["regex"],
                        "action": r["action"]})
    pki = os.path.join(cluster.STATE, "pki")
    return {
        "job_name": "podMonitor/%s/%s/0" % (monitor["metadata"]["namespace"],
                                            monitor["metadata"]["name"]),
        "honor_labels": endpoint.get("honorLabels", False),
        "metrics_path": endpoint.get("path", "/metrics"),
        "scrape_interval": "1s", "scrape_timeout": "1s",
        "kubernetes_sd_configs": [{
            "role": "pod", "api_server": "https://172.30.0.1:6443",
            "tls_config": {"ca_file": os.path.join(pki, "ca.crt"),
                           "cert_file": os.path.join(pki, "admin.crt"),
                           "key_file": os.path.join(pki, "admin.key")}}],
        "relabel_configs": relabel,
    }


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusDiscovery(unittest.TestCase):
    def test_dashboard_queries_return_data_from_discovered_worker_pods(self):
        work = tempfile.mkdtemp(prefix="lockstep-e2e-prometheus-")
        port, agent_port = free_port(), free_port()
        with open(os.path.join(work, "prometheus.yml"), "w") as f:
            yaml.safe_dump({"global": {"evaluation_interval": "1s"}}, f)
        with open(os.path.join(work, "scrape.yml"), "w") as f:
            yaml.safe_dump({"global": {"scrape_interval": "1s"},
                            "scrape_configs": [scrape_config(pod_monitor())]}, f)
        log = open(os.path.join(work, "processes.log"), "w")
        processes = [subprocess.Popen(
            ["prometheus", "--config.file", os.path.join(work, "prometheus.yml"),
             "--storage.tsdb.path", os.path.join(work, "data"),
             "--web.listen-address", "127.0.0.1:%d" % port, "--web.enable-remote-write-receiver"],
            stdout=log, stderr=subprocess.STDOUT)]
        processes.append(subprocess.Popen(
            ["vmagent", "-promscrape.config", os.path.join(work, "scrape.yml"),
             "-remoteWrite.url", "http://127.0.0.1:%d/api/v1/write" % port,
             "-remoteWrite.tmpDataPath", os.path.join(work, "vmagent"),
             "-httpListenAddr", "127.0.0.1:%d" % agent_port],
            stdout=log, stderr=subprocess.STDOUT))
        url = "http://127.0.0.1:%d" % port

        def query(expr):
            with urllib.request.urlopen(url + "/api/v1/query?" + urllib.parse.urlencode(
                    {"query": expr}), timeout=5) as response:
                return json.load(response)["data"]["result"]
        try:
            job = cluster.spread_over_nodes(cluster.example("fashion-mnist.yaml"))
            job["spec"]["trainer"]["steps"] = 40000  # outlasts the queries
            job["spec"]["trainer"]["pipeline"] = {"stages": 2, "microBatches": 2}
            job["spec"]["checkpoint"] = {"intervalSteps": 500, "keep": 2}
            with cluster.Namespace("prometheus") as ns:
                cluster.shared_checkpoints(job, os.path.join(cluster.STATE, "shared", ns.name))
                ns.apply(job)
                pods = ns.wait("fashion-mlp", "4 worker pods with addresses", lambda: (
                    lambda p: p if len(p) == 4 and all(x["status"].get("podIP") for x in p)
                    else None)(ns.pods("fashion-mlp")), timeout=180)

                def discovered():
                    up = {s["metric"].get("pod") for s in
                          query('up{namespace="%s"} == 1' % ns.name)}
                    return up if up == {p["metadata"]["name"] for p in pods} else None
                ns.wait("fashion-mlp", "Prometheus scraping the 4 discovered pods",
                        discovered, timeout=120)
                ns.wait_job("fashion-mlp", "a checkpoint committed",
                            lambda j: j.get("status", {}).get("lastCheckpoint"), timeout=120)
                # Rate windows ($__rate_interval = 10s) need samples on both sides; not a wait
                # for the system under test.
                time.sleep(12)

                with open(os.path.join(cluster.REPO, "charts", "lockstep", "files", "dashboards",
                                       "lockstep.json")) as f:
                    dashboard = json.load(f)
                series = query('lockstep_world_size{namespace="%s"}' % ns.name)
                self.assertEqual({s["metric"]["pod"] for s in series},
                                 {p["metadata"]["name"] for p in pods}, "a series per pod")
                job_label = series[0]["metric"]["job"]
                job_regex = re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\\\1", job_label)
                substitutions = {"$namespace": ns.name, "$job": job_regex,
                                 "$__rate_interval": "10s"}
                failures, evaluated = [], 0
                for where, expr in prometheus_scrape_test.dashboard_queries(dashboard):
                    if "lockstep_operator_" in expr:
                        continue  # the operator's own metrics: its ServiceMonitor, not pods
                    if "lockstep_ps_" in expr:
                        # The parameter servers' row: this cluster runs no DNS, which their
                        # workers need to find them (docs/parameter-servers.md), so no job here
                        # has servers; tests/packaging/prometheus_scrape_test.py evaluates these
                        # against running servers.
                        continue
                    for variable, value in substitutions.items():
                        expr = expr.replace(variable, value)
                    values = [float(s["value"][1]) for s in query(expr)]
                    if not any(math.isfinite(v) for v in values):
                        failures.append("%s: %s returns %s" % (where, expr, values or "no data"))
                    evaluated += 1
                self.assertEqual(failures, [])
                self.assertGreater(evaluated, 5)
                print("e2e prometheus: %d dashboard expressions return data from 4 pods "
                      "discovered through the API server" % evaluated)
        finally:
            for process in reversed(processes):
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            log.close()
            if os.environ.get("LOCKSTEP_KEEP_TEST_DIR") != "1":
                shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
