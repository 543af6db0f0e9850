"""`scripts/cluster.sh down`, run after the end-to-end tests whatever they did (the ctest fixture's
cleanup), leaves nothing behind: no process of the cluster (GlusterFS's included), no mount, no
network namespace or link, no cgroup, no iptables rule it added, no state directory."""
import os
import subprocess
import unittest

import cluster


def snapshot():
    """What the host shows of the cluster: processes, mounts, namespaces, links, rules, cgroups."""
    def run(*command):
        return subprocess.run(command, capture_output=True, text=True, check=False).stdout

    processes = [line for line in run("ps", "-eo", "pid=,args=").splitlines()
                 if cluster.STATE + "/" in line or "kubelet" in line or "kube-proxy" in line
                 or "containerd-shim" in line or "/pause" in line or "gluster" in line]
    mounts = [line for line in open("/proc/self/mounts", encoding="utf-8")
              if cluster.STATE in line or "lockstep-node" in line]
    netns = [n for n in run("ip", "netns", "list").split()
             if n.startswith(("lockstep-", "cni-"))]
    links = [line for line in run("ip", "-br", "link").splitlines()
             if line.startswith(("lockstep0", "lsv-"))]
    cgroups = [d for d in os.listdir("/sys/fs/cgroup/pids") if d.startswith("lockstep-node")]
    return {"processes": processes, "mounts": mounts, "network namespaces": netns,
            "links": links, "cgroups": cgroups, "iptables": run("iptables", "-S").splitlines(),
            "state directory": [cluster.STATE] if os.path.exists(cluster.STATE) else []}


class ClusterDown(unittest.TestCase):
    def test_down_leaves_no_process_mount_namespace_cgroup_or_rule(self):
        rules_before = os.environ.get("LOCKSTEP_E2E_IPTABLES_BEFORE")
        subprocess.run([cluster.CLUSTER_SH, "down"], check=True, timeout=180)
        left = snapshot()
        for what in ("processes", "mounts", "network namespaces", "links", "cgroups",
                     "state directory"):
            self.assertEqual(left[what], [], "left behind: " + what)
        if rules_before is not None and os.path.exists(rules_before):
            with open(rules_before, encoding="utf-8") as f:
                before = f.read().splitlines()
            after = left["iptables"]
            self.assertEqual(sorted(set(after) - set(before)), [], "iptables rules left behind")


if __name__ == "__main__":
    unittest.main()
