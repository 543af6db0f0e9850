"""A hot standby on the real cluster: examples/elastic.yaml with `spec.elastic.standby: 1` is five
pods over both nodes, four training and one started and waiting in the rendezvous (`kubectl get
tj` shows it in the Standby column). A training worker's container SIGKILLed through its node's
containerd: the standby takes its place in the generation that forms at once, so from the kill
on every generation trains at world 4 and no step runs at 3; the killed worker's replacement pod
becomes the new standby, and the job ends Succeeded at exactly its steps. Prints the time from
the kill to the standby training (docs/benchmarks.md; e2e_worker_killed prints the time to the
whole world without a standby)."""
import os
import re
import time
import unittest

import cluster

class Standby(unittest.TestCase):
    def test_standby_pod_takes_a_killed_workers_place_and_the_world_never_shrinks(self):
        job = cluster.spread_over_nodes(cluster.example("elastic.yaml"))
        job["spec"]["elastic"]["standby"] = 1
        name = job["metadata"]["name"]
        with cluster.Namespace("standby") as ns:
            cluster.shared_checkpoints(job, os.path.join(cluster.STATE, "shared", ns.name))
            ns.apply(job)
            # The job may start at its minReplicas and grow: the generation that trains at 4
            # with the fifth pod waiting is the one to disturb.
            cluster.wait_logged_step(ns, name, 200, timeout=300)
            full = ns.wait_job(name, "training at world 4 with one standby", lambda j:
                               j.get("status", {}).get("rendezvous", {}).get("worldSize") == 4
                               and j["status"]["rendezvous"].get("standby") == 1, timeout=300)
            generation = full["status"]["rendezvous"]["generation"]
            table = cluster.kubectl("get", "tj", name, "-n", ns.name)
            self.assertIn("STANDBY", table.splitlines()[0], table)
            self.assertEqual(table.splitlines()[1].split()[table.splitlines()[0].split().index(
                "STANDBY")], "1", table)

            pods = ns.pods(name)
            self.assertEqual(len(pods), 5, ns.describe(name))
            logs = {p["metadata"]["name"]: ns.logs(p["metadata"]["name"]) for p in pods}
            joined = " joined generation %d " % generation
            trainers = [p for p in pods if joined in logs[p["metadata"]["name"]]]
            standbys = [p["metadata"]["name"] for p in pods if p not in trainers]
            self.assertEqual(len(standbys), 1, "one pod is not in generation %d: %s\n%s" % (
                generation, standbys, "\n".join(
                    "%s: %s" % (pod, re.findall(r"joined generation \d+ .*", text))
                    for pod, text in logs.items())))
            standby = standbys[0]
            victim = trainers[1]

            killed_at = time.time()
            cluster.kill_container(victim)

            def standby_training():
                return cluster.first_training(ns.logs(standby), after=killed_at)
            at, step, world = ns.wait(name, "the standby training in the killed worker's place",
                                      standby_training, timeout=120)
            self.assertEqual(world, 4, "the standby's generation is the whole world")

            # The killed worker's index gets a new pod, which waits as the new standby.
            def new_standby():
                j = ns.job(name)
                fresh = [p for p in ns.pods(name) if p["metadata"]["uid"] not in
                         {q["metadata"]["uid"] for q in pods}]
                return (fresh and j["status"].get("rendezvous", {}).get("standby") == 1 and
                        j["status"]["rendezvous"].get("generation", 0) >= 2)
            ns.wait(name, "a new standby pod behind it", new_standby, timeout=180)

            done = ns.wait_job(name, "finished", lambda j: cluster.phase(j) in
                               ("Succeeded", "Failed"), timeout=900)
            self.assertEqual(cluster.phase(done), "Succeeded", ns.describe(name))
            self.assertEqual(cluster.step(done), job["spec"]["trainer"]["steps"], "exact steps")
            self.assertGreaterEqual(done["status"].get("restarts", 0), 1)
            # From the kill on, no generation trained with fewer than the job's 4 workers.
            worlds = set()
            for pod in cluster.get_json("pods", "-n", ns.name, "-l",
                                        "%s=%s" % (cluster.JOB_LABEL, name))["items"]:
                worlds |= {int(w) for stamp, _, w in
                           cluster.TRAINING_FROM.findall(ns.logs(pod["metadata"]["name"]))
                           if cluster.log_time(stamp) >= killed_at}
            self.assertEqual(worlds, {4}, "world sizes trained at after the kill")
            print("e2e standby: the standby training (world %d, from step %d) %.2f s after the "
                  "kill" % (world, step, at - killed_at))


if __name__ == "__main__":
    unittest.main()
