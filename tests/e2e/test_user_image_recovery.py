"""Recovery of a PyTorch job in the user's own image (examples/pytorch: trixie's torch 2.6, no
Lockstep) on the real cluster, its checkpoint on the storage both nodes share (GlusterFS). Each
test prints its time from the disturbance to the first step of the next generation, and to the
first at the whole world (4), from the steps the ranks record on the shared volume
(docs/benchmarks.md):

- in place (lockstep.elastic, `--in-place`, elastic 2..4): one worker container SIGKILLed through
  containerd; the survivors keep their containers (ids and restart counts) and train on at 3,
  the lost pod's replacement joins, and the job ends Succeeded at exactly its steps;
- restart all (the plain script: torchrun's rule): the same kill restarts every program, which
  resumes from the shared checkpoint; the survivors' containers stay, only their programs restart;
- every pod deleted (`kubectl delete pod --all`, what Kubeflow's PyTorchJob does to recover: new
  pods everywhere): every new pod resumes from the same checkpoint on the shared volume;
- a standby (`elastic.standby: 1`): its program, started ahead and waiting in lockstep.elastic's
  run(), takes a killed worker's place; no step runs at fewer than 4.

Every job paces its steps (--step-delay) so that the disturbance lands mid-run on a fast machine.
"""
import re
import time
import unittest

import cluster

STEPS = 1500
DELAY = "0.04"  # at most 25 steps/s: STEPS take at least 60 s


class UserImageRecovery(unittest.TestCase):
    def run_job(self, ns, job, disturb):
        """Applies `job` in `ns` with a shared claim, waits for step 300, calls disturb(ns, name) ->
        the time of the disturbance, waits for Succeeded at exactly STEPS. Returns (the last
        generation before the disturbance, its time, the first step after it, the first at the
        whole world)."""
        name = job["metadata"]["name"]
        ns.apply(job)
        running = ns.wait_job(name, "training past step 300", lambda j: cluster.step(j) >= 300
                              or cluster.phase(j) == "Failed", timeout=400)
        self.assertNotEqual(cluster.phase(running), "Failed", ns.describe(name))
        before = max(e.get("generation", 0) for e in cluster.timeline(ns.name, name))
        at = disturb(ns, name)
        again = ns.wait(name, "a step in a later generation", lambda: cluster.first_step_after(
            ns.name, name, before), timeout=300)
        whole = ns.wait(name, "a step of the whole world", lambda: cluster.first_step_after(
            ns.name, name, before, world=4), timeout=300)
        done = ns.wait_job(name, "finished", lambda j: cluster.phase(j) in (
            "Succeeded", "Failed"), timeout=900)
        self.assertEqual(cluster.phase(done), "Succeeded", ns.describe(name))
        self.assertEqual(cluster.step(done), STEPS, "exact steps")
        logs = "".join(ns.logs(p["metadata"]["name"]) for p in ns.pods(name))
        self.assertIn("finished at step %d" % STEPS, logs)
        return before, at, again, whole

    def shared(self, prefix):
        """A namespace with the claim "checkpoints" on the shared volume."""
        ns = cluster.Namespace(prefix)
        ns.__enter__()
        cluster.shared_volume(ns.name, "checkpoints")
        self.addCleanup(ns.__exit__, None, None, None)
        self.addCleanup(cluster.delete_shared_volume, ns.name, "checkpoints")
        return ns

    def kill_second_worker(self, ns, name):
        """SIGKILL to worker 1's container; the others' containers are kept in self.survivors.
        Returns the time of the kill."""
        pods = ns.pods(name)
        self.survivors = cluster.containers(pods[:1] + pods[2:])
        at = time.time()
        cluster.kill_container(pods[1])
        return at

    def assert_survivors_keep_their_containers(self, ns, name):
        after = cluster.containers(p for p in ns.pods(name) if p["metadata"]["name"] in self.survivors)
        self.assertEqual(after, self.survivors, "survivors keep their containers (ids, restarts)")

    def test_a_killed_container_is_recovered_in_place_and_the_survivors_keep_theirs(self):
        ns = self.shared("inplace")
        job = cluster.spread_over_nodes(cluster.user_image_job(
            ns.name, "inplace", STEPS, in_place=True, extra_args=["--step-delay", DELAY]))
        job["spec"]["elastic"] = {"minReplicas": 2, "maxReplicas": 4}
        _, at, again, whole = self.run_job(ns, job, self.kill_second_worker)
        self.assert_survivors_keep_their_containers(ns, "inplace")
        self.assertEqual(again["world"], 3, "the survivors train on without the lost one")
        print("e2e user image, in place: training again %.2f s after the kill (world 3), the "
              "whole world %.2f s after it" % (again["time"] - at, whole["time"] - at))

    def test_a_killed_container_restarts_every_program_from_the_shared_checkpoint(self):
        ns = self.shared("restartall")
        job = cluster.spread_over_nodes(cluster.user_image_job(
            ns.name, "restartall", STEPS, extra_args=["--step-delay", DELAY]))
        _, at, again, whole = self.run_job(ns, job, self.kill_second_worker)
        self.assert_survivors_keep_their_containers(ns, "restartall")  # only programs restart
        for pod in self.survivors:
            resumed = [int(m.group(1)) for _, m in cluster.stamped_lines(
                ns, pod, r"resumed from step (\d+)", at)]
            self.assertTrue(resumed and resumed[0] >= 250,
                            "%s resumed from the shared checkpoint: %s" % (pod, resumed))
        print("e2e user image, restart all (torchrun's rule): training again %.2f s after the "
              "kill (world %d), the whole world %.2f s after it" % (
                  again["time"] - at, again["world"], whole["time"] - at))

    def test_every_pod_deleted_resumes_from_the_checkpoint_on_the_shared_volume(self):
        ns = self.shared("alldeleted")
        job = cluster.spread_over_nodes(cluster.user_image_job(
            ns.name, "alldeleted", STEPS, extra_args=["--step-delay", DELAY]))
        seen = {}

        def delete_all(ns, name):
            seen["old"] = {p["metadata"]["uid"] for p in ns.pods(name)}
            at = time.time()
            cluster.kubectl("delete", "pod", "--all", "-n", ns.name, "--wait=false")
            ns.wait(name, "the old pods gone", lambda: not any(
                p["metadata"]["uid"] in seen["old"] for p in cluster.get_json(
                    "pods", "-n", ns.name)["items"]), timeout=300)
            seen["gone"] = time.time()
            return at

        _, at, again, whole = self.run_job(ns, job, delete_all)
        pods = ns.pods("alldeleted")
        self.assertFalse({p["metadata"]["uid"] for p in pods} & seen["old"], "all new pods")
        self.assertEqual({p["spec"]["nodeName"] for p in pods}, set(cluster.NODES))
        resumed = set()
        for pod in pods:
            found = re.findall(r"resumed from step (\d+)", ns.logs(pod["metadata"]["name"]))
            self.assertTrue(found, pod["metadata"]["name"] + " did not resume")
            resumed.add(int(found[0]))
        self.assertEqual(len(resumed), 1, "every pod resumed from the same step: %s" % resumed)
        self.assertGreaterEqual(resumed.pop(), 250, "from the checkpoint, not step 0")
        print("e2e user image, every pod deleted (Kubeflow's PyTorchJob recovery): training "
              "again %.2f s after the delete (the old pods gone after %.2f s)" % (
                  again["time"] - at, seen["gone"] - at))

    def test_a_standby_takes_a_killed_workers_place_and_the_world_never_shrinks(self):
        ns = self.shared("standby")
        job = cluster.spread_over_nodes(cluster.user_image_job(
            ns.name, "standby", STEPS, in_place=True, extra_args=["--step-delay", DELAY]))
        job["spec"]["elastic"] = {"standby": 1}
        seen = {}

        def kill(ns, name):
            ns.wait_job(name, "training at 4 with one standby", lambda j:
                        j.get("status", {}).get("rendezvous", {}).get("worldSize") == 4
                        and j["status"]["rendezvous"].get("standby") == 1, timeout=300)
            pods = ns.pods(name)
            self.assertEqual(len(pods), 5, ns.describe(name))
            training = {e["pid"] for e in cluster.timeline(ns.name, name)[-40:]}
            seen["before"] = training
            victim = [p for p in pods if "generation" in ns.logs(p["metadata"]["name"])][1]
            at = time.time()
            cluster.kill_container(victim)
            return at

        before, at, again, whole = self.run_job(ns, job, kill)
        self.assertEqual(again["world"], 4, "the standby's generation is the whole world")
        after = [e for e in cluster.timeline(ns.name, "standby") if e.get("generation", 0) > before]
        self.assertTrue({e["pid"] for e in after} - seen["before"],
                        "a process that was not training before (the standby's) trains now")
        self.assertEqual({e["world"] for e in after}, {4}, "world sizes trained at after the kill")
        print("e2e user image, standby: the standby's generation training (world 4) %.2f s "
              "after the kill" % (again["time"] - at))


if __name__ == "__main__":
    unittest.main()
