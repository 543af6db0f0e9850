"""A worker that exits with a clear error (the manifest names training data that is not in the
image) puts its message in the job's condition through the real kubelet's terminationMessagePath,
and the job fails without replacing it again and again."""
import unittest

import cluster


class ClearError(unittest.TestCase):
    def test_missing_data_reaches_the_jobs_condition(self):
        job = cluster.example("fashion-mnist.yaml")
        job["metadata"]["name"] = "missing-data"
        job["spec"]["replicas"] = 2
        job["spec"]["trainer"]["data"]["train"] = [
            "file:///usr/share/datasets/no-such-set/train-images-idx3-ubyte.gz",
            "file:///usr/share/datasets/no-such-set/train-labels-idx1-ubyte.gz"]
        with cluster.Namespace("error") as ns:
            ns.apply(job)
            failed = ns.wait_job("missing-data", "Failed", lambda j: cluster.phase(j) == "Failed",
                                 timeout=180)
            messages = " ".join(c.get("message", "") for c in failed["status"].get("conditions", []))
            self.assertIn("no-such-set/train-images-idx3-ubyte.gz", messages, ns.describe("missing-data"))
            pods = cluster.get_json("pods", "-n", ns.name)["items"]
            terminated = [p["status"]["containerStatuses"][0]["state"].get("terminated", {})
                          for p in pods if p["status"].get("containerStatuses")]
            self.assertTrue(any("no-such-set" in t.get("message", "") for t in terminated),
                            "the kubelet read the message from the container's termination log")
            print("e2e clear error: " + next(c["message"] for c in failed["status"]["conditions"]
                                             if "no-such-set" in c.get("message", "")))


if __name__ == "__main__":
    unittest.main()
