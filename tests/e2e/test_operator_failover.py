"""The operator's leader pod force-deleted while an elastic job trains (examples/elastic.yaml over
both nodes): the workers never stop training. Their heartbeats wait for the other replica, which
takes the Lease once it expires and takes the job's generation up from the workers' own word
(docs/operator.md, "The control plane never stops training"): the generation number never
changes, every worker keeps its container, no restart is counted, and the job ends Succeeded at
exactly its steps. Prints the longest pause between rank 0's step lines around the kill (it was
10.8 s when the workers re-formed on every failover) and the time from the kill to the new
leader (docs/benchmarks.md).

The job is sized (12,000 steps) to train well past the takeover, which waits out the Lease's
15 s, on a machine several times faster than the 2-core one the figures come from."""
import time
import unittest

import cluster

STEPS = 12000


class OperatorFailover(unittest.TestCase):
    def test_training_goes_on_while_the_leader_is_replaced(self):
        with cluster.Namespace("failover") as ns:
            name, generation, before = cluster.train_elastic_job_at_world_4(ns, STEPS)
            leader, _ = cluster.wait_for("one operator leading", cluster.operator_leader,
                                         timeout=60)

            killed_at = time.time()
            cluster.kubectl("delete", "pod", "-n", cluster.OPERATOR_NAMESPACE, leader,
                            "--grace-period=0", "--force", "--wait=false")
            successor, _ = cluster.wait_for(
                "another replica leading",
                lambda: (lambda held: held if held and held[0] != leader else None)(
                    cluster.operator_leader()),
                timeout=120)
            led_at = time.time()
            step_at_lead = cluster.step(ns.job(name))

            # The new leader (every status write from here on is its own) shows the job training
            # on in the same generation: taken up, not re-formed (that numbers the next one).
            cluster.wait_generation_taken_up(ns, name, generation, step_at_lead, successor,
                                             before)

            cluster.assert_ended_undisturbed(ns, name, STEPS, generation, before)
            pause, usual = cluster.longest_pause(ns, name, killed_at, led_at)
            print("e2e operator failover: the leader force-deleted; %s led %.1f s later; the "
                  "longest pause between rank 0's step lines around it %.2f s (%.2f s before "
                  "the kill); generation %d throughout" % (successor, led_at - killed_at, pause,
                                                          usual, generation))


if __name__ == "__main__":
    unittest.main()
