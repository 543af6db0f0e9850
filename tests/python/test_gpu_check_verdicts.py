"""scripts/gpu_check's reading of what the programs under test print, and the rule for each row.

The outputs below are the programs' formats: gtest's XML report, `lockstep run --summary` JSON
(cli/summary.cc), train_step_bench's and torch_step.py's measurement lines, compute-sanitizer's
summaries. Run by CTest's python_helpers (tests/CMakeLists.txt).
"""
import os
import sys
import tempfile
import unittest

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)

from gpu_check import verdicts  # noqa: E402
from gpu_check.manifest import ManifestError, rewrite_manifest  # noqa: E402

GTEST_XML = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5" failures="{failures}" disabled="0" errors="0" name="AllTests">
  <testsuite name="CudaKernels" tests="5">
    <testcase name="Gemm" status="run" result="completed" classname="CudaKernels" />
    <testcase name="Scale" status="run" result="completed" classname="CudaKernels" />
    <testcase name="Softmax" status="run" result="completed" classname="CudaKernels">{failure}
    </testcase>
    <testcase name="NoDevice" status="run" result="skipped" classname="CudaDevice">
      <skipped message="tests/kernels/cuda_kernels_test.cc:40&#x0A;{skip_reason}" />
    </testcase>
    <testcase name="NoDeviceToo" status="run" result="skipped" classname="CudaDevice">
      <skipped message="tests/kernels/cuda_kernels_test.cc:50&#x0A;{skip_reason}" />
    </testcase>
  </testsuite>
</testsuites>
"""
FAILURE = '<failure message="x.cc:1&#x0A;Expected equality" type=""></failure>'


class GtestTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def xml(self, failure="", skip_reason="refuses without a device"):
        path = os.path.join(self.tmp.name, "report.xml")
        with open(path, "w") as f:
            f.write(GTEST_XML.format(failures=1 if failure else 0, failure=failure,
                                     skip_reason=skip_reason))
        return path

    def test_counts_passed_failed_and_skipped_with_the_skip_reasons(self):
        summary = verdicts.gtest_summary(self.xml(skip_reason="the refusal is tested elsewhere"))
        self.assertEqual(summary.text, "3 passed, 0 failed, 2 skipped "
                                       "(2x the refusal is tested elsewhere)")
        self.assertFalse(summary.failed)
        self.assertFalse(summary.skipped_no_gpu)

    def test_names_the_failed_tests(self):
        summary = verdicts.gtest_summary(self.xml(failure=FAILURE))
        self.assertEqual(summary.text, "2 passed, 1 failed, 2 skipped (2x refuses without a "
                                       "device); failed: CudaKernels.Softmax")
        self.assertTrue(summary.failed)

    def test_a_missing_or_broken_report_is_a_failure(self):
        missing = verdicts.gtest_summary(os.path.join(self.tmp.name, "none.xml"))
        self.assertEqual(missing.text,
                         "no test report (FileNotFoundError): crashed or ran out of time?")
        self.assertTrue(missing.failed)
        broken = os.path.join(self.tmp.name, "broken.xml")
        with open(broken, "w") as f:
            f.write("<testsuites><testcase")
        self.assertEqual(verdicts.gtest_summary(broken).text,
                         "no test report (ParseError): crashed or ran out of time?")

    def test_a_skip_for_lack_of_a_gpu_is_noticed(self):
        for reason in ("no CUDA device", "No GPU here", "no usable device found",
                       "runs without a GPU"):
            self.assertTrue(verdicts.gtest_summary(self.xml(skip_reason=reason)).skipped_no_gpu,
                            reason)

    def test_a_gpu_program_skipping_for_lack_of_a_gpu_fails_on_the_gpu_machine(self):
        summary = verdicts.gtest_summary(self.xml(skip_reason="no CUDA device"))
        self.assertEqual(verdicts.gtest_verdict(0, 120, summary, True, True, ""),
                         ("FAIL", "GPU tests skipped although this machine has a GPU: 3 passed, "
                                  "0 failed, 2 skipped (2x no CUDA device)"))
        # kernels_test (the CPU kernels) may skip so.
        self.assertEqual(verdicts.gtest_verdict(0, 120, summary, False, True, "")[0], "PASS")

    def test_rows_for_pass_failure_crash_and_timeout(self):
        ok = verdicts.gtest_summary(self.xml(skip_reason="x"))
        bad = verdicts.gtest_summary(self.xml(failure=FAILURE, skip_reason="x"))
        missing = verdicts.gtest_summary(os.path.join(self.tmp.name, "none.xml"))
        self.assertEqual(verdicts.gtest_verdict(0, 120, ok, True, True, ""),
                         ("PASS", "3 passed, 0 failed, 2 skipped (2x x)"))
        self.assertEqual(verdicts.gtest_verdict(1, 120, bad, True, True, "")[1],
                         "exit 1: 2 passed, 1 failed, 2 skipped (2x x); failed: "
                         "CudaKernels.Softmax")
        self.assertEqual(verdicts.gtest_verdict(0, 120, bad, True, True, "")[0], "FAIL")
        self.assertEqual(verdicts.gtest_verdict(3, 120, ok, True, True, "")[0], "FAIL")
        self.assertEqual(
            verdicts.gtest_verdict(139, 120, missing, True, False, "$ cmd\n[ RUN ] A.B\nboom\n"),
            ("FAIL", "exit 139: no test report (FileNotFoundError): crashed or ran out of time?; "
                     "last line: boom"))
        self.assertEqual(verdicts.gtest_verdict(124, 75, ok, True, True, ""),
                         ("FAIL", "ran out of its 75 s: 3 passed, 0 failed, 2 skipped (2x x)"))


CPU = {"job": "fashion-mlp", "status": "succeeded", "steps": 2000, "final_loss": 0.3834,
       "eval_accuracy": 0.8513, "samples_per_second": 19207.4, "restarts": 0,
       "resumed_from_step": None, "wall_seconds": 7.52}
CUDA = dict(CPU, final_loss=0.3802, eval_accuracy=0.8503, samples_per_second=298072.0,
            wall_seconds=2.04)


class TrainingTest(unittest.TestCase):
    def test_cuda_within_half_a_point_of_cpu_passes(self):
        self.assertEqual(verdicts.accuracy_verdict(CPU, CUDA),
                         ("PASS", "cuda accuracy 0.8503 vs cpu 0.8513 (within 0.5 points)"))
        self.assertEqual(verdicts.accuracy_verdict(CPU, dict(CUDA, eval_accuracy=0.8464))[0],
                         "PASS")
        self.assertEqual(verdicts.accuracy_verdict(CPU, dict(CUDA, eval_accuracy=0.95))[0],
                         "PASS")  # better than cpu is fine

    def test_cuda_more_than_half_a_point_below_cpu_fails(self):
        self.assertEqual(verdicts.accuracy_verdict(CPU, dict(CUDA, eval_accuracy=0.8462)),
                         ("FAIL", "cuda accuracy 0.8462 is more than 0.5 points below cpu's "
                                  "0.8513"))

    def test_the_comparison_needs_both_runs_to_have_succeeded(self):
        skip = ("SKIP", "needs both runs to have succeeded")
        self.assertEqual(verdicts.accuracy_verdict(CPU, {}), skip)  # the self-test: cpu only
        self.assertEqual(verdicts.accuracy_verdict(CPU, dict(CUDA, status="failed")), skip)
        self.assertEqual(verdicts.accuracy_verdict({}, CUDA), skip)

    def test_succeeded_runs_without_an_accuracy_fail_the_comparison(self):
        self.assertEqual(verdicts.accuracy_verdict(CPU, dict(CUDA, eval_accuracy=None))[0], "FAIL")

    def test_the_side_by_side_table(self):
        bf16 = dict(CUDA, eval_accuracy=0.8487)
        self.assertEqual(verdicts.training_section([("cpu", CPU), ("cuda", CUDA),
                                                    ("cuda bf16", bf16)]),
                         "b. Fashion-MNIST, examples/fashion-mnist.yaml, 1 worker, batch 64:\n"
                         "                           cpu        cuda   cuda bf16\n"
                         "  status             succeeded   succeeded   succeeded\n"
                         "  steps                   2000        2000        2000\n"
                         "  final loss            0.3834      0.3802      0.3802\n"
                         "  test accuracy         0.8513      0.8503      0.8487\n"
                         "  samples/s              19207      298072      298072\n"
                         "  wall s                   7.5         2.0         2.0\n")
        self.assertIn("  test accuracy         0.8513           -\n",
                      verdicts.training_section([("cpu", CPU), ("cuda", {})]))

    def test_bf16_is_compared_with_fp32_under_their_names(self):
        self.assertEqual(verdicts.accuracy_verdict(CUDA, dict(CUDA, eval_accuracy=0.8440),
                                                   ("cuda fp32", "cuda bf16")),
                         ("FAIL", "cuda bf16 accuracy 0.8440 is more than 0.5 points below "
                                  "cuda fp32's 0.8503"))

    def test_bf16_is_judged_by_its_mean_over_seeds(self):
        fp32 = [dict(CUDA, eval_accuracy=a) for a in (0.8503, 0.8470, 0.8520, 0.8491)]
        bf16 = [dict(CUDA, eval_accuracy=a) for a in (0.8447, 0.8499, 0.8480, 0.8530)]
        self.assertEqual(verdicts.mean_accuracy_verdict(fp32, bf16, ("cuda fp32", "cuda bf16")),
                         ("PASS", "cuda bf16 mean 0.8489 vs cuda fp32 0.8496 over 4 seeds "
                                  "(cuda fp32: 0.8503 0.8470 0.8520 0.8491; cuda bf16: 0.8447 "
                                  "0.8499 0.8480 0.8530)"))
        low = [dict(CUDA, eval_accuracy=a) for a in (0.8400, 0.8440, 0.8450, 0.8430)]
        self.assertEqual(verdicts.mean_accuracy_verdict(fp32, low, ("cuda fp32", "cuda bf16"))[0],
                         "FAIL")
        self.assertEqual(verdicts.mean_accuracy_verdict(fp32, bf16[:3] + [{}], ("a", "b")),
                         ("SKIP", "needs every run to have run"))
        # A run that failed fails the comparison: it is not a run that had no time.
        self.assertEqual(verdicts.mean_accuracy_verdict(fp32, bf16[:3] + [{"status": "failed"}],
                                                        ("a", "b")),
                         ("FAIL", "1 of the 8 runs did not succeed (failed)"))

    def test_a_checkpointed_bench_run_must_have_taken_a_checkpoint(self):
        self.assertTrue(verdicts.checkpoints_taken(
            "lockstep-cuda-ckpt step_ms=1 checkpoint_every=50 last_checkpoint_step=350\n"))
        self.assertFalse(verdicts.checkpoints_taken(
            "lockstep-cuda-ckpt step_ms=1 checkpoint_every=50 last_checkpoint_step=-1\n"))
        self.assertFalse(verdicts.checkpoints_taken("lockstep-cuda-ckpt step_ms=1\n"))

    def test_a_run_row_says_the_accuracy_or_why_it_failed(self):
        self.assertEqual(verdicts.train_run_verdict(0, CUDA, ""), ("PASS", "accuracy 0.8503"))
        self.assertEqual(verdicts.train_run_verdict(0, {}, ""), ("PASS", "accuracy ?"))
        self.assertEqual(verdicts.train_run_verdict(verdicts.NO_TIME_LEFT, {}, ""),
                         ("SKIP", "no time left in the budget"))
        self.assertEqual(verdicts.train_run_verdict(1, {}, "worker 0: error: out of memory"),
                         ("FAIL", "exit 1: worker 0: error: out of memory"))

    def test_summary_fields_print_as_the_script_always_printed_them(self):
        self.assertEqual(verdicts.summary_field(CPU, "steps"), "2000")
        self.assertEqual(verdicts.summary_field(CPU, "resumed_from_step"), "None")
        self.assertEqual(verdicts.summary_field(CPU, "recovery_seconds"), "?")

    def test_a_missing_or_broken_summary_reads_as_empty(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(verdicts.load_run_summary(os.path.join(tmp, "none.json")), {})
            path = os.path.join(tmp, "summary.json")
            with open(path, "w") as f:
                f.write('{"status": "succ')
            self.assertEqual(verdicts.load_run_summary(path), {})
            with open(path, "w") as f:
                f.write('{"status": "succeeded", "steps": 2000}\n')
            self.assertEqual(verdicts.load_run_summary(path),
                             {"status": "succeeded", "steps": 2000})


class FailureReasonTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.dir = self.tmp.name

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def test_a_workers_error_comes_first(self):
        self.write("validate.log", "valid\n")
        self.write("run/worker-0.log", "step 10\nFATAL: cudaMalloc failed\nmore\n")
        self.write("lockstep-run.log", "lockstep: job failed\n")
        self.assertEqual(verdicts.failure_reason(self.dir), "FATAL: cudaMalloc failed")

    def test_then_locksteps_own_report_of_the_failure_then_its_last_line(self):
        self.write("lockstep-run.log", "starting\nlockstep: worker 0 failed (exit 1)\nbye\n")
        self.assertEqual(verdicts.failure_reason(self.dir), "lockstep: worker 0 failed (exit 1)")
        self.write("lockstep-run.log", "starting\nbye\n")
        self.assertEqual(verdicts.failure_reason(self.dir), "bye")

    def test_nothing_to_read_is_an_empty_reason_and_long_lines_are_cut(self):
        self.assertEqual(verdicts.failure_reason(self.dir), "")
        self.write("make-manifest.log", "error: " + "x" * 400 + "\n")
        self.assertEqual(len(verdicts.failure_reason(self.dir)), 300)


class KillTestTest(unittest.TestCase):
    def test_the_step_count_is_about_25_seconds_at_step_bs_rate_in_whole_intervals(self):
        # cpu: 2000 steps in 7.52 s = 266 steps/s -> 6648 -> 6600.
        self.assertEqual(verdicts.kill_test_steps(CPU), 6600)
        # cuda: 2000 steps in 2.04 s -> 24509 -> at most 20000.
        self.assertEqual(verdicts.kill_test_steps(CUDA), 20000)
        # A slow device: at least 1000.
        self.assertEqual(verdicts.kill_test_steps({"steps": 100, "wall_seconds": 10}), 1000)

    def test_without_a_rate_the_kill_test_runs_the_most_steps(self):
        for summary in ({}, {"steps": None, "wall_seconds": 1.0}, {"steps": 10, "wall_seconds": 0},
                        {"steps": 0, "wall_seconds": 5.0}):
            self.assertEqual(verdicts.kill_test_steps(summary), 20000, summary)

    RESUMED = {"status": "succeeded", "steps": 6600, "resumed_from_step": 600, "restarts": 1}

    def test_a_killed_worker_replaced_and_finishing_at_the_step_count_passes(self):
        self.assertEqual(verdicts.kill_test_verdict(4242, "", 0, self.RESUMED, 6600, ""),
                         ("PASS", "steps 6600/6600, resumed_from_step 600, restarts 1, exit 0"))

    def test_anything_less_fails_saying_what_was_wanted(self):
        want = " (want steps 6600, resumed_from_step > 0, restarts >= 1, exit 0)"
        for change, status in (({"steps": 6400}, 0), ({"resumed_from_step": 0}, 0),
                               ({"resumed_from_step": None}, 0), ({"restarts": 0}, 0),
                               ({}, 1)):
            state, detail = verdicts.kill_test_verdict(4242, "", status,
                                                       dict(self.RESUMED, **change), 6600, "")
            self.assertEqual(state, "FAIL", change)
            self.assertTrue(detail.endswith(want), detail)

    def test_nothing_killed_fails_saying_why(self):
        self.assertEqual(
            verdicts.kill_test_verdict(None, "", 0, {"steps": 6600}, 6600, "bye"),
            ("FAIL", "nothing killed: the run ended before a checkpoint was committed; steps "
                     "6600/6600, resumed_from_step ?, restarts ?, exit 0; bye"))
        self.assertTrue(verdicts.kill_test_verdict(None, "no lockstep-worker process found", 0,
                                                   {}, 6600, "")[1].startswith(
            "nothing killed: no lockstep-worker process found; "))

    def test_the_section_names_the_kill_and_the_checkpoints_left(self):
        figures = verdicts.kill_test_figures(self.RESUMED, 6600, 0)
        self.assertEqual(
            verdicts.kill_test_section("cuda", 6600, 4242, "step-200", "", figures,
                                       ["step-6200", "step-6400", "step-6600"]),
            "c. kill test (cuda, 6600 steps, checkpoints every 200):\n"
            "  killed worker 4242 after step-200 was committed; steps 6600/6600, "
            "resumed_from_step 600, restarts 1, exit 0\n"
            "  checkpoints left: step-6200 step-6400 step-6600\n")
        self.assertIn("  killed nothing (no checkpoint was committed while the run lasted); ",
                      verdicts.kill_test_section("cpu", 1000, None, "", "", figures, []))


class BenchmarkTest(unittest.TestCase):
    KERNELS_LOG = ("$ /tmp/lockstep-gpu/bin/kernels_cuda_bench\n# time limit 150 s; "
                   "LD_LIBRARY_PATH=x\ndevice: NVIDIA H100 (sm_90, 132 SMs, 79.1 GiB)\n\n"
                   "kernel                              MiB moved\nScale                  93.9%\n")

    def test_the_kernel_table_is_reported_as_printed_without_the_command_lines(self):
        self.assertEqual(verdicts.kernel_bench_section(self.KERNELS_LOG),
                         "e. kernels_cuda_bench (goal: each kernel >= 85% of the "
                         "device-to-device copy):\n"
                         "  device: NVIDIA H100 (sm_90, 132 SMs, 79.1 GiB)\n  \n"
                         "  kernel                              MiB moved\n"
                         "  Scale                  93.9%\n")

    def test_the_kernel_bench_fails_on_an_exit_status_or_no_device(self):
        self.assertEqual(verdicts.kernel_bench_verdict(0, self.KERNELS_LOG),
                         ("PASS", "measured (table below)"))
        self.assertEqual(verdicts.kernel_bench_verdict(124, ""), ("FAIL", "exit 124 (see its log)"))
        self.assertEqual(verdicts.kernel_bench_verdict(
            0, "kernels_cuda_bench: no CUDA device in this process; nothing to measure\n"),
            ("FAIL", "it saw no CUDA device"))

    BENCH = ("$ train_step_bench --device cuda\n# time limit 60 s\n"
             "lockstep-cuda layers=784,256,10 batch=64 step_ms=0.1410 samples_per_s=453900 "
             "loss=2.2 gather_ms_one_thread=0.0120\n")

    def test_the_single_thread_run_is_relabelled(self):
        self.assertEqual(verdicts.single_thread_lines(self.BENCH).splitlines()[2].split()[0],
                         "lockstep-cuda-1thread")

    def test_a_bench_row_lists_the_step_times_of_the_threaded_runs(self):
        text = self.BENCH + self.BENCH.replace("0.1410", "0.1390") + \
            verdicts.single_thread_lines(self.BENCH.replace("0.1410", "0.2000"))
        self.assertEqual(verdicts.bench_detail(text), "step_ms=0.1410 step_ms=0.1390")

    def test_the_step_time_table_shows_median_and_spread_per_implementation(self):
        lines = [
            "lockstep-cuda layers=784,256,10 batch=64 step_ms=0.1410 gather_ms_one_thread=0.0120",
            "lockstep-cuda layers=784,256,10 batch=64 step_ms=0.1390 gather_ms_one_thread=0.0110",
            "lockstep-cuda layers=784,256,10 batch=64 step_ms=0.1450 gather_ms_one_thread=0.0130",
            "lockstep-cuda-1thread layers=784,256,10 batch=64 step_ms=0.1500 "
            "gather_ms_one_thread=0.0500",
            "lockstep-cuda-ckpt layers=784,256,10 batch=64 step_ms=0.1520 checkpoint_every=50",
            "torch-eager layers=784,256,10 batch=64 step_ms=1.1510 mean_ms=1.2 steps=300",
            "torch-compile layers=784,256,10 batch=64 error=RuntimeError: no triton",
            "torch-eager layers=4096,4096,4096,10 batch=512 step_ms=2.3610 mean_ms=2.4 steps=300",
            "torch-eager layers=4096,4096,4096,10 batch=512 precision=bf16 step_ms=0.4000 "
            "mean_ms=0.41 steps=300",
            "lockstep-cuda layers=4096,4096,4096,10 batch=512 precision=bf16 step_ms=0.3000",
        ]
        section = verdicts.step_time_section(lines).splitlines()
        self.assertEqual(section[0], "f. training step, ms (TF32 off; bf16: autocast's rounding "
                                     "points; SGD momentum 0.9). torch: median of 300 per-step CUDA")
        self.assertEqual(section[5].split(), ["layers", "batch", "prec", "lockstep-cuda",
                                              "lockstep-cuda-1thread", "lockstep-cuda-ckpt",
                                              "torch-eager", "torch-compile", "gather"])
        self.assertEqual(section[6],
                         "  784,256,10                      64  fp32"
                         + "0.1410 (0.139-0.145)".rjust(26) + "0.1500".rjust(26)
                         + "0.1520".rjust(26) + "1.1510".rjust(26) + "-".rjust(26)
                         + "0.0120 (0.011-0.013)".rjust(22))
        self.assertEqual(section[7].split(), ["4096,4096,4096,10", "512", "fp32", "-", "-", "-",
                                              "2.3610", "-", "-"])
        # The same model in bf16 is a row of its own.
        self.assertEqual(section[8].split(), ["4096,4096,4096,10", "512", "bf16", "0.3000", "-",
                                              "-", "0.4000", "-", "-"])
        self.assertEqual(len(section), 9)

    def test_no_figures_says_so(self):
        self.assertEqual(verdicts.step_time_section([]).splitlines()[-1], "  (no figures)")

    def test_torch_step_counts_its_figures_and_errors(self):
        log = ("$ python3 torch_step.py\n# time limit 240 s\n"
               "torch-eager layers=784,256,10 batch=64 step_ms=1.1 mean_ms=1.2 steps=300\n"
               "torch-compile layers=784,256,10 batch=64 error=RuntimeError\n"
               "torch-eager layers=4096 batch=512 step_ms=2.3 mean_ms=2.4 steps=300\n")
        self.assertEqual(verdicts.torch_step_verdict(0, log), ("PASS", "2 figures; 1 errors"))
        self.assertEqual(verdicts.torch_step_verdict(1, log + "RuntimeError: no CUDA\n"),
                         ("FAIL", "exit 1: RuntimeError: no CUDA"))


class ExecTest(unittest.TestCase):
    def test_the_helpers_tests_pass_when_some_ran_and_all_passed(self):
        self.assertEqual(verdicts.unittest_verdict(0, "...\nRan 41 tests in 3.2s\n\nOK (skipped=2)\n"),
                         ("PASS", "41 tests, 2 skipped"))
        self.assertEqual(verdicts.unittest_verdict(0, "\nRan 0 tests in 0.0s\n\nOK\n"),
                         ("FAIL", "no test ran"))
        self.assertEqual(verdicts.unittest_verdict(1, "Ran 3 tests in 1s\n\nFAILED (failures=1)\n"),
                         ("FAIL", "exit 1: 3 tests, 0 skipped; FAILED (failures=1)"))

    def test_the_goodput_row_is_read_from_the_benchmarks_table(self):
        text = ("exec-in-place  undisturbed   24.0 s  disturbed   25.5 s  kills  3\n\n"
                "system          goodput  lost/failure s  kills  lost at a kill s (median)\n"
                "exec-in-place      0.94            0.50      3                       0.31\n"
                "               helper's account, mean of 3 rank-recoveries: rendezvous 0.1 s\n")
        self.assertEqual(verdicts.goodput_verdict(0, text),
                         ("PASS", "exec-in-place goodput 0.94, lost/failure 0.50 s, kills 3"))
        self.assertEqual(verdicts.goodput_verdict(1, text + "Traceback: boom\n"),
                         ("FAIL", "exit 1: Traceback: boom"))
        self.assertEqual(verdicts.goodput_verdict(0, "no table\n")[0], "FAIL")


class SanitizerTest(unittest.TestCase):
    MEMCHECK = "========= COMPUTE-SANITIZER\n...\n========= ERROR SUMMARY: 0 errors\n"
    RACECHECK = "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"

    def test_memcheck_and_racecheck_summaries_are_summed_over_processes(self):
        self.assertEqual(verdicts.sanitizer_errors([self.MEMCHECK, self.RACECHECK]), (0, 2))
        self.assertEqual(verdicts.sanitizer_errors([
            "========= ERROR SUMMARY: 3 errors\n",
            "========= RACECHECK SUMMARY: 5 hazards displayed (2 errors, 3 warnings)\n"]), (5, 2))
        self.assertEqual(verdicts.sanitizer_errors(["========= ERROR SUMMARY: 1 error\n"]), (1, 1))

    def test_rows(self):
        self.assertEqual(verdicts.sanitizer_verdict(0, 120, [self.MEMCHECK, self.MEMCHECK]),
                         ("PASS", "ERROR SUMMARY: 0 errors (2 processes)"))
        self.assertEqual(verdicts.sanitizer_verdict(1, 120, ["ERROR SUMMARY: 4 errors"]),
                         ("FAIL", "ERROR SUMMARY: 4 errors (1 processes)"))
        self.assertEqual(verdicts.sanitizer_verdict(1, 120, [self.MEMCHECK]),
                         ("FAIL", "ERROR SUMMARY: 0 errors, but exit 1"))
        self.assertEqual(verdicts.sanitizer_verdict(0, 120, ["unsupported\n"]),
                         ("FAIL", "exit 0 and no ERROR SUMMARY line (unsupported here? see its "
                                  "log)"))
        self.assertEqual(verdicts.sanitizer_verdict(124, 95, ["ERROR SUMMARY: 2 errors"]),
                         ("FAIL", "ran out of its 95 s (narrow it with --gtest_filter); 2 errors "
                                  "so far"))

    def test_the_version_is_read_from_its_banner(self):
        self.assertEqual(verdicts.sanitizer_version(
            "NVIDIA (R) Compute Sanitizer\nCopyright (c) 2020-2025\nVersion 2025.2.1.0 "
            "(build 36104386)\n"), "2025.2.1.0")
        self.assertEqual(verdicts.sanitizer_version(""), "")


class LoaderTest(unittest.TestCase):
    def test_rows(self):
        self.assertEqual(verdicts.loader_verdict([], [], False),
                         ("PASS", "all resolve (bundle, CUDA, glibc)"))
        self.assertEqual(verdicts.loader_verdict([], ["libnccl.so.2"], False),
                         ("FAIL", "not found on this machine: libnccl.so.2"))
        self.assertEqual(verdicts.loader_verdict([], ["libnccl.so.2"], True)[0], "PASS")
        problems = [f"lockstep: libx{i}.so => not found" for i in range(4)]
        self.assertEqual(verdicts.loader_verdict(problems, [], True),
                         ("FAIL", "4 unresolved: lockstep: libx0.so => not found;lockstep: "
                                  "libx1.so => not found;lockstep: libx2.so => not found"))


class ManifestTest(unittest.TestCase):
    def example(self):
        with open(os.path.join(SCRIPTS, "..", "examples", "fashion-mnist.yaml")) as f:
            return f.read()

    def test_the_example_is_rewritten_for_the_bundle(self):
        text = rewrite_manifest(self.example(), "/tmp/w", "cuda", None, 12345)
        self.assertEqual(text.count("file:///tmp/w/data/fashion-mnist/"), 4)
        self.assertNotIn("/usr/share/datasets", text)
        self.assertIn("\n  replicas: 1\n", text)
        self.assertIn("\n    device: cuda\n", text)
        self.assertIn("\n    steps: 2000\n", text)  # the example's own
        self.assertIn("\n  metrics: {port: 12345}\n", text)
        self.assertNotIn("checkpoint", text)
        self.assertIn("restartPolicy: Never", text)

    def test_the_kill_tests_manifest_checkpoints_and_restarts(self):
        text = rewrite_manifest(self.example(), "/tmp/w", "cpu", 6600, 1, checkpoint=True)
        self.assertIn("\n    steps: 6600\n", text)
        self.assertIn("\n    restartPolicy: OnFailure\n    backoffLimit: 3\n", text)
        self.assertTrue(text.endswith("\n  checkpoint: {uri: file:///tmp/w/ckpt, intervalSteps: "
                                      "200, keep: 3, async: true}\n"))

    def test_a_bf16_run_names_its_precision_beside_the_device(self):
        text = rewrite_manifest(self.example(), "/tmp/w", "cuda", None, 1, precision="bf16")
        self.assertIn("\n    device: cuda\n    precision: bf16\n", text)

    def test_another_seed_replaces_the_examples(self):
        text = rewrite_manifest(self.example(), "/tmp/w", "cuda", None, 1, seed=3)
        self.assertIn("\n    seed: 3\n", text)
        self.assertNotIn("seed: 1", text)

    def test_an_example_that_changed_under_us_is_refused(self):
        with self.assertRaisesRegex(ManifestError, "matched 0 times"):
            rewrite_manifest(self.example().replace("device: cpu", "# no device"), "/w", "cuda",
                             None, 1)
        with self.assertRaisesRegex(ManifestError, "matched 2 times"):
            rewrite_manifest(self.example() + "    steps: 5\n", "/w", "cuda", 100, 1)


if __name__ == "__main__":
    unittest.main()
