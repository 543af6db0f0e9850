"""A whole node lost (`cluster.sh kill-node`: its kubelet, containerd, kube-proxy and every
container on it SIGKILLed at once) under an elastic job with workers on both nodes: the survivors on
the other node go on training without waiting; the lost node's pods are evicted after the
operator's tolerationSeconds (30 s, not Kubernetes' 300) and, since no kubelet will ever confirm
their deletion, deleted with grace 0 by the operator; their replacements run on the surviving node
and the job ends Succeeded at exactly its steps, never stuck Restarting (Kubeflow
training-operator#2072). Prints the time from the loss to the survivors training again and to the
full world training again (docs/benchmarks.md). The node is started again at the end."""
import os
import subprocess
import time
import unittest

import cluster

LOST = "lockstep-node-2"


class NodeLost(unittest.TestCase):
    def tearDown(self):
        if not cluster.node_ready(LOST):
            subprocess.run([cluster.CLUSTER_SH, "start-node", LOST], check=True, timeout=120)
            cluster.wait_for(LOST + " Ready again", lambda: cluster.node_ready(LOST), timeout=120)

    def test_job_goes_on_and_gets_its_workers_back_on_the_other_node(self):
        job = cluster.spread_over_nodes(cluster.example("elastic.yaml"), hard=False)
        name = job["metadata"]["name"]
        job["spec"]["trainer"]["steps"] = 30000  # still training when the replacements join
        job["spec"]["trainer"]["allreduce"] = {"timeoutSeconds": 20}  # see test_worker_killed.py
        with cluster.Namespace("nodelost") as ns:
            cluster.shared_checkpoints(job, os.path.join(cluster.STATE, "shared", ns.name))
            ns.apply(job)
            ns.wait_job(name, "training at world 4", lambda j: cluster.step(j) > 0 and
                        j["status"].get("rendezvous", {}).get("worldSize") == 4, timeout=300)
            pods = ns.pods(name)
            lost = [p["metadata"]["name"] for p in pods if p["spec"]["nodeName"] == LOST]
            kept = [p["metadata"]["name"] for p in pods if p["spec"]["nodeName"] != LOST]
            self.assertTrue(lost and kept, "workers on both nodes: %s" %
                            [(p["metadata"]["name"], p["spec"]["nodeName"]) for p in pods])

            lost_at = time.time()
            subprocess.run([cluster.CLUSTER_SH, "kill-node", LOST], check=True, timeout=60)

            def survivors_training():
                found = cluster.first_training(ns.logs(kept[0]), after=lost_at)
                return found if found and found[2] == len(kept) else None
            back = cluster.wait_for("the survivors training without the lost node",
                                    survivors_training, timeout=120)

            def replaced():
                now = {p["metadata"]["name"]: p for p in ns.pods(name)}
                fresh = [now[n] for n in lost if n in now and
                         now[n]["metadata"]["uid"] not in {p["metadata"]["uid"] for p in pods}]
                return len(fresh) == len(lost) and all(
                    p["spec"].get("nodeName") and p["spec"]["nodeName"] != LOST and
                    p["status"].get("phase") == "Running" for p in fresh)
            cluster.wait_for("the lost node's workers replaced on the other node", replaced,
                             timeout=300)
            whole = ns.wait_job(name, "training at world 4 again", lambda j:
                                j["status"].get("rendezvous", {}).get("worldSize") == 4 and
                                cluster.phase(j) == "Running", timeout=120)
            whole_after = time.time() - lost_at
            self.assertNotEqual(cluster.phase(whole), "Restarting")

            done = ns.wait_job(name, "finished", lambda j: cluster.phase(j) in ("Succeeded", "Failed"),
                               timeout=900)
            self.assertEqual(cluster.phase(done), "Succeeded", ns.describe(name))
            self.assertEqual(cluster.step(done), job["spec"]["trainer"]["steps"])
            events = cluster.kubectl("get", "events", "-n", ns.name)
            self.assertIn("deleted with grace 0", events, "the operator freed the lost pods' names")
            print("e2e node lost: survivors (world %d) training again %.1f s after the loss; "
                  "the whole world again within %.1f s" % (back[2], back[0] - lost_at, whole_after))


if __name__ == "__main__":
    unittest.main()
