"""An exec-mode job runs a Python program in the CPU worker image (Debian's python3 there; the
image has no PyTorch, docs/cluster.md): every pod's agent starts it with the rendezvous'
environment, its `from lockstep import progress` reports reach `kubectl get tj` while it runs, and
the job ends Succeeded at the program's last step."""
import unittest

import cluster

PROGRAM = """
import os, time
from lockstep import progress
total = 40
world = int(os.environ["WORLD_SIZE"])
print("rank", os.environ["RANK"], "of", world, "master", os.environ["MASTER_ADDR"], flush=True)
for step in range(total):
    with progress.computing():
        sum(i * i for i in range(100000))
    progress.report(step=step + 1, samples=(step + 1) * 32 * world, total_steps=total)
    time.sleep(0.5)  # a training step's pace, so that progress shows while it runs
"""


class ExecMode(unittest.TestCase):
    def test_python_program_reports_progress_to_kubectl(self):
        job = {"apiVersion": "lockstep.io/v1alpha1", "kind": "TrainingJob",
               "metadata": {"name": "python-exec"},
               "spec": {"replicas": 2, "command": ["/usr/bin/python3", "-c", PROGRAM],
                        "runPolicy": {"restartPolicy": "OnFailure", "backoffLimit": 2}}}
        with cluster.Namespace("exec") as ns:
            ns.apply(cluster.spread_over_nodes(job))
            running = ns.wait_job("python-exec", "progress while running",
                                  lambda j: cluster.phase(j) == "Running" and cluster.step(j) > 0,
                                  timeout=180)
            table = cluster.kubectl("get", "tj", "python-exec", "-n", ns.name)
            shown = cluster.table_step(table)
            self.assertIsNotNone(shown, "kubectl get tj shows the step:\n" + table)
            self.assertGreaterEqual(shown, cluster.step(running), table)
            done = ns.wait_job("python-exec", "finished",
                               lambda j: cluster.phase(j) in ("Succeeded", "Failed"), timeout=300)
            self.assertEqual(cluster.phase(done), "Succeeded", ns.describe("python-exec"))
            self.assertEqual(cluster.step(done), 40)
            pods = cluster.get_json("pods", "-n", ns.name)["items"]
            logs = ns.logs(pods[0]["metadata"]["name"])
            self.assertRegex(logs, r"\[rank \d\] rank \d of 2 master 10\.244\.", logs[-2000:])


if __name__ == "__main__":
    unittest.main()
