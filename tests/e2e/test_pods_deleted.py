"""`kubectl delete pod --all` in the middle of a run: the operator recreates the workers, they
restore the newest checkpoint (on a hostPath directory both nodes share, as an NFS mount would
be), and the job finishes at exactly its steps. Pods deleted this way do not count as failures."""
import os
import re
import unittest

import cluster


class PodsDeleted(unittest.TestCase):
    def test_every_pod_deleted_resumes_from_the_checkpoint(self):
        job = cluster.spread_over_nodes(cluster.example("fashion-mnist.yaml"))
        name = job["metadata"]["name"]
        with cluster.Namespace("deleted") as ns:
            job["spec"]["checkpoint"] = {"intervalSteps": 200, "keep": 2}
            cluster.shared_checkpoints(job, os.path.join(cluster.STATE, "shared", ns.name))
            job["spec"]["runPolicy"] = {"restartPolicy": "OnFailure", "backoffLimit": 3}
            ns.apply(job)

            def committed():
                for pod in ns.pods(name):
                    try:
                        found = re.findall(r"checkpoint of step (\d+) committed",
                                           ns.logs(pod["metadata"]["name"]))
                    except AssertionError:
                        continue
                    if found:
                        return int(found[-1])
                return None
            saved = ns.wait(name, "a checkpoint committed", committed, timeout=300)
            old = {p["metadata"]["uid"] for p in ns.pods(name)}
            cluster.kubectl("delete", "pod", "--all", "-n", ns.name, "--wait=false")

            def recreated():
                pods = ns.pods(name)
                return pods if len(pods) == 4 and not old & {p["metadata"]["uid"] for p in pods} \
                    and all(p["status"].get("phase") == "Running" for p in pods) else None
            pods = ns.wait(name, "4 new worker pods running", recreated, timeout=180)

            def restored():
                m = re.search(r"resumed from checkpoint step (\d+)",
                              ns.logs(pods[0]["metadata"]["name"]))
                return int(m.group(1)) if m else None
            step = ns.wait(name, "the new workers restore a checkpoint", restored, timeout=180)
            self.assertGreaterEqual(step, saved, "the newest checkpoint, or a newer one")

            done = ns.wait_job(name, "finished", lambda j: cluster.phase(j) in ("Succeeded", "Failed"),
                               timeout=900)
            self.assertEqual(cluster.phase(done), "Succeeded", ns.describe(name))
            self.assertEqual(cluster.step(done), job["spec"]["trainer"]["steps"])
            self.assertEqual(done["status"].get("restarts", 0), 0,
                             "deleted pods are not failures (no backoffLimit spent)")
            print("e2e pods deleted: restored step %d (checkpoint %d seen before the delete)"
                  % (step, saved))


if __name__ == "__main__":
    unittest.main()
