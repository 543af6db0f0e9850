"""scripts/gpu_check's time budget: which steps run, under which limit, and which are skipped.

Run by CTest's python_helpers (tests/CMakeLists.txt) with /usr/bin/python3; the package is the
program scripts/gpu-check.sh runs on a lent GPU machine (standard library only).
"""
import contextlib
import io
import os
import stat
import sys
import tempfile
import unittest

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)

from gpu_check import steps  # noqa: E402
from gpu_check.budget import (DEFAULT_BUDGET_S, RESERVE_S, Budget, Limit,  # noqa: E402
                              budget_from_environment)
from gpu_check.report import Report  # noqa: E402


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def budget_at(total_s, elapsed_s, reserve_s=RESERVE_S):
    clock = FakeClock()
    budget = Budget(total_s, reserve_s, clock=clock)
    clock.now += elapsed_s
    return budget


class BudgetTest(unittest.TestCase):
    def test_a_step_gets_what_it_wants_when_the_budget_has_room(self):
        self.assertEqual(budget_at(540, 0).limit_for(Limit(120)), 120)
        self.assertEqual(budget_at(540, 300).limit_for(Limit(180, 60)), 180)

    def test_a_step_gets_what_is_left_less_the_reserve_when_that_is_less(self):
        # 540 - 500 elapsed - 15 reserve = 25 s left for steps.
        self.assertEqual(budget_at(540, 500).limit_for(Limit(120)), 25)
        self.assertEqual(budget_at(540, 500).limit_for(Limit(240, 25)), 25)

    def test_a_step_is_skipped_when_less_than_its_minimum_would_be_left(self):
        self.assertIsNone(budget_at(540, 500).limit_for(Limit(180, 60)))   # 25 < 60
        self.assertIsNone(budget_at(540, 500).limit_for(Limit(240, 30)))   # 25 < 30
        self.assertIsNone(budget_at(540, 516).limit_for(Limit(120)))       # 9 < 10
        self.assertEqual(budget_at(540, 515).limit_for(Limit(120)), 10)    # exactly the minimum

    def test_the_reserve_is_never_handed_to_a_step(self):
        self.assertIsNone(budget_at(100, 80, reserve_s=15).limit_for(Limit(10, 10)))
        self.assertEqual(budget_at(100, 80, reserve_s=10).limit_for(Limit(10, 10)), 10)
        self.assertIsNone(budget_at(540, 540).limit_for(Limit(1, 1)))
        self.assertIsNone(budget_at(540, 600).limit_for(Limit(1, 1)))  # overrun: still none

    def test_seconds_are_whole_seconds_since_the_start(self):
        budget = budget_at(540, 99.9)
        self.assertEqual(budget.elapsed_s(), 99)
        self.assertEqual(budget.limit_for(Limit(1000)), 540 - 99 - RESERVE_S)

    def test_the_budget_comes_from_the_environment_default_540(self):
        self.assertEqual(budget_from_environment({}), DEFAULT_BUDGET_S)
        self.assertEqual(DEFAULT_BUDGET_S, 540)
        self.assertEqual(budget_from_environment({"LOCKSTEP_GPU_CHECK_BUDGET_S": ""}), 540)
        self.assertEqual(budget_from_environment({"LOCKSTEP_GPU_CHECK_BUDGET_S": "300"}), 300)
        for bad in ("abc", "1.5", "0", "-5"):
            with self.assertRaises(ValueError, msg=bad):
                budget_from_environment({"LOCKSTEP_GPU_CHECK_BUDGET_S": bad})


class PlanTest(unittest.TestCase):
    def test_the_steps_run_in_the_order_a_b_f_g_e_c_d(self):
        self.assertEqual([label for label, _ in steps.plan(selftest=False)],
                         ["a. cuda_kernels_test", "a. comm_nccl_communicator_test",
                          "a. trainer_device_test", "a. kernels_test", "b", "f", "g", "e", "c",
                          "d"])

    def test_the_cpu_selftest_runs_b_and_c_only(self):
        self.assertEqual([label for label, _ in steps.plan(selftest=True)], ["b", "c"])

    def test_each_step_asks_for_the_limits_it_always_had(self):
        self.assertEqual([(p, g, l) for p, g, l in steps.GTEST_PROGRAMS],
                         [("cuda_kernels_test", True, Limit(120, 10)),
                          ("comm_nccl_communicator_test", True, Limit(120, 10)),
                          ("trainer_device_test", True, Limit(180, 10)),
                          ("kernels_test", False, Limit(120, 10))])
        self.assertEqual(steps.TRAIN_RUN, Limit(240, 10))
        self.assertEqual(steps.KILL_TEST, Limit(180, 60))
        self.assertEqual(steps.KERNEL_BENCH, Limit(150, 10))
        self.assertEqual(steps.TRAIN_STEP_BENCH, Limit(60, 10))
        self.assertEqual(steps.TORCH_STEP, Limit(240, 30))
        self.assertEqual(steps.SANITIZER_KERNEL_TESTS, Limit(120, 30))
        self.assertEqual(steps.SANITIZER_TRAINING, Limit(150, 45))

    def test_the_worst_case_of_every_step_together_is_what_the_budget_cuts(self):
        # Documents why the budget matters: asked for in full, the steps want far more than one
        # device-tool call (600 s), so late steps must be cut or skipped.
        wanted = (sum(l.want for _, _, l in steps.GTEST_PROGRAMS) + 2 * steps.TRAIN_RUN.want
                  + steps.KILL_TEST.want + steps.KERNEL_BENCH.want
                  + 2 * 4 * steps.TRAIN_STEP_BENCH.want + steps.TORCH_STEP.want
                  + 2 * steps.SANITIZER_KERNEL_TESTS.want + steps.SANITIZER_TRAINING.want)
        self.assertGreater(wanted, 600)


def fake_program(folder, name, body):
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body + "\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


class StepsUnderTheBudgetTest(unittest.TestCase):
    """A step the budget has no room for is a SKIP row saying so, and its program never runs."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.work = os.path.join(self.tmp.name, "work")
        self.logs = os.path.join(self.tmp.name, "logs")
        os.makedirs(os.path.join(self.work, "bin"))
        os.makedirs(self.logs)
        self.ran = os.path.join(self.tmp.name, "ran")
        self.enterContext(contextlib.redirect_stdout(io.StringIO()))  # the rows as printed

    def context(self, elapsed_s, selftest=False):
        budget = budget_at(540, elapsed_s)
        report = Report(budget, self.logs, os.path.join(self.tmp.name, "out"), device_tool=False)
        return steps.Context(work=self.work, log_dir=self.logs, selftest=selftest, budget=budget,
                             report=report, torch_version="2.11.0")

    def program(self, name):
        # A checkpointed benchmark run says it took a checkpoint, as train_step_bench does.
        fake_program(os.path.join(self.work, "bin"), name,
                     f"echo {name} >> {self.ran}\n"
                     'case "$*" in *--checkpoint-every*) echo "last_checkpoint_step=50" ;; esac')

    def rows(self, ctx):
        return [(row.name, row.state, row.detail) for row in ctx.report.rows]

    def programs_run(self):
        try:
            with open(self.ran) as f:
                return f.read().split()
        except FileNotFoundError:
            return []

    def test_a_gtest_program_is_skipped_with_9_seconds_left(self):
        self.program("cuda_kernels_test")
        ctx = self.context(elapsed_s=540 - RESERVE_S - 9)
        steps.gtest_step(ctx, "cuda_kernels_test", True, Limit(120))
        self.assertEqual(self.rows(ctx), [("a. cuda_kernels_test", "SKIP",
                                           "no time left in the budget")])
        self.assertEqual(self.programs_run(), [])

    def test_a_gtest_program_runs_under_what_is_left_when_that_is_less_than_it_wants(self):
        self.program("cuda_kernels_test")
        ctx = self.context(elapsed_s=540 - RESERVE_S - 30)
        steps.gtest_step(ctx, "cuda_kernels_test", True, Limit(120))
        self.assertEqual(self.programs_run(), ["cuda_kernels_test"])
        with open(os.path.join(self.logs, "cuda_kernels_test.log")) as f:
            self.assertIn("# time limit 30 s;", f.read())

    def test_a_program_not_in_the_bundle_is_skipped_as_not_built(self):
        ctx = self.context(elapsed_s=0)
        steps.gtest_step(ctx, "trainer_device_test", True, Limit(180))
        steps.kernel_bench_step(ctx)
        self.assertEqual(self.rows(ctx), [
            ("a. trainer_device_test", "SKIP", "not in the bundle (not built)"),
            ("e. kernels_cuda_bench", "SKIP", "not in the bundle (not built)")])

    def test_the_kill_test_needs_60_seconds(self):
        ctx = self.context(elapsed_s=540 - RESERVE_S - 59, selftest=True)
        steps.kill_step(ctx)
        self.assertEqual(self.rows(ctx), [("c. kill test, device cpu", "SKIP",
                                           "no time left in the budget")])

    def test_torch_step_needs_30_seconds_and_each_bench_configuration_10(self):
        self.program("train_step_bench")
        ctx = self.context(elapsed_s=540 - RESERVE_S - 29)
        steps.step_time_step(ctx)
        rows = self.rows(ctx)
        self.assertEqual(rows[-2:], [("f. torch_step.py fp32", "SKIP", "no time left in the budget"),
                                     ("f. torch_step.py bf16", "SKIP", "no time left in the budget")])
        self.assertEqual([r[1] for r in rows[:5]], ["PASS"] * 5)  # 29 s >= 10 s: all ran
        # 3 runs + 1 single for each of the 5, + 3 with checkpoints for the 2 in fp32
        self.assertEqual(self.programs_run(), ["train_step_bench"] * 26)

    def test_nothing_of_step_f_runs_with_no_time_left(self):
        self.program("train_step_bench")
        ctx = self.context(elapsed_s=540)
        steps.step_time_step(ctx)
        self.assertEqual(self.rows(ctx), [
            ("f. train_step_bench 784,256,10:64 fp32", "SKIP", "no time left in the budget"),
            ("f. train_step_bench 4096,4096,4096,10:512 fp32", "SKIP",
             "no time left in the budget"),
            ("f. train_step_bench 784,256,10:64 bf16", "SKIP", "no time left in the budget"),
            ("f. train_step_bench 4096,4096,4096,10:512 bf16", "SKIP",
             "no time left in the budget"),
            ("f. train_step_bench 1024,8192,8192,8192,10:4096 bf16", "SKIP",
             "no time left in the budget"),
            ("f. torch_step.py fp32", "SKIP", "no time left in the budget"),
            ("f. torch_step.py bf16", "SKIP", "no time left in the budget")])
        self.assertEqual(self.programs_run(), [])

    def test_the_training_runs_of_step_b_are_skipped_after_their_manifest_is_checked(self):
        fake_program(os.path.join(self.work, "bin"), "lockstep",
                     f'echo "lockstep $1" >> {self.ran}')
        examples = os.path.join(self.work, "examples")
        os.makedirs(examples)
        with open(os.path.join(SCRIPTS, "..", "examples", "fashion-mnist.yaml")) as source, \
                open(os.path.join(examples, "fashion-mnist.yaml"), "w") as copy:
            copy.write(source.read())
        ctx = self.context(elapsed_s=540 - RESERVE_S - 9)
        steps.train_step(ctx)
        self.assertEqual(self.rows(ctx), [
            ("b. lockstep run, device cpu", "SKIP", "no time left in the budget"),
            ("b. lockstep run, device cuda", "SKIP", "no time left in the budget"),
            ("b. lockstep run, device cuda, bf16", "SKIP", "no time left in the budget"),
            ("b. cuda accuracy within 0.5 points of cpu", "SKIP",
             "needs both runs to have succeeded"),
            ("b. bf16 accuracy within 0.5 points of fp32", "SKIP",
             "needs every run to have run")])
        # Three runs, and three more seeds of cuda fp32 and bf16: each manifest is validated.
        self.assertEqual(self.programs_run(), ["lockstep", "validate"] * 9)


if __name__ == "__main__":
    unittest.main()
