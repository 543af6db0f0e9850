"""A whole node lost (`cluster.sh kill-node`: its kubelet, containerd, kube-proxy and every
container on it SIGKILLed at once) under an elastic job with two workers on each node (its
minReplicas on either): the survivors on the other node go on training without waiting; the lost
node's pods are evicted after the operator's tolerationSeconds (30 s, not Kubernetes' 300) and,
since no kubelet will ever confirm their deletion, deleted with grace 0 by the operator; their
replacements run on the surviving node and the whole world trains again, never stuck Restarting
(Kubeflow training-operator#2072). The job is sized to outlast that on any machine (a million
steps) and is deleted once its full world has trained on. Prints the time from the loss to the
survivors training again and to the full world training again (docs/benchmarks.md). The node is
started again at the end.

The node lost holds the operator's standby replica, never its leader (the chart puts one replica
on each node): the workers' loss is what this test measures, and losing a standby costs the jobs
nothing. Its replacement stays Pending while the node is down (no two replicas share a node) and
runs there once the node is back. A change of leader during the test fails it, saying so."""
import os
import subprocess
import time
import unittest

import cluster

# A lost node is labelled with this so that the job's spread leaves it out (cluster.py).
LOST = "lockstep.io/e2e-node-lost"


def operators_spread_and_ready():
    """Waits for the operator's replicas to be ready, one per node (the chart's required
    anti-affinity): after the lost node is back, the replica evicted from it is scheduled there
    again."""
    replicas = cluster.get_json("deployment", "lockstep-operator", "-n",
                                cluster.OPERATOR_NAMESPACE)["spec"]["replicas"]

    def spread():
        now = [p for p in cluster.operator_pods() if not p["metadata"].get("deletionTimestamp")]
        return len(now) == replicas and all(cluster.pod_ready(p) for p in now) and \
            len({p["spec"].get("nodeName") for p in now}) == min(replicas, len(cluster.NODES))
    cluster.wait_for("the operator's replicas ready, one per node", spread, timeout=180)


class NodeLost(unittest.TestCase):
    lost = None

    def tearDown(self):
        if self.lost and not cluster.node_ready(self.lost):
            subprocess.run([cluster.CLUSTER_SH, "start-node", self.lost], check=True, timeout=120)
            cluster.wait_for(self.lost + " Ready again", lambda: cluster.node_ready(self.lost),
                             timeout=120)
        if self.lost:
            cluster.kubectl("label", "node", self.lost, LOST + "-", check=False)
            operators_spread_and_ready()

    def test_job_goes_on_and_gets_its_workers_back_on_the_other_node(self):
        job = cluster.spread_over_nodes(cluster.example("elastic.yaml"), unless_labelled=LOST)
        name = job["metadata"]["name"]
        job["spec"]["trainer"]["steps"] = 1000000  # still training when the replacements join
        # The Lease's holder, labelled as the Service routes to it: not a hand-over.
        leader, leader_node = cluster.wait_for("one operator leading", cluster.operator_leader,
                                               timeout=60)
        lost_node = next(n for n in cluster.NODES if n != leader_node)
        with cluster.Namespace("nodelost") as ns:
            cluster.shared_checkpoints(job, os.path.join(cluster.STATE, "shared", ns.name))
            ns.apply(job)
            ns.wait_job(name, "training at world 4", lambda j: cluster.step(j) > 0 and
                        j["status"].get("rendezvous", {}).get("worldSize") == 4, timeout=300)
            self.assertEqual(cluster.operator_leader(), (leader, leader_node),
                             "the operator's leader changed before the node was lost:\n" +
                             cluster.operator_summary())
            pods = ns.pods(name)
            lost = [p["metadata"]["name"] for p in pods if p["spec"]["nodeName"] == lost_node]
            kept = [p["metadata"]["name"] for p in pods if p["spec"]["nodeName"] != lost_node]
            # Two on each node: the survivors alone are the job's minReplicas.
            self.assertEqual((len(lost), len(kept)), (2, 2), "workers two on each node: %s" %
                             [(p["metadata"]["name"], p["spec"]["nodeName"]) for p in pods])

            lost_at = time.time()
            self.lost = lost_node
            subprocess.run([cluster.CLUSTER_SH, "kill-node", lost_node], check=True, timeout=60)
            cluster.kubectl("label", "node", lost_node, LOST + "=true")

            def survivors_training():
                return cluster.first_training(ns.logs(kept[0]), after=lost_at, world=len(kept))
            back = ns.wait(name, "the survivors training without the lost node",
                           survivors_training, timeout=120)

            def replaced():
                now = {p["metadata"]["name"]: p for p in ns.pods(name)}
                fresh = [now[n] for n in lost if n in now and
                         now[n]["metadata"]["uid"] not in {p["metadata"]["uid"] for p in pods}]
                return len(fresh) == len(lost) and all(
                    p["spec"].get("nodeName") and p["spec"]["nodeName"] != lost_node and
                    p["status"].get("phase") == "Running" for p in fresh)
            ns.wait(name, "the lost node's workers replaced on the other node", replaced,
                    timeout=300)

            whole_at = ns.wait(name, "training at world 4 again", lambda:
                               cluster.first_training_of_any_pod(ns, name, lost_at, 4),
                               timeout=120)
            at = ns.wait_job(name, "Running with 4 ranks in its status", lambda j:
                             j["status"].get("rendezvous", {}).get("worldSize") == 4 and
                             cluster.phase(j) == "Running", timeout=60)
            ns.wait_job(name, "steps past the recovery", lambda j:
                        cluster.step(j) > cluster.step(at), timeout=60)
            events = cluster.kubectl("get", "events", "-n", ns.name)
            self.assertIn("deleted with grace 0", events, "the operator freed the lost pods' names")
            # The bound the cluster and the operator set: the node controller's 40 s grace, the
            # operator's 30 s toleration, the evicted pods' 30 s grace and its 15 s margin, and
            # a minute to schedule, start and join.
            self.assertLess(whole_at - lost_at, 40 + 30 + 30 + 15 + 60)
            print("e2e node lost: survivors (world %d) training again %.1f s after the loss; "
                  "the whole world again %.1f s after it" % (back[2], back[0] - lost_at,
                                                             whole_at - lost_at))


if __name__ == "__main__":
    unittest.main()
