"""Recovery of a PyTorch job in the user's own image (examples/pytorch: trixie's torch 2.6, no
Lockstep) on the real cluster, its checkpoint on the storage both nodes share (GlusterFS). Each
test prints its time from the disturbance to training again (docs/benchmarks.md):

- in place (lockstep.elastic, `--in-place`): one worker container SIGKILLed through containerd;
  the survivors keep their containers (ids and restart counts) and train on, the lost pod's
  replacement joins, and the job ends Succeeded at exactly its steps;
- restart all (the plain script: torchrun's rule): the same kill restarts every program, which
  resumes from the shared checkpoint; the survivors' containers stay, only their programs restart;
- every pod deleted (`kubectl delete pod --all`, what Kubeflow's PyTorchJob does to recover: new
  pods everywhere): the new pods resume from the checkpoint on the shared volume;
- a standby (`elastic.standby: 1`): its program, started ahead and waiting in lockstep.elastic's
  run(), takes a killed worker's place; no step runs at fewer than 4.

Every job paces its steps (--step-delay) so that the disturbance lands mid-run on a fast machine.
"""
import time
import unittest

import cluster

STEPS = 1500
DELAY = "0.04"  # at most 25 steps/s: STEPS take at least 60 s
GENERATION = r"generation (\d+): rank (\d+) of (\d+) from step (\d+)"


def in_place_job(name, **spec):
    job = cluster.spread_over_nodes(cluster.user_image_job(
        name, STEPS, in_place=True, extra_args=["--step-delay", DELAY]))
    job["spec"].update(spec)
    return job


def containers(pods):
    """{pod name: (container id, restart count)}."""
    return {p["metadata"]["name"]: (cluster.container_id(p), cluster.restart_count(p))
            for p in pods}


class UserImageRecovery(unittest.TestCase):
    def run_job(self, prefix, job, disturb, check=None):
        """Applies `job` with a shared claim, waits for step 300, calls disturb(ns, name) -> the
        time of the disturbance, waits for Succeeded at exactly STEPS, then check(ns, done)."""
        name = job["metadata"]["name"]
        with cluster.Namespace(prefix) as ns:
            cluster.shared_volume(ns.name, "checkpoints")
            try:
                ns.apply(job)
                ns.wait_job(name, "training past step 300", lambda j: cluster.step(j) >= 300,
                            timeout=400)
                at = disturb(ns, name)
                done = ns.wait_job(name, "finished", lambda j: cluster.phase(j) in (
                    "Succeeded", "Failed"), timeout=900)
                self.assertEqual(cluster.phase(done), "Succeeded", ns.describe(name))
                self.assertEqual(cluster.step(done), STEPS, "exact steps")
                logs = "".join(ns.logs(p["metadata"]["name"]) for p in ns.pods(name))
                self.assertIn("finished at step %d" % STEPS, logs)
                if check:
                    check(ns, done, at)
            finally:
                cluster.delete_shared_volume(ns.name, "checkpoints")

    def test_a_killed_container_is_recovered_in_place_and_the_survivors_keep_theirs(self):
        job = in_place_job("inplace", elastic={"minReplicas": 2, "maxReplicas": 4})
        seen = {}

        def kill(ns, name):
            pods = ns.pods(name)
            seen["survivors"] = containers(pods[:1] + pods[2:])
            at = time.time()
            cluster.kill_container(pods[1])
            seen["training"] = ns.wait(name, "a survivor training in a new generation", lambda:
                                       cluster.first_stamped_line(ns, name, GENERATION, at),
                                       timeout=120)
            return at

        def check(ns, done, at):
            after = containers(p for p in ns.pods("inplace")
                               if p["metadata"]["name"] in seen["survivors"])
            self.assertEqual(after, seen["survivors"], "survivors keep their containers")
            self.assertGreaterEqual(done["status"].get("restarts", 0), 1)
            print("e2e user image, in place: a survivor training again %.2f s after the kill" %
                  (seen["training"] - at))

        self.run_job("inplace", job, kill, check)

    def test_a_killed_container_restarts_every_program_from_the_shared_checkpoint(self):
        job = cluster.spread_over_nodes(cluster.user_image_job(
            "restartall", STEPS, extra_args=["--step-delay", DELAY]))
        seen = {}

        def kill(ns, name):
            pods = ns.pods(name)
            seen["survivors"] = containers(pods[:1] + pods[2:])
            at = time.time()
            cluster.kill_container(pods[1])
            seen["training"] = ns.wait(name, "the programs resumed", lambda:
                                       cluster.first_stamped_line(ns, name, r"resumed from step",
                                                                  at), timeout=180)
            return at

        def check(ns, done, at):
            after = containers(p for p in ns.pods("restartall")
                               if p["metadata"]["name"] in seen["survivors"])
            self.assertEqual(after, seen["survivors"],
                             "only the programs restart: the survivors' containers stay")
            print("e2e user image, restart all (torchrun's rule): training again %.2f s after "
                  "the kill" % (seen["training"] - at))

        self.run_job("restartall", job, kill, check)

    def test_every_pod_deleted_resumes_from_the_checkpoint_on_the_shared_volume(self):
        job = cluster.spread_over_nodes(cluster.user_image_job(
            "alldeleted", STEPS, extra_args=["--step-delay", DELAY]))
        seen = {}

        def delete_all(ns, name):
            old = {p["metadata"]["uid"] for p in ns.pods(name)}
            at = time.time()
            cluster.kubectl("delete", "pod", "--all", "-n", ns.name, "--wait=false")

            def resumed():
                for pod in ns.pods(name):
                    if pod["metadata"]["uid"] in old:
                        continue
                    found = cluster.stamped_lines(ns, pod["metadata"]["name"],
                                                  r"resumed from step (\d+)", at)
                    if found:
                        return found[0]
                return None
            seen["resumed"] = ns.wait(name, "a new pod resuming from the checkpoint", resumed,
                                      timeout=300)
            return at

        def check(ns, done, at):
            resumed_at, match = seen["resumed"]
            self.assertGreaterEqual(int(match.group(1)), 250, "from the checkpoint, not step 0")
            print("e2e user image, every pod deleted (Kubeflow's PyTorchJob recovery): training "
                  "again from step %s %.2f s after the delete" % (match.group(1), resumed_at - at))

        self.run_job("alldeleted", job, delete_all, check)

    def test_a_standby_takes_a_killed_workers_place_and_the_world_never_shrinks(self):
        job = in_place_job("standby", elastic={"standby": 1})
        seen = {}

        def kill(ns, name):
            full = ns.wait_job(name, "training at 4 with one standby", lambda j:
                               j.get("status", {}).get("rendezvous", {}).get("worldSize") == 4
                               and j["status"]["rendezvous"].get("standby") == 1, timeout=300)
            generation = full["status"]["rendezvous"]["generation"]
            pods = ns.pods(name)
            self.assertEqual(len(pods), 5, ns.describe(name))
            training = [p for p in pods if cluster.stamped_lines(
                ns, p["metadata"]["name"], r"generation %d: rank" % generation)]
            standby = [p for p in pods if p not in training]
            self.assertEqual(len(standby), 1, ns.describe(name))
            seen["standby"] = standby[0]["metadata"]["name"]
            at = time.time()
            cluster.kill_container(training[1])
            seen["training"] = ns.wait(name, "the standby training", lambda: (
                cluster.stamped_lines(ns, seen["standby"], GENERATION, at) or [None])[0],
                timeout=120)
            return at

        def check(ns, done, at):
            stamp, match = seen["training"]
            self.assertEqual(match.group(3), "4", "the standby's generation is the whole world")
            worlds = set()
            for pod in ns.pods("standby"):
                worlds |= {m.group(3) for _, m in cluster.stamped_lines(
                    ns, pod["metadata"]["name"], GENERATION, at)}
            self.assertEqual(worlds, {"4"}, "world sizes trained at after the kill")
            print("e2e user image, standby: the standby training (world 4, from step %s) %.2f s "
                  "after the kill" % (match.group(4), stamp - at))

        self.run_job("standby", job, kill, check)


if __name__ == "__main__":
    unittest.main()
