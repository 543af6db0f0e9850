"""examples/fashion-mnist.yaml on a real cluster: applied with kubectl, 4 worker pods spread over
both nodes train to the accuracy `lockstep run` reaches (85%, tests/integration/cli/run_test.cc),
`kubectl get tj` shows progress while it runs, `kubectl logs` shows a worker's training lines, and
the job ends Succeeded. Every worker runs under the restricted Pod Security profile on real runc
(checked inside a container: non-root, no capabilities, seccomp filtering). Ranks follow the
nodes' rack labels (scripts/cluster/values.yaml gives the operator the keys): the two pods on each
node, one rack each, hold consecutive ranks. Prints the time from `kubectl apply` to the first
step (docs/benchmarks.md)."""
import re
import time
import unittest

import cluster


class FashionMnistOnTwoNodes(unittest.TestCase):
    def test_trains_on_both_nodes_to_the_local_accuracy_and_succeeds(self):
        job = cluster.spread_over_nodes(cluster.example("fashion-mnist.yaml"))
        name = job["metadata"]["name"]
        with cluster.Namespace("fashion") as ns:
            applied = time.time()
            ns.apply(job)

            pods = ns.wait(name, "4 running worker pods", lambda: (
                lambda p: p if len(p) == 4 and all(x["status"].get("phase") == "Running" for x in p)
                else None)(ns.pods(name)), timeout=180)
            self.assertEqual({p["spec"]["nodeName"] for p in pods}, set(cluster.NODES),
                             "the workers are spread over both nodes")

            running = ns.wait_job(name, "a training step in status.progress",
                                  lambda j: cluster.step(j) > 0, timeout=180)
            table = cluster.kubectl("get", "tj", name, "-n", ns.name)
            self.assertRegex(table, r"\bRunning\b", table)
            shown = cluster.table_step(table)
            self.assertIsNotNone(shown, "kubectl get tj shows the step:\n" + table)
            self.assertGreaterEqual(shown, cluster.step(running), table)

            # Restricted profile, as the kernel sees the worker process (PID 1 of its container).
            status = cluster.kubectl("exec", "-n", ns.name, pods[0]["metadata"]["name"], "--",
                                     "cat", "/proc/1/status")
            self.assertRegex(status, r"Uid:\s+65532\s", "runs as the non-root user")
            self.assertRegex(status, r"CapEff:\s+0+\n", "no effective capabilities")
            self.assertRegex(status, r"CapBnd:\s+0+\n", "no capabilities it could gain")
            self.assertRegex(status, r"NoNewPrivs:\s+1", "no privilege escalation")
            self.assertRegex(status, r"Seccomp:\s+2", "a seccomp filter (RuntimeDefault)")

            done = ns.wait_job(name, "Succeeded", lambda j: cluster.phase(j) in ("Succeeded", "Failed"),
                               timeout=900)
            self.assertEqual(cluster.phase(done), "Succeeded", ns.describe(name))
            self.assertEqual(cluster.step(done), job["spec"]["trainer"]["steps"])
            # The job ran (the table said Running above), and Running ended with it: not the
            # "1 of 4 workers running" of the moment the first worker completed.
            ended = cluster.condition(done, "Running") or {}
            self.assertEqual((ended.get("status"), ended.get("reason"), ended.get("message")),
                             ("False", "WorkersSucceeded", "the job succeeded"), ns.describe(name))

            # Each node is a rack of its own: its pods' ranks in the generation of all four are
            # consecutive, whatever order the pods joined in.
            joined = re.compile(r"joined generation (\d+) as rank (\d+) of 4\b")
            ranks = {}  # generation -> {pod: rank}
            for pod in pods:
                for generation, rank in joined.findall(ns.logs(pod["metadata"]["name"])):
                    ranks.setdefault(int(generation), {})[pod["metadata"]["name"]] = int(rank)
            whole = [g for g, members in sorted(ranks.items()) if len(members) == 4]
            self.assertTrue(whole, "a generation of all four: %s" % ranks)
            for node in cluster.NODES:
                on_node = sorted(ranks[whole[0]][p["metadata"]["name"]] for p in pods
                                 if p["spec"]["nodeName"] == node)
                self.assertIn(on_node, ([0, 1], [2, 3]),
                              "the ranks on %s's rack are consecutive: %s" % (node, ranks))

            logs = ns.logs(pods[0]["metadata"]["name"])
            first_step = cluster.first_training(logs, after=applied)[0] - applied
            self.assertRegex(logs, r"step \d+", "kubectl logs shows training lines")
            accuracy = [float(a) for a in re.findall(r"evaluation: accuracy ([0-9.]+)", logs)]
            self.assertTrue(accuracy, "a worker logs its evaluation:\n" + logs[-2000:])
            self.assertGreaterEqual(accuracy[-1], 0.85)
            print("e2e fashion-mnist: apply to first step %.1f s, accuracy %.4f, %d steps"
                  % (first_step, accuracy[-1], cluster.step(done)))


if __name__ == "__main__":
    unittest.main()
