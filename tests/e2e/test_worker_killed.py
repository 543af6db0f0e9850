"""A worker container killed on its node (SIGKILL through the node's containerd) in an elastic job
(examples/elastic.yaml over both nodes): the pod is replaced under the run policy, the survivors
keep their processes and state (their container ids and restart counts do not change: they
re-form without it and go on from their own step), and the job ends Succeeded at exactly its
steps. Prints the time from the kill to the survivors training again and to the whole world
training again (docs/benchmarks.md)."""
import os
import time
import unittest

import cluster


class WorkerKilled(unittest.TestCase):
    def test_killed_worker_is_replaced_and_survivors_keep_their_processes(self):
        job = cluster.spread_over_nodes(cluster.example("elastic.yaml"))
        name = job["metadata"]["name"]
        # Sized so that the replacement joins mid-run on a fast machine (about 100 steps a
        # second at world 4): a job that ends first leaves nothing for it to join.
        job["spec"]["trainer"]["steps"] = 8000
        with cluster.Namespace("killed") as ns:
            cluster.shared_checkpoints(job, os.path.join(cluster.STATE, "shared", ns.name))
            ns.apply(job)
            cluster.wait_logged_step(ns, name, 200, timeout=300)
            before = {p["metadata"]["name"]: p for p in ns.pods(name)}
            self.assertEqual(len(before), 4, ns.describe(name))
            victim = ns.pods(name)[1]
            survivors = cluster.containers(p for n, p in before.items()
                                           if n != victim["metadata"]["name"])

            killed_at = time.time()
            cluster.kill_container(victim)

            # The survivors train again in a generation without the victim.
            def retrained():
                for pod in survivors:
                    found = cluster.first_training(ns.logs(pod), after=killed_at)
                    if found:
                        return found[0] - killed_at, found[2]
                return None
            back_after, world = ns.wait(name, "survivors training again", retrained, timeout=120)

            # The victim's pod is replaced (same index, a new pod) and joins again.
            def replaced():
                pods = ns.pods(name)
                index1 = [p for p in pods if p["metadata"]["labels"][cluster.INDEX_LABEL] == "1"]
                return (len(pods) == 4 and index1 and
                        index1[0]["metadata"]["uid"] != victim["metadata"]["uid"])
            ns.wait(name, "the killed worker's pod replaced", replaced, timeout=120)

            # ... and the whole world trains again (e2e_standby measures the same with a standby).
            whole_at = ns.wait(name, "training at world 4 again", lambda:
                               cluster.first_training_of_any_pod(ns, name, killed_at, 4),
                               timeout=120)

            done = ns.wait_job(name, "finished", lambda j: cluster.phase(j) in ("Succeeded", "Failed"),
                               timeout=900)
            self.assertEqual(cluster.phase(done), "Succeeded", ns.describe(name))
            self.assertEqual(cluster.step(done), job["spec"]["trainer"]["steps"], "exact steps")
            self.assertGreaterEqual(done["status"].get("restarts", 0), 1)

            after = cluster.containers(cluster.job_pods_any_state(ns.name, name))
            for pod, kept in survivors.items():
                self.assertIn(pod, after, "survivor %s kept its pod" % pod)
                self.assertEqual(after[pod], kept, "survivor %s kept its container (its process "
                                 "and state) and its restart count" % pod)
            print("e2e worker killed: survivors training again (world %d) %.1f s after the kill, "
                  "the whole world again %.1f s after it" % (world, back_after,
                                                             whole_at - killed_at))


if __name__ == "__main__":
    unittest.main()
