"""scripts/gpu_check's report: the summary's text from given rows, and what $OUT receives.

docs/gpu.md and docs/benchmarks.md quote this summary; the device tool brings back $OUT's files
(at most 16 MiB each). Run by CTest's python_helpers (tests/CMakeLists.txt).
"""
import contextlib
import datetime
import io
import os
import sys
import tarfile
import tempfile
import unittest

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)

from gpu_check import report  # noqa: E402
from gpu_check.budget import Budget  # noqa: E402
from gpu_check.report import Report, Row, render_summary  # noqa: E402

NOW = datetime.datetime(2026, 11, 24, 10, 5, 7, tzinfo=datetime.timezone.utc)


class Clock:
    def __init__(self):
        self.now = 50.0

    def __call__(self):
        return self.now


class RenderTest(unittest.TestCase):
    def test_the_summary_text(self):
        rows = [Row("loader: every program's libraries", "PASS", 0,
                    "all resolve (bundle, CUDA, glibc)"),
                Row("a. cuda_kernels_test", "PASS", 12, "29 passed, 0 failed, 2 skipped"),
                Row("b. lockstep run, device cuda", "FAIL", 3, "exit 1: boom"),
                Row("d. compute-sanitizer", "SKIP", 0, "not found")]
        sections = {"f-step-time": "f. table\n  row\n", "b-training": "b. table\n"}
        text = render_summary(rows, ["bundle: x.tar.xz (commit abc)", "host: 6.8.0, 16 cores"],
                              sections, 312, 540, "$OUT/logs.tar.gz", NOW)
        self.assertEqual(text, """\
=============== Lockstep GPU check (2026-11-24T10:05:07Z) ===============
bundle: x.tar.xz (commit abc)
host: 6.8.0, 16 cores

step                                                 state   secs  detail
loader: every program's libraries                    PASS       0  all resolve (bundle, CUDA, glibc)
a. cuda_kernels_test                                 PASS      12  29 passed, 0 failed, 2 skipped
b. lockstep run, device cuda                         FAIL       3  exit 1: boom
d. compute-sanitizer                                 SKIP       0  not found

b. table

f. table
  row

total 312 s of a 540 s budget; 1 step(s) failed; logs: $OUT/logs.tar.gz
""")

    def test_a_long_step_name_is_not_cut(self):
        name = "d. memcheck lockstep run (cuda, 50 steps) and more words to pass 52"
        line = report.table_line(name, "PASS", 7, "ok")
        self.assertEqual(line, name + " PASS       7  ok")


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.logs = os.path.join(self.tmp.name, "work", "logs")
        self.out = os.path.join(self.tmp.name, "out")
        os.makedirs(self.logs)
        self.clock = Clock()
        self.budget = Budget(540, clock=self.clock)
        self.printed = io.StringIO()
        self.enterContext(contextlib.redirect_stdout(self.printed))

    def report(self, device_tool=True):
        return Report(self.budget, self.logs, self.out, device_tool)

    def summary(self):
        with open(os.path.join(self.out, "summary.txt")) as f:
            return f.read()

    def test_each_rows_seconds_are_those_since_the_previous_row(self):
        r = self.report()
        self.clock.now += 4.5
        r.record("a. one", "PASS", "ok")
        self.clock.now += 10.7
        r.record("a. two", "FAIL", "bad")
        r.record("a. three", "SKIP", "no time left in the budget")
        self.assertEqual([(row.name, row.seconds) for row in r.rows],
                         [("a. one", 4), ("a. two", 11), ("a. three", 0)])
        self.assertEqual(r.failures, 1)

    def test_every_row_is_printed_and_published_at_once(self):
        r = self.report()
        r.machine_lines = ["bundle: b"]
        r.record("a. one", "PASS", "3 passed")
        self.assertEqual(self.printed.getvalue(), "gpu-check: [PASS] a. one: 3 passed\n")
        self.assertIn("a. one                                               PASS       0  3 passed\n",
                      self.summary())
        self.assertIn("; 0 step(s) failed; logs: $OUT/logs.tar.gz\n", self.summary())
        r.record("a. two", "FAIL", "exit 1")
        self.assertIn("; 1 step(s) failed; ", self.summary())
        self.assertEqual(sorted(os.listdir(self.out)), ["logs.tar.gz", "summary.txt"])

    def test_the_log_archive_holds_the_logs_folder_and_the_sections(self):
        r = self.report()
        with open(os.path.join(self.logs, "kernels_test.log"), "w") as f:
            f.write("log\n")
        r.add_section("e-kernels", "e. kernels")
        r.record("e. kernels_cuda_bench", "PASS", "measured (table below)")
        with tarfile.open(os.path.join(self.out, "logs.tar.gz")) as tar:
            names = sorted(tar.getnames())
        self.assertEqual(names, ["logs", "logs/kernels_test.log", "logs/report-e-kernels.txt"])
        self.assertIn("\ne. kernels\n\ntotal ", self.summary())

    def test_without_the_device_tool_the_logs_stay_a_folder(self):
        r = self.report(device_tool=False)
        r.record("a. one", "PASS", "ok")
        self.assertEqual(os.listdir(self.out), ["summary.txt"])
        self.assertIn(f"logs: {self.logs}\n", self.summary())

    def test_a_log_over_4_mib_keeps_its_first_and_last_2_mib(self):
        big = os.path.join(self.logs, "big.log")
        head, middle, tail = b"h" * (2 << 20), b"m" * 1000, b"t" * (2 << 20)
        with open(big, "wb") as f:
            f.write(head + middle + tail)
        small = os.path.join(self.logs, "small.log")
        with open(small, "wb") as f:
            f.write(b"s" * (4 << 20))  # exactly 4 MiB: kept whole
        report.cap_large_logs(self.logs)
        with open(big, "rb") as f:
            self.assertEqual(f.read(), head + report.CUT_NOTE + tail)
        self.assertEqual(os.path.getsize(small), 4 << 20)


if __name__ == "__main__":
    unittest.main()
