"""scripts/gpu_check end to end, on stand-ins for the bundle's programs and the GPU machine's
tools, and its process handling: limits that stop a program with everything it started.

The stand-ins are small Python scripts with the real programs' interfaces: `lockstep run` (with
a worker process that commits a checkpoint and is restarted after a SIGKILL), gtest programs that
write an XML report, the benchmarks' measurement lines, nvidia-smi and compute-sanitizer. The
real programs on a real GPU are for scripts/gpu-check.sh on a lent machine; this checks the
driver's flow, order, rows, summary, $OUT and exit status. Run by CTest's python_helpers.
"""
import contextlib
import io
import os
import stat
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
import unittest
from unittest import mock

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)

from gpu_check import machine, main, process  # noqa: E402

PYTHON = "#!/usr/bin/env python3\n"

FAKE_LOCKSTEP = PYTHON + textwrap.dedent('''
    import json, os, re, subprocess, sys, time
    here = os.path.dirname(os.path.abspath(__file__))
    command = sys.argv[1]
    if command == "version":
        print("lockstep (stand-in)")
        sys.exit(0)
    if command == "validate":
        sys.exit(0 if os.path.isfile(sys.argv[2]) else 1)
    assert command == "run", command
    manifest, args = sys.argv[2], sys.argv[3:]
    summary_path = args[args.index("--summary") + 1]
    log_dir = args[args.index("--log-dir") + 1]
    text = open(manifest).read()
    steps = int(re.search(r"^\\s+steps: (\\d+)", text, re.M).group(1))
    device = re.search(r"^\\s+device: (\\w+)", text, re.M).group(1)
    ckpt = re.search(r"checkpoint: [{]uri: file://([^,]+),", text)
    os.makedirs(log_dir, exist_ok=True)
    copy = os.path.join(log_dir, "manifest.json")
    with open(copy, "w") as f:
        json.dump({"ckpt": ckpt.group(1) if ckpt else None, "steps": steps}, f)
    restarts, resumed, status = 0, None, "succeeded"
    while True:
        with open(os.path.join(log_dir, "worker-0.log"), "a") as log:
            worker = subprocess.run([os.path.join(here, "lockstep-worker"), "train",
                                     "--manifest", copy], stdout=log, stderr=log)
        if worker.returncode == 0:
            break
        if not ckpt or restarts == 3:
            status = "failed"
            break
        restarts += 1
        resumed = max(int(n.split("-")[1]) for n in os.listdir(ckpt.group(1)))
    accuracy = {"cpu": 0.8513, "cuda": 0.8503}[device]
    with open(summary_path, "w") as f:
        json.dump({"status": status, "steps": steps, "final_loss": 0.38,
                   "eval_accuracy": accuracy, "samples_per_second": 20000.0,
                   "restarts": restarts, "resumed_from_step": resumed,
                   "wall_seconds": 7.52}, f)
    print("lockstep: job " + status)
    sys.exit(0 if status == "succeeded" else 1)
''')

# Commits a checkpoint, then trains on long enough to be killed; restarted, finishes at once.
FAKE_WORKER = PYTHON + textwrap.dedent('''
    import json, os, sys, time
    manifest = json.load(open(sys.argv[sys.argv.index("--manifest") + 1]))
    ckpt = manifest["ckpt"]
    if ckpt:
        os.makedirs(ckpt, exist_ok=True)
        if not os.listdir(ckpt):
            os.makedirs(os.path.join(ckpt, ".partial-200"))
            os.rename(os.path.join(ckpt, ".partial-200"), os.path.join(ckpt, "step-200"))
            time.sleep(5)
        else:
            os.makedirs(os.path.join(ckpt, "step-%d" % manifest["steps"]))
    print("trained")
''')

FAKE_GTEST = PYTHON + textwrap.dedent('''
    import sys
    for arg in sys.argv[1:]:
        if arg.startswith("--gtest_output=xml:"):
            with open(arg[len("--gtest_output=xml:"):], "w") as f:
                f.write('<testsuites><testsuite name="S">'
                        '<testcase name="A" classname="S" result="completed"/>'
                        '<testcase name="B" classname="S" result="completed"/>'
                        '</testsuite></testsuites>')
    print("[  PASSED  ] 2 tests.")
''')

FAKE_KERNEL_BENCH = PYTHON + textwrap.dedent('''
    print("device: Stand-in GPU (sm_90, 132 SMs, 79.1 GiB), 67108864 elements per array")
    print("Scale                                   93.9%")
''')

FAKE_TRAIN_STEP_BENCH = PYTHON + textwrap.dedent('''
    import os, sys
    a = sys.argv
    one = os.environ.get("LOCKSTEP_GATHER_THREADS") == "1"
    ckpt = "-ckpt" if "--checkpoint-every" in a else ""
    end = " last_checkpoint_step=350" if ckpt else ""
    print("lockstep-cuda" + ckpt + " layers=%s batch=%s precision=%s step_ms=%s samples_per_s=1 loss=2.3 "
          "gather_ms_one_thread=0.0120" % (a[a.index("--layers") + 1], a[a.index("--batch") + 1],
                                           a[a.index("--precision") + 1],
                                           "0.2000" if one else "0.1410") + end)
''')

FAKE_TORCH_STEP = PYTHON + textwrap.dedent('''
    import sys
    a = sys.argv
    precision = a[a.index("--precision") + 1]
    for i, arg in enumerate(a):
        if arg != "--config":
            continue
        layers, batch = a[i + 1].split(":")
        print("torch-eager layers=%s batch=%s precision=%s step_ms=1.1510 mean_ms=1.2 steps=300"
              % (layers, batch, precision))
        print("torch-compile layers=%s batch=%s precision=%s step_ms=1.3710 mean_ms=1.4 "
              "steps=300" % (layers, batch, precision))
''')

# The helpers' tests as the bundle carries them (tests/python), run by the real unittest.
FAKE_HELPER_TESTS = textwrap.dedent('''
    import unittest
    class HelperTest(unittest.TestCase):
        def test_a(self):
            pass
        def test_b(self):
            pass
''')

FAKE_EXEC_GOODPUT = PYTHON + textwrap.dedent('''
    import sys
    assert "--python" in sys.argv and "--build" in sys.argv, sys.argv
    print("exec-in-place  undisturbed   24.0 s  disturbed   25.5 s  kills  3")
    print()
    print("system          goodput  lost/failure s  kills  lost at a kill s (median)")
    print("exec-in-place      0.94            0.50      3                       0.31")
''')

FAKE_NVIDIA_SMI = "#!/bin/sh\n" + textwrap.dedent('''
    case "$1" in
      -L) echo "GPU 0: Stand-in H200 (UUID: GPU-0)" ;;
      --query-gpu=*) echo "Stand-in H200, 580.159.04, 143771 MiB, 9.0" ;;
      *) echo "| NVIDIA-SMI 580.159.04    Driver Version: 580.159.04    CUDA Version: 13.0 |" ;;
    esac
''')

FAKE_SANITIZER = PYTHON + textwrap.dedent('''
    import subprocess, sys
    args = sys.argv[1:]
    if args == ["--version"]:
        print("NVIDIA (R) Compute Sanitizer\\nVersion 2025.2.1.0 (build 1)")
        sys.exit(0)
    tool = args[args.index("--tool") + 1]
    while args[0].startswith("--"):
        args = args[2:]
    status = subprocess.run(args).returncode
    if tool == "racecheck":
        print("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)")
    else:
        print("========= ERROR SUMMARY: 0 errors")
    sys.exit(status)
''')


def write_program(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def make_bundle(folder, archive):
    """An archive laid out as scripts/gpu-bundle.sh lays it out, with stand-in programs."""
    stage = os.path.join(folder, "stage")
    programs = {"lockstep": FAKE_LOCKSTEP, "lockstep-worker": FAKE_WORKER,
                "cuda_kernels_test": FAKE_GTEST, "comm_nccl_communicator_test": FAKE_GTEST,
                "trainer_device_test": FAKE_GTEST, "kernels_test": FAKE_GTEST,
                "kernels_cuda_bench": FAKE_KERNEL_BENCH,
                "train_step_bench": FAKE_TRAIN_STEP_BENCH, "in_place_recovery_test": FAKE_GTEST}
    for name, text in programs.items():
        write_program(os.path.join(stage, "bin", name), text)
    write_program(os.path.join(stage, "bench", "train_step", "torch_step.py"), FAKE_TORCH_STEP)
    write_program(os.path.join(stage, "bench", "exec_goodput", "run.py"), FAKE_EXEC_GOODPUT)
    write_program(os.path.join(stage, "tests", "python", "test_elastic.py"), FAKE_HELPER_TESTS)
    os.makedirs(os.path.join(stage, "lib", "gcc-fallback"))
    os.makedirs(os.path.join(stage, "examples"))
    with open(os.path.join(SCRIPTS, "..", "examples", "fashion-mnist.yaml")) as source, \
            open(os.path.join(stage, "examples", "fashion-mnist.yaml"), "w") as copy:
        copy.write(source.read())
    with open(os.path.join(stage, "BUNDLE-INFO"), "w") as f:
        f.write("commit=0123abc\nprograms=lockstep lockstep-worker\n"
                "cuda_libraries=libcublas.so.13 libcudart.so.13 libnccl.so.2 \n"
                "glibc_required=2.34\n")
    with tarfile.open(archive, "w:xz") as tar:
        for entry in sorted(os.listdir(stage)):
            tar.add(os.path.join(stage, entry), arcname=entry)


class EndToEndTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.bundle = os.path.join(cls.tmp.name, "lockstep-gpu-bundle.tar.xz")
        make_bundle(cls.tmp.name, cls.bundle)
        cls.tools = os.path.join(cls.tmp.name, "tools")
        write_program(os.path.join(cls.tools, "nvidia-smi"), FAKE_NVIDIA_SMI)
        write_program(os.path.join(cls.tools, "compute-sanitizer"), FAKE_SANITIZER)
        # PyTorch's pip CUDA libraries, where machine.py looks for them first.
        cls.nvidia = os.path.join(cls.tmp.name, "site-packages", "nvidia")
        for package, name in (("cu13", "libcudart.so.13"), ("cu13", "libcublas.so.13"),
                              ("cu13", "libcublasLt.so.13"), ("nccl", "libnccl.so.2")):
            os.makedirs(os.path.join(cls.nvidia, package, "lib"), exist_ok=True)
            open(os.path.join(cls.nvidia, package, "lib", name), "w").close()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_check(self, *argv, out=True):
        """main.main() as scripts/gpu-check.sh runs it, in a fresh work folder and $OUT."""
        case = tempfile.mkdtemp(dir=self.tmp.name)
        environ = {"OUT": os.path.join(case, "out")} if out else {}
        if out:
            os.makedirs(environ["OUT"])
        stdout, stderr = io.StringIO(), io.StringIO()
        path = self.tools + os.pathsep + os.environ.get("PATH", "")
        with mock.patch.dict(os.environ, {"PATH": path}), \
                mock.patch.object(machine, "gpu_missing_reason", return_value=None), \
                mock.patch.object(machine, "probe_torch",
                                  return_value=machine.TorchInfo("2.11.0+cu130", True)), \
                mock.patch.object(machine, "nvidia_package_roots", return_value=[self.nvidia]), \
                contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            status = main.main(list(argv), environ, work=os.path.join(case, "work"),
                               root=os.path.join(case, "repository"))
        return status, stdout.getvalue(), stderr.getvalue(), environ.get("OUT"), case

    def rows(self, summary):
        table = summary.split("\nstep ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
        return [(line[:52].rstrip(), line[53:58].rstrip(), line[67:]) for line in table]

    def test_the_gpu_run_runs_every_step_in_order_and_reports_to_out(self):
        status, printed, errors, out, case = self.run_check("--bundle", self.bundle)
        self.assertEqual(errors, "")
        with open(os.path.join(out, "summary.txt")) as f:
            summary = f.read()
        self.assertEqual(status, 0, summary)
        self.assertTrue(printed.endswith("\n" + summary), printed[-2000:])
        rows = self.rows(summary)
        self.assertEqual([(name, state) for name, state, _ in rows], [
            ("loader: every program's libraries", "PASS"),
            ("a. cuda_kernels_test", "PASS"),
            ("a. comm_nccl_communicator_test", "PASS"),
            ("a. trainer_device_test", "PASS"),
            ("a. kernels_test", "PASS"),
            ("b. lockstep run, device cpu", "PASS"),
            ("b. lockstep run, device cuda", "PASS"),
            ("b. lockstep run, device cuda, bf16", "PASS"),
            ("b. cuda accuracy within 0.5 points of cpu", "PASS"),
            ("b. bf16 accuracy within 0.5 points of fp32", "PASS"),
            ("f. train_step_bench 784,256,10:64 fp32", "PASS"),
            ("f. train_step_bench 4096,4096,4096,10:512 fp32", "PASS"),
            ("f. train_step_bench 784,256,10:64 bf16", "PASS"),
            ("f. train_step_bench 4096,4096,4096,10:512 bf16", "PASS"),
            ("f. train_step_bench 1024,8192,8192,8192,10:4096 bf16", "PASS"),
            ("f. torch_step.py fp32", "PASS"),
            ("f. torch_step.py bf16", "PASS"),
            ("g. lockstep.elastic tests, torch 2.11.0+cu130", "PASS"),
            ("g. in_place_recovery_test", "PASS"),
            ("g. exec goodput, a kill every 8 s", "PASS"),
            ("e. kernels_cuda_bench", "PASS"),
            ("c. kill test, device cuda", "PASS"),
            ("d. memcheck cuda_kernels_test", "PASS"),
            ("d. racecheck cuda_kernels_test", "PASS"),
            ("d. memcheck lockstep run (cuda, 50 steps)", "PASS")])
        details = {name: detail for name, _, detail in rows}
        self.assertEqual(details["a. kernels_test"], "2 passed, 0 failed, 0 skipped")
        self.assertEqual(details["b. lockstep run, device cuda"], "accuracy 0.8503")
        # 2000 steps in 7.52 s: about 25 s of training is 6600 steps.
        self.assertEqual(details["c. kill test, device cuda"],
                         "steps 6600/6600, resumed_from_step 200, restarts 1, exit 0")
        self.assertEqual(details["f. train_step_bench 784,256,10:64 fp32"],
                         "step_ms=0.1410 step_ms=0.1410 step_ms=0.1410")
        self.assertEqual(details["f. torch_step.py fp32"], "4 figures; 0 errors")
        self.assertEqual(details["f. torch_step.py bf16"], "6 figures; 0 errors")
        self.assertEqual(details["b. bf16 accuracy within 0.5 points of fp32"],
                         "cuda bf16 mean 0.8503 vs cuda fp32 0.8503 over 4 seeds (cuda fp32: "
                         "0.8503 0.8503 0.8503 0.8503; cuda bf16: 0.8503 0.8503 0.8503 0.8503)")
        self.assertEqual(details["g. lockstep.elastic tests, torch 2.11.0+cu130"],
                         "2 tests, 0 skipped")
        self.assertEqual(details["g. exec goodput, a kill every 8 s"],
                         "exec-in-place goodput 0.94, lost/failure 0.50 s, kills 3")
        self.assertEqual(details["d. racecheck cuda_kernels_test"],
                         "ERROR SUMMARY: 0 errors (1 processes)")
        self.assertIn("\ngpu: Stand-in H200, 580.159.04, 143771 MiB, 9.0\n", summary)
        self.assertIn("\ndriver: Driver Version: 580.159.04    CUDA Version: 13.0\n", summary)
        self.assertIn(f"\n  libnccl.so.2: {self.nvidia}/nccl/lib/libnccl.so.2\n", summary)
        self.assertIn("(the bundle needs 2.34); python3 ", summary)
        self.assertIn("; torch 2.11.0+cu130\n", summary)
        for section in ("\nb. Fashion-MNIST", "\nc. kill test (cuda, 6600 steps",
                        "\ne. kernels_cuda_bench (goal", "\nf. training step, ms"):
            self.assertIn(section, summary)
        self.assertRegex(summary, r"\ntotal \d+ s of a 540 s budget; 0 step\(s\) failed; "
                                  r"logs: \$OUT/logs\.tar\.gz\n$")
        self.assertIn("gpu-check: logs: $OUT/logs.tar.gz; summary: $OUT/summary.txt\n", printed)
        self.assertEqual(sorted(os.listdir(out)), ["logs.tar.gz", "summary.txt"])
        with tarfile.open(os.path.join(out, "logs.tar.gz")) as tar:
            names = set(tar.getnames())
        for name in ("logs/machine.txt", "logs/cuda_kernels_test.xml",
                     "logs/train-cpu/summary.json",
                     "logs/kill-cuda/kill.log", "logs/train_step.txt", "logs/torch_step-bf16.log",
                     "logs/train-cuda-bf16/manifest.yaml", "logs/in_place_recovery_test.xml",
                     "logs/report-f-step-time.txt", "logs/sanitizer-train/sanitizer.log"):
            self.assertIn(name, names)
        # The bundle was unpacked for LD_LIBRARY_PATH to name; the test leaves os.environ alone.
        self.assertIn(f"LD_LIBRARY_PATH={case}/work/lib:{self.nvidia}/cu13/lib:", summary)

    def test_the_cpu_selftest_runs_b_and_c_on_the_cpu(self):
        status, printed, errors, _, case = self.run_check("--bundle", self.bundle,
                                                          "--cpu-selftest", out=False)
        # Without $OUT the results go to the repository's build/gpu-check, the logs beside them.
        results = os.path.join(case, "repository", "build", "gpu-check")
        with open(os.path.join(results, "summary.txt")) as f:
            summary = f.read()
        self.assertEqual(status, 0, summary)
        self.assertTrue(printed.endswith("\n" + summary))
        self.assertEqual(sorted(os.listdir(results)), ["logs", "summary.txt"])
        self.assertTrue(os.path.isfile(os.path.join(results, "logs", "kill-cpu", "kill.log")))
        self.assertTrue(summary.endswith(f"; logs: {results}/logs\n"))
        self.assertIn("\nmode: --cpu-selftest (no GPU steps; device cpu for b and c)\n", summary)
        self.assertEqual([(name, state) for name, state, _ in self.rows(summary)], [
            ("loader: every program's libraries", "PASS"),
            ("b. lockstep run, device cpu", "PASS"),
            ("b. cuda accuracy within 0.5 points of cpu", "SKIP"),
            ("c. kill test, device cpu", "PASS")])

    def test_steps_chosen_by_letter_or_label_run_alone(self):
        status, printed, errors, out, _ = self.run_check(
            "--bundle", self.bundle, "--steps", "a. kernels_test,e")
        with open(os.path.join(out, "summary.txt")) as f:
            summary = f.read()
        self.assertEqual(status, 0, summary)
        self.assertEqual([name for name, _, _ in self.rows(summary)], [
            "loader: every program's libraries", "a. kernels_test", "e. kernels_cuda_bench"])

    def test_an_empty_list_of_steps_is_refused(self):
        status, _, errors, _, _ = self.run_check("--bundle", self.bundle, "--steps", " , ")
        self.assertEqual(status, 2)
        self.assertIn("--steps needs a list of steps", errors)

    def test_a_step_that_does_not_exist_is_refused(self):
        status, _, errors, _, _ = self.run_check("--bundle", self.bundle, "--steps", "b,x")
        self.assertEqual(status, 2)
        self.assertIn("--steps: no step x (steps: ", errors)

    def test_a_failed_step_makes_the_exit_status_1(self):
        with mock.patch.object(main.steps, "plan", return_value=[
                ("x", lambda ctx: ctx.record("a. broken", "FAIL", "exit 1: boom"))]):
            status, printed, _, out, _ = self.run_check("--bundle", self.bundle)
        self.assertEqual(status, 1)
        self.assertIn("; 1 step(s) failed; ", printed)

    def test_no_gpu_no_archive_and_bad_arguments_are_refused_with_status_2(self):
        with mock.patch.object(machine, "gpu_missing_reason",
                               return_value="nvidia-smi is not on PATH (no NVIDIA driver "
                                            "installed)"), \
                contextlib.redirect_stderr(io.StringIO()) as errors:
            self.assertEqual(main.main(["--bundle", self.bundle], {}, work="/nonexistent"), 2)
        self.assertEqual(errors.getvalue(),
                         "gpu-check: refused: no usable GPU on this machine: nvidia-smi is not "
                         "on PATH (no NVIDIA driver installed). Run it on a GPU machine (or use "
                         "--cpu-selftest to check the CPU steps of this script).\n")
        with contextlib.redirect_stderr(io.StringIO()) as errors:
            self.assertEqual(main.main(["--cpu-selftest", "--bundle", "/no/such.tar.xz"], {},
                                       work="/nonexistent"), 2)
        self.assertTrue(errors.getvalue().startswith(
            "gpu-check: refused: no archive at /no/such.tar.xz: run scripts/gpu-bundle.sh"))
        for argv in (["--frobnicate"], ["--bundle"]):
            with contextlib.redirect_stderr(io.StringIO()) as errors:
                self.assertEqual(main.main(argv, {}, work="/nonexistent"), 2, argv)
        with contextlib.redirect_stderr(io.StringIO()) as errors:
            self.assertEqual(main.main(["--cpu-selftest"],
                                       {"LOCKSTEP_GPU_CHECK_BUDGET_S": "ten"}, "/nonexistent"), 2)

    def test_help_prints_the_usage(self):
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            self.assertEqual(main.main(["-h"], {}, work="/nonexistent"), 0)
        self.assertIn("scripts/gpu-check.sh --cpu-selftest     on a machine without a GPU",
                      printed.getvalue())

    def test_the_shell_entry_point_runs_the_package(self):
        entry = os.path.join(SCRIPTS, "gpu-check.sh")
        result = subprocess.run([entry, "--help"], capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(result.stdout.startswith("Lockstep's checks on a GPU machine"))
        result = subprocess.run([entry, "--no-such-flag"], capture_output=True, text=True,
                                timeout=60)
        self.assertEqual((result.returncode, result.stderr),
                         (2, "gpu-check: unknown argument --no-such-flag (see --help)\n"))


class ProcessTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def test_a_program_past_its_limit_is_stopped_with_what_it_started(self):
        log = os.path.join(self.tmp.name, "log")
        pid_file = os.path.join(self.tmp.name, "child")
        started = time.monotonic()
        status = process.run_logged(1, log, ["sh", "-c", f"sleep 30 & echo $! > {pid_file}; wait"])
        self.assertEqual(status, process.TIMED_OUT)
        self.assertLess(time.monotonic() - started, 8)
        with open(pid_file) as f:
            child = int(f.read())
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and os.path.exists(f"/proc/{child}"):
            with open(f"/proc/{child}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    break  # ended, not yet reaped by init
            time.sleep(0.05)
        else:
            self.assertFalse(os.path.exists(f"/proc/{child}"), "the program's child outlived it")
        with open(log) as f:
            self.assertEqual(f.readline(), f"$ sh -c sleep 30 & echo $! > {pid_file}; wait\n")
            self.assertTrue(f.readline().startswith("# time limit 1 s; LD_LIBRARY_PATH="))

    def test_statuses_read_as_a_shell_reports_them(self):
        log = os.path.join(self.tmp.name, "log")
        self.assertEqual(process.run_logged(5, log, ["sh", "-c", "exit 3"]), 3)
        self.assertEqual(process.run_logged(5, log, ["sh", "-c", "kill -SEGV $$"]), 139)
        self.assertEqual(process.run_logged(5, log, [os.path.join(self.tmp.name, "none")]), 127)
        with open(log) as f:
            self.assertIn("gpu-check: cannot run ", f.read())
        self.assertEqual(process.run_captured(["sh", "-c", "echo hi; echo there >&2"], 5),
                         (0, "hi\nthere\n"))
        self.assertEqual(process.run_captured(["sleep", "30"], 0.5)[0], process.TIMED_OUT)

    def test_the_kill_test_finds_the_worker_by_its_manifest(self):
        manifest = os.path.join(self.tmp.name, "run", "manifest.json")
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)",
                                   "lockstep-worker", "train", "--manifest", manifest])
        try:
            deadline = time.monotonic() + 5
            while process.worker_pid(manifest) is None and time.monotonic() < deadline:
                time.sleep(0.02)
            self.assertEqual(process.worker_pid(manifest), worker.pid)
            self.assertIsNone(process.worker_pid(manifest[:-1]))  # a prefix is another manifest
        finally:
            worker.kill()
            worker.wait()


if __name__ == "__main__":
    unittest.main()
