"""spec.placement on a real cluster, where kube-scheduler places the pods: each node is a rack of
its own (scripts/cluster/common.sh), so a job of 4 workers that asks for one rack runs on one
node, against the scheduler's habit of spreading a Service's pods, and succeeds there. A job that
asks for a level no node carries says so in its Running condition, while the scheduler leaves its
pods Pending as unschedulable."""
import unittest

import cluster

RACK = "topology.lockstep.io/rack"


def fashion(replicas, placement):
    """examples/fashion-mnist.yaml (its data is in the worker image), shortened."""
    job = cluster.example("fashion-mnist.yaml")
    job["spec"]["replicas"] = replicas
    job["spec"]["trainer"]["steps"] = 200
    job["spec"]["placement"] = placement
    return job


class PlacementOnTwoRacks(unittest.TestCase):
    def test_a_job_asking_for_one_rack_runs_on_one_node_and_succeeds(self):
        job = fashion(4, {"topology": RACK})
        name = job["metadata"]["name"]
        with cluster.Namespace("placement") as ns:
            ns.apply(job)
            done = ns.wait_job(name, "finished", lambda j: cluster.phase(j) in ("Succeeded", "Failed"),
                               timeout=300)
            self.assertEqual(cluster.phase(done), "Succeeded", ns.describe(name))
            pods = cluster.get_json("pods", "-n", ns.name, "-l", "%s=%s" % (cluster.JOB_LABEL, name))
            nodes = {p["spec"].get("nodeName") for p in pods["items"]}
            self.assertEqual(len(pods["items"]), 4, ns.describe(name))
            self.assertEqual(len(nodes), 1, "all four workers in one rack: %s" % nodes)
            racks = {cluster.get_json("node", node)["metadata"]["labels"].get(RACK) for node in nodes}
            self.assertEqual(len(racks), 1, racks)

    def test_a_level_no_node_carries_is_named_while_the_pods_wait(self):
        job = fashion(2, {"topology": "topology.lockstep.io/no-such-level"})
        name = job["metadata"]["name"]
        with cluster.Namespace("nolevel") as ns:
            ns.apply(job)
            said = ns.wait_job(name, "Running False, reason NoNodeHasTopologyLevel", lambda j: (
                cluster.condition(j, "Running") or {}).get("reason") == "NoNodeHasTopologyLevel",
                timeout=120)
            message = cluster.condition(said, "Running")["message"]
            self.assertIn("topology.lockstep.io/no-such-level", message)

            def unschedulable():
                pods = ns.pods(name)
                reasons = [c.get("reason") for p in pods for c in p["status"].get("conditions", [])
                           if c.get("type") == "PodScheduled" and c.get("status") == "False"]
                return len(pods) == 2 and reasons == ["Unschedulable", "Unschedulable"]
            ns.wait(name, "both pods Pending as unschedulable", unschedulable, timeout=120)


if __name__ == "__main__":
    unittest.main()
