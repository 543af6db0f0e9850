"""lockstep.progress, the helper a program uses to report progress to its exec agent.

Run by CTest with /usr/bin/python3 (tests/CMakeLists.txt); the agent's side of the format is
tested in tests/worker/agent/progress_file_test.cc and end to end in the exec integration tests.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import warnings

HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
sys.path.insert(0, HELPERS)

from lockstep import progress  # noqa: E402


def read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


class Scalar:
    """Stands in for a one-element tensor: float() works, nothing else."""

    def __init__(self, value):
        self.value = value

    def __float__(self):
        return self.value


class ReporterTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "progress.jsonl")

    def tearDown(self):
        self.dir.cleanup()

    def test_each_report_appends_one_json_line_with_the_given_fields(self):
        reporter = progress.Reporter(self.path)
        self.assertTrue(reporter.enabled)
        before = time.time()
        self.assertTrue(reporter.report(step=10, samples=640, loss=Scalar(0.5), total_steps=100))
        self.assertTrue(reporter.report(step=11))
        reporter.close()
        first, second = read_lines(self.path)
        self.assertEqual(first["step"], 10)
        self.assertEqual(first["samples"], 640)
        self.assertEqual(first["loss"], 0.5)
        self.assertEqual(first["total_steps"], 100)
        self.assertGreaterEqual(first["time"], before)
        self.assertEqual(set(second), {"step", "time"}, "fields not given are absent, not 0")

    def test_compute_time_accumulates_from_blocks_and_explicit_seconds(self):
        reporter = progress.Reporter(self.path)
        with reporter.computing():
            time.sleep(0.02)
        reporter.report(step=1)
        reporter.report(step=2, compute_seconds=1.5)
        reporter.close()
        first, second = read_lines(self.path)
        self.assertGreaterEqual(first["compute_seconds"], 0.02)
        self.assertLess(first["compute_seconds"], 1.0)
        self.assertAlmostEqual(second["compute_seconds"], first["compute_seconds"] + 1.5,
                               places=5)

    def test_a_non_finite_loss_is_left_out(self):
        reporter = progress.Reporter(self.path)
        reporter.report(step=3, loss=float("nan"))
        reporter.report(step=4, loss=float("inf"))
        reporter.close()
        for line in read_lines(self.path):
            self.assertNotIn("loss", line)

    def test_bad_arguments_are_refused_naming_the_argument(self):
        reporter = progress.Reporter(self.path)
        cases = [
            (dict(step=-1), ValueError, "step"),
            (dict(step=1.5), TypeError, "step"),
            (dict(step=True), TypeError, "step"),
            (dict(step=1, samples="10"), TypeError, "samples"),
            (dict(step=1, total_steps=-3), ValueError, "total_steps"),
            (dict(step=1, loss="low"), TypeError, "loss"),
            (dict(step=1, compute_seconds=-2), ValueError, "compute_seconds"),
            (dict(step=1, compute_seconds="x"), TypeError, "compute_seconds"),
        ]
        for kwargs, error, name in cases:
            with self.subTest(kwargs=kwargs):
                with self.assertRaisesRegex(error, name):
                    reporter.report(**kwargs)
        self.assertFalse(os.path.exists(self.path), "nothing written for a refused report")

    def test_lines_of_concurrent_threads_never_interleave(self):
        reporter = progress.Reporter(self.path)

        def run(offset):
            for i in range(200):
                reporter.report(step=offset + i, samples=i, loss=0.25)

        threads = [threading.Thread(target=run, args=(1000 * t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        reporter.close()
        self.assertEqual(len(read_lines(self.path)), 800)

    def test_a_failed_write_warns_once_and_does_not_stop_the_program(self):
        reporter = progress.Reporter(os.path.join(self.dir.name, "missing", "progress.jsonl"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertFalse(reporter.report(step=1))
            self.assertFalse(reporter.report(step=2))
        self.assertEqual(len(caught), 1)
        self.assertIn("missing", str(caught[0].message))
        self.assertFalse(reporter.enabled)


    def test_a_child_forked_while_a_report_is_written_can_report(self):
        reporter = progress.Reporter(self.path)
        with reporter._lock:  # another thread is inside report() at the fork
            pid = os.fork()
            if pid == 0:
                signal.alarm(10)  # a deadlocked child dies instead of hanging the test
                os._exit(0 if reporter.report(step=1) else 1)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)


class ModuleTest(unittest.TestCase):
    def run_python(self, code, env_path):
        env = {k: v for k, v in os.environ.items() if k != progress.ENVIRONMENT_VARIABLE}
        if env_path is not None:
            env[progress.ENVIRONMENT_VARIABLE] = env_path
        env["PYTHONPATH"] = HELPERS
        # -S: no site-packages, so the helper imports with the standard library alone.
        return subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True,
                              text=True, timeout=60)

    def test_reports_go_to_the_file_the_agent_names(self):
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "progress.jsonl")
            result = self.run_python(
                "from lockstep import progress\n"
                "assert progress.enabled()\n"
                "progress.report(step=7, samples=448, total_steps=70)\n", path)
            self.assertEqual(result.returncode, 0, result.stderr)
            (line,) = read_lines(path)
            self.assertEqual((line["step"], line["samples"], line["total_steps"]), (7, 448, 70))

    def test_outside_lockstep_reports_do_nothing(self):
        result = self.run_python(
            "from lockstep import progress\n"
            "assert not progress.enabled()\n"
            "assert progress.report(step=1, loss=0.5) is False\n"
            "class Device:\n"
            "    def __float__(self): raise AssertionError('waited for the device')\n"
            "assert progress.report(step=2, loss=Device()) is False\n", None)
        self.assertEqual(result.returncode, 0, result.stderr)


if __name__ == "__main__":
    unittest.main()
