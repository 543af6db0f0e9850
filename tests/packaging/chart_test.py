#!/usr/bin/env python3
"""Renders charts/lockstep with Helm (`helm install --dry-run=client`, no cluster) and checks what a
user of the chart relies on.

    chart_test.py --source REPO --out DIR --helm PATH

Renders three value sets (the defaults; tests/packaging/values-monitoring.yaml, the defaults with
the Prometheus objects and the dashboard on; tests/packaging/values-all-options.yaml, every
option set) into DIR/<set>.json (read by validate_objects.mjs and chart_apply_test), writes the
alert rules as the PrometheusRule renders them with default thresholds to DIR/rules/alerts.yaml
(promtool and the scrape test use it), and checks:
  - the chart's CRD is a byte-for-byte copy of crds/trainingjob.yaml;
  - Chart.yaml's tested-kubernetes and tested-helm annotations name the versions the tests pin;
  - values.yaml, the chart README and values-all-options.yaml list the same options, and every
    .Values reference in the templates exists in values.yaml;
  - the Deployment (replicas, probes, securityContext, resources, flags and environment of the
    operator interface), the Services' selectors (the rendezvous Service follows the leader
    label), the RBAC rules (exactly the operator's needs), the monitors, the dashboard ConfigMap
    and the PrometheusRule;
  - the admission webhook (its configuration calls the webhook Service on the operator pods for
    creates, updates and scale of TrainingJobs, never their status; the operator's flags name the
    same Service and configuration, and its RBAC reaches only that configuration) and the
    ClusterRoles aggregated to the built-in edit/admin and view roles.
  - `helm lint --strict` passes for each value set;
  - values.schema.json types every value of values.yaml, and Helm refuses bad values (a string
    for a number, an unknown key, a value outside its enum or range) naming the value.
Exit 0 when every check holds; otherwise prints each failure and exits 1.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

import yaml

LEADER_LABEL = "lockstep.io/rendezvous-leader"

# (apiGroup, resource, verbs, resourceNames): the operator's interface, fixed by the lead.
EXPECTED_CLUSTER_RULES = {
    ("lockstep.io", "trainingjobs", ("delete", "get", "list", "patch", "update", "watch"), ()),
    ("lockstep.io", "trainingjobs/status", ("get", "patch", "update"), ()),
    ("", "pods", ("create", "delete", "get", "list", "patch", "watch"), ()),
    ("", "services", ("create", "delete", "get", "list", "watch"), ()),
    ("", "nodes", ("get", "list"), ()),
    ("", "secrets", ("create",), ()),
    ("", "events", ("create", "patch"), ()),
    ("scheduling.volcano.sh", "podgroups", ("create", "delete", "get", "list", "watch"), ()),
    ("scheduling.x-k8s.io", "podgroups", ("create", "delete", "get", "list", "watch"), ()),
}


def expected_role_rules(lease_name):
    return {
        ("", "secrets", ("get", "update"), ("lockstep-operator",)),
        ("", "secrets", ("create",), ()),
        ("coordination.k8s.io", "leases", ("get", "update"), (lease_name,)),
        ("coordination.k8s.io", "leases", ("create",), ()),
    }


def normalize_rules(rules):
    out = set()
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                out.add((group, resource, tuple(sorted(rule["verbs"])),
                         tuple(sorted(rule.get("resourceNames", [])))))
    return out


def leaves(tree, prefix=""):
    """Dotted paths of the leaves of a values tree (a non-empty map is not a leaf; lists and
    empty maps are)."""
    if isinstance(tree, dict) and tree:
        for key, value in tree.items():
            yield from leaves(value, prefix + "." + key if prefix else key)
    else:
        yield prefix


def documented_options(readme_text):
    """Value paths in the README's table rows: | `path` | ..."""
    return set(re.findall(r"^\|\s*`([A-Za-z0-9_.]+)`\s*\|", readme_text, re.M))


def deep_merge(base, override):
    """Values files over values.yaml, as Helm merges them: maps key by key, anything else
    replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def helm_env():
    """Helm's environment with no cluster (KUBECONFIG empty): the client-only dry runs and lint
    never reach one."""
    env = dict(os.environ)
    env["KUBECONFIG"] = os.devnull
    return env


def render_chart(helm, chart, value_files, release, namespace, extra=()):
    """Returns (objects, notes): what `helm install --dry-run=client` would install, as
    [{"source": "templates/FILE", "object": {...}}, ...] in Helm's install order, and the rendered
    NOTES.txt; raises RenderError with Helm's message."""
    command = [helm, "install", release, chart, "--namespace", namespace, "--dry-run=client",
               "--output", "json"]
    for path in value_files:
        command += ["--values", path]
    command += list(extra)
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=60, check=False, env=helm_env())
    if result.returncode != 0:
        raise RenderError(result.stderr.strip() or "exit status %d" % result.returncode)
    release_json = json.loads(result.stdout)
    objects = []
    for document in release_json["manifest"].split("\n---\n"):
        source = re.search(r"^# Source: [^/]+/(\S+)$", document, re.M)
        body = yaml.safe_load(document)
        if body:
            objects.append({"source": source.group(1) if source else "", "object": body})
    # Hooks (the `helm test` pod) are kept apart from the manifest; "templates/tests/FILE".
    for hook in release_json.get("hooks") or []:
        body = yaml.safe_load(hook["manifest"])
        if body:
            objects.append({"source": hook["path"].split("/", 1)[-1], "object": body})
    return objects, release_json["info"].get("notes", "")


def lint_chart(helm, chart, value_files):
    """`helm lint --strict`'s complaint, or None when it passes."""
    command = [helm, "lint", "--strict", chart]
    for path in value_files:
        command += ["--values", path]
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=60, check=False, env=helm_env())
    return None if result.returncode == 0 else result.stdout.strip()


def schema_paths(schema, definitions, prefix=""):
    """Dotted paths of values.schema.json's leaves, following $ref into its definitions."""
    if "$ref" in schema:
        schema = definitions[schema["$ref"].rsplit("/", 1)[1]]
    properties = schema.get("properties")
    if not properties:
        yield prefix
        return
    for key, sub in properties.items():
        yield from schema_paths(sub, definitions, prefix + "." + key if prefix else key)


# (--set arguments, what Helm's refusal must name): values a user gets wrong, refused by
# values.schema.json before anything renders.
BAD_VALUES = [
    (["operator.replicas=two"], "/operator/replicas"),
    (["operator.replicaz=2"], "replicaz"),
    (["image.pullPolicy=Sometimes"], "/image/pullPolicy"),
    (["operator.topologyKeys=topology.kubernetes.io/zone"], "/operator/topologyKeys"),
    (["webhook.timeoutSeconds=60"], "/webhook/timeoutSeconds"),
    (["operator.spreadReplicas=sometimes"], "/operator/spreadReplicas"),
    (["monitoring.serviceMonitor.interval=30 seconds"], "/monitoring/serviceMonitor/interval"),
]


class RenderError(Exception):
    pass


class Checker:
    def __init__(self):
        self.failures = []

    def expect(self, condition, message):
        if not condition:
            self.failures.append(message)
        return condition


def find(objects, kind, name_suffix=""):
    found = [o["object"] for o in objects
             if o["object"]["kind"] == kind and o["object"]["metadata"]["name"].endswith(name_suffix)]
    return found


def check_render(check, objects, values, label, release_namespace):
    ctx = "[%s] " % label
    deployment = find(objects, "Deployment")
    if not check.expect(len(deployment) == 1, ctx + "one Deployment"):
        return
    deployment = deployment[0]
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    op = values["operator"]
    check.expect(spec["replicas"] == op["replicas"], ctx + "replicas follow operator.replicas")
    pod_labels = spec["template"]["metadata"]["labels"]
    selector = spec["selector"]["matchLabels"]
    check.expect(all(pod_labels.get(k) == v for k, v in selector.items()),
                 ctx + "Deployment selector matches its pod labels")
    check.expect(LEADER_LABEL not in selector, ctx + "Deployment selector must not use the leader label")
    check.expect(pod["securityContext"].get("runAsNonRoot") is True, ctx + "pod runAsNonRoot")
    (container,) = pod["containers"]
    security = container["securityContext"]
    check.expect(security.get("readOnlyRootFilesystem") is True, ctx + "readOnlyRootFilesystem")
    check.expect(security.get("allowPrivilegeEscalation") is False, ctx + "no privilege escalation")
    check.expect(security.get("capabilities", {}).get("drop") == ["ALL"], ctx + "capabilities dropped")
    check.expect(container["command"] == ["/usr/bin/lockstep-operator"], ctx + "runs the operator binary")
    check.expect(container["resources"] == op["resources"], ctx + "resources from values")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    check.expect(ports.get("metrics") == op["metricsPort"], ctx + "metrics port")
    check.expect(ports.get("rendezvous") == op["rendezvousPort"], ctx + "rendezvous port")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container.get(probe, {}).get("httpGet", {})
        check.expect(get.get("path") == path and get.get("port") == "metrics",
                     ctx + "%s GET %s on the metrics port" % (probe, path))
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    check.expect(env.get("POD_NAME") == "metadata.name" and env.get("POD_NAMESPACE") == "metadata.namespace",
                 ctx + "POD_NAME and POD_NAMESPACE from the downward API")
    flags = dict(a[2:].split("=", 1) for a in container["args"] if a.startswith("--") and "=" in a)
    want = {
        "leader-elect": "true" if op["leaderElection"]["enabled"] else "false",
        "leader-election-namespace": release_namespace,
        "leader-election-id": op["leaderElection"]["leaseName"],
        "metrics-port": str(op["metricsPort"]),
        "rendezvous-port": str(op["rendezvousPort"]),
        "workers": str(op["workers"]), "qps": str(op["qps"]), "burst": str(op["burst"]),
        "node-loss-toleration-seconds": str(op["nodeLossTolerationSeconds"]),
        "gang-scheduler-name-volcano": values["gangScheduler"]["volcanoSchedulerName"],
        "gang-scheduler-name-scheduler-plugins": values["gangScheduler"]["schedulerPluginsSchedulerName"],
    }
    for flag, value in want.items():
        check.expect(flags.get(flag) == value, ctx + "--%s=%s (got %r)" % (flag, value, flags.get(flag)))
    if op["topologyKeys"] is None:
        check.expect("topology-keys" not in flags, ctx + "no --topology-keys: the operator's defaults")
    else:
        check.expect(flags.get("topology-keys") == ",".join(op["topologyKeys"]),
                     ctx + "--topology-keys from operator.topologyKeys (got %r)" % flags.get("topology-keys"))
    node_loss = {t["key"]: t.get("tolerationSeconds") for t in pod.get("tolerations", [])
                 if t.get("key", "").startswith("node.kubernetes.io/")}
    check.expect(node_loss == {"node.kubernetes.io/not-ready": op["nodeLossTolerationSeconds"],
                               "node.kubernetes.io/unreachable": op["nodeLossTolerationSeconds"]},
                 ctx + "the operator's replicas leave a lost node after nodeLossTolerationSeconds "
                 "(got %s)" % node_loss)
    for toleration in op["tolerations"]:
        check.expect(toleration in pod.get("tolerations", []), ctx + "operator.tolerations kept")
    if op["watchNamespace"]:
        check.expect(flags.get("watch-namespace") == op["watchNamespace"], ctx + "--watch-namespace")
    else:
        check.expect("watch-namespace" not in flags, ctx + "no --watch-namespace: all namespaces")
    check.expect(flags.get("worker-image", "").endswith("/" + values["worker"]["repository"] + ":" +
                                                        (values["image"]["tag"] or "0.1.0")),
                 ctx + "--worker-image from image.registry, worker.repository and the tag")
    check.expect(flags.get("agent-image", "").endswith("/" + values["agent"]["repository"] + ":" +
                                                       (values["image"]["tag"] or "0.1.0")),
                 ctx + "--agent-image from image.registry, agent.repository and the tag")
    allowed_flags = set(want) | {"watch-namespace", "rendezvous-address", "rendezvous-service", "worker-image",
                                 "agent-image", "kubeconfig",
                                 "webhook-port", "webhook-service", "webhook-configuration", "topology-keys"}
    extra_args = set(a for a in op["extraArgs"])
    for arg in container["args"]:
        check.expect(arg in extra_args or arg[2:].split("=")[0] in allowed_flags,
                     ctx + "flag %s is not in the operator's interface" % arg)

    services = {s["metadata"]["name"]: s for s in find(objects, "Service")}
    rendezvous = [s for n, s in services.items() if n.endswith("-rendezvous")]
    metrics = [s for n, s in services.items() if n.endswith("-metrics")]
    if check.expect(len(rendezvous) == 1 and len(metrics) == 1, ctx + "rendezvous and metrics Services"):
        rdv_selector = rendezvous[0]["spec"]["selector"]
        check.expect(rdv_selector.get(LEADER_LABEL) == "true", ctx + "rendezvous Service selects the leader label")
        check.expect({k: v for k, v in rdv_selector.items() if k != LEADER_LABEL} == selector,
                     ctx + "rendezvous Service selects the operator pods")
        check.expect(rendezvous[0]["spec"]["ports"][0]["targetPort"] == "rendezvous", ctx + "rendezvous targetPort")
        if op["rendezvousAddress"]:
            check.expect(flags.get("rendezvous-address") == op["rendezvousAddress"] and
                         "rendezvous-service" not in flags,
                         ctx + "--rendezvous-address is operator.rendezvousAddress, alone")
        else:
            check.expect(flags.get("rendezvous-service") == rendezvous[0]["metadata"]["name"] and
                         "rendezvous-address" not in flags,
                         ctx + "--rendezvous-service names the rendezvous Service (workers dial its "
                         "cluster IP; got %s)" % flags.get("rendezvous-service"))
        check.expect(metrics[0]["spec"]["selector"] == selector, ctx + "metrics Service selects the operator pods")
        check.expect(metrics[0]["spec"]["ports"][0]["targetPort"] == "metrics", ctx + "metrics targetPort")

    webhook = check_webhook(check, objects, values, ctx, flags, ports, selector, release_namespace)

    account = pod["serviceAccountName"]
    if values["rbac"]["create"]:
        (cluster_role,) = find(objects, "ClusterRole", "-operator")
        (role,) = find(objects, "Role")
        got = normalize_rules(cluster_role["rules"])
        want_cluster = set(EXPECTED_CLUSTER_RULES)
        if webhook:
            want_cluster.add(("admissionregistration.k8s.io", "validatingwebhookconfigurations",
                              ("get", "update"), (webhook["metadata"]["name"],)))
        check.expect(got == want_cluster,
                     ctx + "ClusterRole rules: extra %s, missing %s" %
                     (sorted(got - want_cluster), sorted(want_cluster - got)))
        want_role = expected_role_rules(op["leaderElection"]["leaseName"])
        got_role = normalize_rules(role["rules"])
        check.expect(got_role == want_role, ctx + "Role rules: extra %s, missing %s" %
                     (sorted(got_role - want_role), sorted(want_role - got_role)))
        check.expect(role["metadata"]["namespace"] == release_namespace, ctx + "Role in the release namespace")
        for binding in find(objects, "ClusterRoleBinding") + find(objects, "RoleBinding"):
            subject = binding["subjects"][0]
            check.expect(subject == {"kind": "ServiceAccount", "name": account, "namespace": release_namespace},
                         ctx + "%s binds the operator's ServiceAccount" % binding["kind"])
    check_user_roles(check, objects, values, ctx)
    check_helm_test(check, objects, values, ctx, release_namespace)
    if values["serviceAccount"]["create"]:
        check.expect([a["metadata"]["name"] for a in find(objects, "ServiceAccount")] == [account],
                     ctx + "the ServiceAccount the pods use is created")

    monitoring = values["monitoring"]
    service_monitors = find(objects, "ServiceMonitor")
    check.expect(len(service_monitors) == (1 if monitoring["serviceMonitor"]["enabled"] else 0),
                 ctx + "ServiceMonitor iff monitoring.serviceMonitor.enabled")
    for monitor in service_monitors:
        wanted = monitor["spec"]["selector"]["matchLabels"]
        check.expect(metrics and all(metrics[0]["metadata"]["labels"].get(k) == v for k, v in wanted.items()),
                     ctx + "ServiceMonitor selects the metrics Service")
        check.expect(monitor["spec"]["endpoints"][0]["port"] == "metrics", ctx + "ServiceMonitor port name")
    pod_monitors = find(objects, "PodMonitor")
    check.expect(len(pod_monitors) == (1 if monitoring["podMonitor"]["enabled"] else 0),
                 ctx + "PodMonitor iff monitoring.podMonitor.enabled")
    for monitor in pod_monitors:
        check.expect(monitor["spec"]["selector"]["matchLabels"] ==
                     {"app.kubernetes.io/managed-by": "lockstep-operator"}, ctx + "PodMonitor selects worker pods")
        endpoint = monitor["spec"]["podMetricsEndpoints"][0]
        check.expect(endpoint.get("honorLabels") is True, ctx + "PodMonitor keeps the workers' job label")
        # One target per rank: every port the operator names metrics or metrics-<r>, no other.
        keep = [r for r in endpoint.get("relabelings", []) if r.get("action") == "keep"]
        check.expect("port" not in endpoint and len(keep) == 1 and
                     keep[0]["sourceLabels"] == ["__meta_kubernetes_pod_container_port_name"],
                     ctx + "PodMonitor keeps targets by container port name")
        if keep:
            pattern = re.compile(keep[0]["regex"])
            check.expect(all(pattern.fullmatch(p) for p in ("metrics", "metrics-1", "metrics-255")) and
                         not any(pattern.fullmatch(p) for p in ("rendezvous", "metrics-", "xmetrics")),
                         ctx + "PodMonitor scrapes every rank's metrics port and no other")
        check.expect(monitor["spec"]["namespaceSelector"] == {"any": True}, ctx + "PodMonitor in every namespace")
    rules = find(objects, "PrometheusRule")
    check.expect(len(rules) == (1 if monitoring["prometheusRule"]["enabled"] else 0),
                 ctx + "PrometheusRule iff monitoring.prometheusRule.enabled")
    dashboards = find(objects, "ConfigMap", "-dashboard")
    check.expect(len(dashboards) == (1 if values["dashboard"]["enabled"] else 0),
                 ctx + "dashboard ConfigMap iff dashboard.enabled")
    for config_map in dashboards:
        check.expect(config_map["metadata"]["labels"].get(values["dashboard"]["label"]) ==
                     str(values["dashboard"]["labelValue"]), ctx + "dashboard ConfigMap carries the sidecar label")
        try:
            json.loads(config_map["data"]["lockstep.json"])
        except (KeyError, ValueError) as e:
            check.expect(False, ctx + "dashboard ConfigMap holds the dashboard JSON: %s" % e)
    nads = find(objects, "NetworkAttachmentDefinition")
    check.expect(len(nads) == (1 if values["rdma"]["networkAttachmentDefinition"]["create"] else 0),
                 ctx + "NetworkAttachmentDefinition iff rdma.networkAttachmentDefinition.create")
    for nad in nads:
        config = json.loads(nad["spec"]["config"])
        check.expect(config["master"] == values["rdma"]["networkAttachmentDefinition"]["masterInterface"],
                     ctx + "NetworkAttachmentDefinition config is JSON with the master interface")


def check_webhook(check, objects, values, ctx, flags, ports, selector, release_namespace):
    """The webhook's objects and the operator's flags agree; returns the configuration or None."""
    settings = values["webhook"]
    configurations = find(objects, "ValidatingWebhookConfiguration")
    services = find(objects, "Service", "-webhook")
    if not settings["enabled"]:
        check.expect(not configurations and not services and "webhook-port" not in flags and
                     "webhook" not in ports, ctx + "no webhook objects, port or flags when disabled")
        return None
    if not check.expect(len(configurations) == 1 and len(services) == 1,
                        ctx + "one ValidatingWebhookConfiguration and one webhook Service"):
        return None
    configuration, service = configurations[0], services[0]
    check.expect(ports.get("webhook") == settings["port"] and
                 flags.get("webhook-port") == str(settings["port"]), ctx + "webhook port and flag")
    check.expect(flags.get("webhook-service") == service["metadata"]["name"],
                 ctx + "--webhook-service names the webhook Service (the certificate's names)")
    check.expect(flags.get("webhook-configuration") == configuration["metadata"]["name"],
                 ctx + "--webhook-configuration names the configuration whose caBundle it keeps")
    check.expect(service["spec"]["selector"] == selector and
                 service["spec"]["ports"][0]["targetPort"] == "webhook" and
                 service["spec"]["ports"][0]["port"] == 443,
                 ctx + "webhook Service: 443 to every operator pod's webhook port")
    (hook,) = configuration["webhooks"]
    called = hook["clientConfig"].get("service", {})
    check.expect(called == {"name": service["metadata"]["name"], "namespace": release_namespace,
                            "path": "/validate-trainingjob", "port": 443},
                 ctx + "the webhook calls the webhook Service at /validate-trainingjob (got %s)" % called)
    check.expect("caBundle" not in hook["clientConfig"], ctx + "no caBundle rendered: the operator writes it")
    (rule,) = hook["rules"]
    check.expect(rule["apiGroups"] == ["lockstep.io"] and sorted(rule["operations"]) == ["CREATE", "UPDATE"] and
                 sorted(rule["resources"]) == ["trainingjobs", "trainingjobs/scale"],
                 ctx + "creates, updates and scale of TrainingJobs go through the webhook, status never")
    check.expect(hook["failurePolicy"] == settings["failurePolicy"] and
                 hook["timeoutSeconds"] == settings["timeoutSeconds"] and hook["sideEffects"] == "None",
                 ctx + "failurePolicy, timeoutSeconds from values; no side effects (dry runs work)")
    return configuration


def check_helm_test(check, objects, values, ctx, release_namespace):
    """`helm test`'s pod checks the installation through the Services this release made, with
    only the CA of the operator's Secret, and is gone once it passed."""
    pods = [o["object"] for o in objects if o["source"] == "templates/tests/check.yaml"]
    if not check.expect(len(pods) == 1, ctx + "one `helm test` pod"):
        return
    pod = pods[0]
    annotations = pod["metadata"].get("annotations", {})
    check.expect(annotations.get("helm.sh/hook") == "test", ctx + "the check pod is a test hook")
    check.expect("hook-succeeded" in annotations.get("helm.sh/hook-delete-policy", ""),
                 ctx + "a passed check pod is deleted (nothing outlives an uninstall)")
    container = pod["spec"]["containers"][0]
    check.expect(container["command"] == ["/usr/bin/lockstep-operator", "check"],
                 ctx + "the check pod runs `lockstep-operator check`")
    args = dict(a[2:].split("=", 1) for a in container["args"])
    service = {s["metadata"]["name"].rsplit("-", 1)[-1]: s["metadata"]["name"]
               for s in find(objects, "Service")}
    op = values["operator"]

    def link(part):
        """What Kubernetes expands to the Service's cluster IP and port in a pod's arguments."""
        variable = service.get(part, "?").upper().replace("-", "_")
        return "$(%s_SERVICE_HOST):$(%s_SERVICE_PORT)" % (variable, variable)
    check.expect(pod["spec"].get("enableServiceLinks") is True,
                 ctx + "the check pod gets the Services' variables")
    # What the workers dial: operator.rendezvousAddress when set (the certificate names it).
    check.expect(args.get("rendezvous-address") == (op["rendezvousAddress"] or link("rendezvous")),
                 ctx + "the check dials what the workers dial: %s" % args.get("rendezvous-address"))
    check.expect(pod["spec"].get("nodeSelector", {}) == (op["nodeSelector"] or {}) and
                 pod["spec"].get("tolerations", []) == (op["tolerations"] or []),
                 ctx + "the check pod runs where the operator may")
    check.expect(args.get("metrics-url") == "http://%s/metrics" % link("metrics"),
                 ctx + "the check reads the metrics Service: %s" % args.get("metrics-url"))
    if values["webhook"]["enabled"]:
        check.expect(args.get("webhook-url") == "https://%s/validate-trainingjob" % link("webhook"),
                     ctx + "the check calls the webhook Service: %s" % args.get("webhook-url"))
        check.expect(args.get("webhook-server-name") == "%s.%s.svc" % (
            service.get("webhook"), release_namespace),
            ctx + "the webhook's certificate is checked for the name the API server uses: %s" %
            args.get("webhook-server-name"))
    else:
        check.expect("webhook-url" not in args, ctx + "no webhook check without the webhook")
    secrets = [v["secret"] for v in pod["spec"].get("volumes", []) if "secret" in v]
    check.expect(secrets == [{"secretName": "lockstep-operator",
                              "items": [{"key": "ca.crt", "path": "ca.crt"}]}],
                 ctx + "the check pod mounts only ca.crt of the operator's Secret: %s" % secrets)


def check_user_roles(check, objects, values, ctx):
    """ClusterRoles aggregated to edit/admin and view, exactly when asked for."""
    edit = find(objects, "ClusterRole", "-edit")
    view = find(objects, "ClusterRole", "-view")
    if not values["rbac"]["aggregateToDefaultRoles"]:
        check.expect(not edit and not view, ctx + "no aggregated roles when disabled")
        return
    if not check.expect(len(edit) == 1 and len(view) == 1, ctx + "edit and view ClusterRoles"):
        return
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    edit_labels, view_labels = edit[0]["metadata"]["labels"], view[0]["metadata"]["labels"]
    check.expect(edit_labels.get(aggregate + "edit") == "true" and edit_labels.get(aggregate + "admin") == "true"
                 and aggregate + "view" not in edit_labels, ctx + "the edit role aggregates to edit and admin")
    check.expect(view_labels.get(aggregate + "view") == "true" and
                 not any(k.startswith(aggregate) and k != aggregate + "view" for k in view_labels),
                 ctx + "the view role aggregates to view only")
    check.expect(normalize_rules(edit[0]["rules"]) == {
        ("lockstep.io", "trainingjobs",
         ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"), ()),
        ("lockstep.io", "trainingjobs/scale", ("get", "patch", "update"), ()),
        ("lockstep.io", "trainingjobs/status", ("get",), ())}, ctx + "edit role rules")
    read = ("get", "list", "watch")
    check.expect(normalize_rules(view[0]["rules"]) == {
        ("lockstep.io", r, read, ()) for r in ("trainingjobs", "trainingjobs/status", "trainingjobs/scale")},
        ctx + "view role rules: read only")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--helm", required=True, help="Helm v4 (scripts/helm-tools.sh)")
    options = parser.parse_args()
    helm = shutil.which(options.helm)
    if not helm:
        print("FAIL %s is missing: scripts/setup.sh installs Helm (scripts/helm-tools.sh)" % options.helm)
        return 1
    chart = os.path.join(options.source, "charts", "lockstep")
    here = os.path.dirname(os.path.abspath(__file__))
    check = Checker()
    os.makedirs(options.out, exist_ok=True)

    with open(os.path.join(options.source, "crds", "trainingjob.yaml"), "rb") as a, \
            open(os.path.join(chart, "crds", "trainingjob.yaml"), "rb") as b:
        check.expect(a.read() == b.read(),
                     "charts/lockstep/crds/trainingjob.yaml differs from crds/trainingjob.yaml: "
                     "cp crds/trainingjob.yaml charts/lockstep/crds/")

    # The versions Chart.yaml says it was tested with are the ones the tests pin.
    with open(os.path.join(chart, "Chart.yaml")) as f:
        annotations = yaml.safe_load(f).get("annotations") or {}
    pinned = {}
    with open(os.path.join(options.source, "scripts", "kubernetes.sh")) as f:
        pinned["lockstep.io/tested-kubernetes"] = re.search(r"^readonly version=(\S+)", f.read(),
                                                            re.M).group(1)
    with open(os.path.join(options.source, "scripts", "helm-tools.sh")) as f:
        pinned["lockstep.io/tested-helm"] = re.search(r"^readonly version=\S+ +# helm v(\S+),",
                                                      f.read(), re.M).group(1)
    for key, version in pinned.items():
        check.expect(annotations.get(key) == version,
                     "Chart.yaml annotation %s is %r; the tests run %s" %
                     (key, annotations.get(key), version))

    with open(os.path.join(chart, "crds", "trainingjob.yaml")) as f:
        crd = yaml.safe_load(f)
    with open(os.path.join(options.out, "crds.json"), "w") as f:
        json.dump({"objects": [{"source": "crds/trainingjob.yaml", "object": crd}]}, f, indent=1)
    test_crds = []
    for name in sorted(os.listdir(os.path.join(here, "data"))):
        with open(os.path.join(here, "data", name)) as f:
            test_crds.append({"source": "tests/packaging/data/" + name, "object": yaml.safe_load(f)})
    with open(os.path.join(options.out, "test-crds.json"), "w") as f:
        json.dump({"objects": test_crds}, f, indent=1)
    with open(os.path.join(chart, "values.yaml")) as f:
        defaults = yaml.safe_load(f)
    with open(os.path.join(here, "values-all-options.yaml")) as f:
        all_options = yaml.safe_load(f)
    with open(os.path.join(chart, "README.md")) as f:
        documented = documented_options(f.read())
    value_paths = set(leaves(defaults))
    check.expect(value_paths == documented, "chart README lists options %s that values.yaml lacks, "
                 "and lacks %s" % (sorted(documented - value_paths), sorted(value_paths - documented)))
    # An option whose default is an empty map or list (annotations, affinity) is set by any
    # path below it.
    all_paths = set(leaves(all_options))

    def covers(option, path):
        return path == option or path.startswith(option + ".")
    unset = sorted(v for v in value_paths if not any(covers(v, a) for a in all_paths))
    unknown = sorted(a for a in all_paths if not any(covers(v, a) for v in value_paths))
    check.expect(not unset, "values-all-options.yaml does not set %s" % unset)
    check.expect(not unknown, "values-all-options.yaml sets unknown options %s" % unknown)
    referenced = set()
    for root, _, files in os.walk(chart):
        for name in files:
            if name.endswith((".yaml", ".tpl", ".txt")):
                with open(os.path.join(root, name)) as f:
                    referenced |= {r.rstrip(".") for r in
                                   re.findall(r"\.Values\.([A-Za-z0-9_.]+)", f.read())}
    known_prefixes = {p for path in value_paths for p in
                      [".".join(path.split(".")[:i]) for i in range(1, len(path.split(".")) + 1)]}
    check.expect(referenced <= known_prefixes, "templates reference values missing from values.yaml: %s" %
                 sorted(referenced - known_prefixes))

    sets = {
        "defaults": ([], "lockstep", "lockstep-system", defaults),
        "monitoring": ([os.path.join(here, "values-monitoring.yaml")], "lockstep-mon", "lockstep-monitoring", None),
        "all-options": ([os.path.join(here, "values-all-options.yaml")], "lockstep-all", "ml-platform", None),
    }
    for label, (files, release, namespace, values) in sets.items():
        if values is None:
            values = defaults
            for path in files:
                with open(path) as f:
                    values = deep_merge(values, yaml.safe_load(f))
        try:
            objects, notes = render_chart(helm, chart, files, release, namespace)
        except RenderError as e:
            check.expect(False, "[%s] render: %s" % (label, e))
            continue
        complaint = lint_chart(helm, chart, files)
        check.expect(complaint is None, "[%s] helm lint --strict: %s" % (label, complaint))
        with open(os.path.join(options.out, label + ".json"), "w") as f:
            json.dump({"release": release, "namespace": namespace, "objects": objects}, f, indent=1)
        check.expect("docs/operations.md" in notes and "kubectl" in notes, "[%s] NOTES.txt tells the next step" % label)
        check_render(check, objects, values, label, namespace)
        if label == "monitoring":
            (rule,) = find(objects, "PrometheusRule")
            rules_dir = os.path.join(options.out, "rules")
            os.makedirs(rules_dir, exist_ok=True)
            with open(os.path.join(rules_dir, "alerts.yaml"), "w") as f:
                yaml.safe_dump(rule["spec"], f, sort_keys=False, width=1 << 20)
            shutil.copy(os.path.join(here, "alerts_test.yaml"), rules_dir)
            (config_map,) = find(objects, "ConfigMap", "-dashboard")
            with open(os.path.join(chart, "files", "dashboards", "lockstep.json")) as f:
                check.expect(json.loads(config_map["data"]["lockstep.json"]) == json.load(f),
                             "the dashboard ConfigMap carries files/dashboards/lockstep.json unchanged")

    with open(os.path.join(chart, "values.schema.json")) as f:
        schema = json.load(f)
    typed = set(schema_paths(schema, schema.get("definitions", {}))) - {"global"}
    untyped = sorted(v for v in value_paths if not any(covers(t, v) for t in typed))
    extra = sorted(t for t in typed if not any(covers(t, v) for v in value_paths))
    check.expect(not untyped and not extra, "values.schema.json types %s that values.yaml lacks, "
                 "and lacks %s" % (extra, untyped))
    for arguments, named in BAD_VALUES:
        extra = [a for argument in arguments for a in ("--set", argument)]
        try:
            render_chart(helm, chart, [], "lockstep", "lockstep-system", extra)
            check.expect(False, "helm install --set %s is not refused" % " ".join(arguments))
        except RenderError as e:
            check.expect("schema" in str(e) and named in str(e),
                         "helm install --set %s is refused naming %s (got: %s)" %
                         (" ".join(arguments), named, e))

    for failure in check.failures:
        print("FAIL " + failure)
    if check.failures:
        return 1
    print("chart: %d value sets rendered into %s; every check holds" % (len(sets), options.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
