"""`helm test lockstep` on the installed release, as a platform engineer checks an installation:
the chart's test pod (`lockstep-operator check`, charts/lockstep/templates/tests/check.yaml) finds
the webhook refusing a bad TrainingJob by its Service over TLS, the rendezvous service answering
over TLS from the operator's CA, and the metrics served; the release reports the test passed, and
the passed pod is gone (nothing of a test outlives `helm uninstall`). Prints how long it took and
what the pod saw."""
import time
import unittest

import cluster


class HelmTest(unittest.TestCase):
    def test_helm_test_finds_the_installation_answering(self):
        cluster.wait_for("one operator leading", cluster.operator_leader, timeout=120)
        started = time.time()
        # --logs prints the test pod's log before the hook's delete policy removes it.
        out = cluster.helm("test", "lockstep", "--namespace", cluster.OPERATOR_NAMESPACE,
                           "--logs", "--timeout", "3m", timeout=240, check=False)
        took = time.time() - started
        self.assertIn("Phase:          Succeeded", out, out)
        for seen in ("refused a TrainingJob with spec.replicas -1",
                     "answered a member of no job with NOT_FOUND, over TLS",
                     "served", "all 3 checks passed"):
            self.assertIn(seen, out, out)
        left = cluster.kubectl("get", "pods", "--namespace", cluster.OPERATOR_NAMESPACE,
                               "-l", "app.kubernetes.io/component=check", "-o", "name")
        self.assertEqual(left.strip(), "", "the passed test pod outlived its test")
        lines = [line for line in out.splitlines() if line.startswith(("ok ", "FAILED ", "all "))]
        print("e2e helm test: `helm test lockstep` passed in %.1f s:\n  %s" % (
            took, "\n  ".join(lines)))


if __name__ == "__main__":
    unittest.main()
