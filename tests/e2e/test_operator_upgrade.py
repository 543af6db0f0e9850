"""`helm upgrade` of the operator while an elastic job trains (examples/elastic.yaml over both
nodes), as a platform engineer upgrades it: the Deployment rolls both replicas one at a time
(the chart's `spreadReplicas: required`: a replica leaves its node before its successor takes
it), the old leader releases the Lease on SIGTERM and a new replica takes the job's generation up
from the workers' own word. The workers never stop: the generation number never changes, every
worker keeps its container, no restart is counted, and the job ends Succeeded at exactly its
steps. Prints the time from the upgrade to the new leader and the longest pause between rank 0's
step lines meanwhile (it was 2.8 s when the workers re-formed on every hand-over;
docs/benchmarks.md).

The upgrade changes only a pod annotation, which rolls the pods as a new image would. The job is
sized (12,000 steps) to train past the whole roll-out on a machine several times faster than the
2-core one the figures come from."""
import os
import time
import unittest
import uuid

import cluster

STEPS = 12000
CHART = os.path.join(cluster.REPO, "charts", "lockstep")


def rolled_out(old):
    """Every operator replica is new (none of `old`), ready, and one of them leads: its name."""
    pods = [p for p in cluster.operator_pods() if not p["metadata"].get("deletionTimestamp")]
    if any(p["metadata"]["name"] in old for p in pods) or not all(map(cluster.pod_ready, pods)):
        return None
    held = cluster.operator_leader()
    return held[0] if held and held[0] not in old else None


class OperatorUpgrade(unittest.TestCase):
    def test_training_goes_on_through_a_helm_upgrade(self):
        with cluster.Namespace("upgrade") as ns:
            name, generation, before = cluster.train_elastic_job_at_world_4(ns, STEPS)
            cluster.wait_for("one operator leading", cluster.operator_leader, timeout=60)
            old = {p["metadata"]["name"] for p in cluster.operator_pods()}

            upgraded_at = time.time()
            cluster.helm("upgrade", "lockstep", CHART, "--namespace", cluster.OPERATOR_NAMESPACE,
                         "--reuse-values", "--set-string",
                         "operator.podAnnotations.lockstep-e2e-upgrade=" + uuid.uuid4().hex[:8])
            try:
                successor = cluster.wait_for("the operator rolled out, a new replica leading",
                                             lambda: rolled_out(old), timeout=300)
            except cluster.Timeout as error:
                raise cluster.Timeout("%s\n%s" % (error, cluster.operator_summary())) from None
            led_at = time.time()
            step_at_lead = cluster.step(ns.job(name))

            cluster.wait_generation_taken_up(ns, name, generation, step_at_lead, successor,
                                             before)
            cluster.assert_ended_undisturbed(ns, name, STEPS, generation, before)

            pause, usual = cluster.longest_pause(ns, name, upgraded_at, led_at)
            print("e2e operator upgrade: `helm upgrade` rolled both replicas; %s led %.1f s after "
                  "it; the longest pause between rank 0's step lines meanwhile %.2f s (%.2f s "
                  "before the upgrade); generation %d throughout" % (
                      successor, led_at - upgraded_at, pause, usual, generation))


if __name__ == "__main__":
    unittest.main()
