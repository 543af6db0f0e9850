"""The check's steps, in the order they run, each ending in its row(s) of the report.

  a. the gtest programs: cuda_kernels_test, comm_nccl_communicator_test, trainer_device_test
     (label gpu) and kernels_test (the CPU kernels, for comparison)
  b. `lockstep run` of examples/fashion-mnist.yaml with one worker, on cpu, on cuda and on cuda
     in bf16; cuda's accuracy within 0.5 points of cpu's, bf16's mean over four seeds within 0.5
     points of fp32's
  c. the kill test: the cuda run with checkpoints and restartPolicy OnFailure; once a checkpoint
     is committed its worker is SIGKILLed, and the replacement must resume from a checkpoint and
     finish at the manifest's step count
  e. kernels_cuda_bench: each kernel's bandwidth against a device-to-device copy
  f. train_step_bench (Lockstep) against bench/train_step/torch_step.py (PyTorch eager and
     torch.compile), fp32 and bf16 (autocast), and a larger GEMM-bound model in bf16
  g. exec mode on the machine's PyTorch: the Python helpers' tests, in_place_recovery_test (gloo,
     4 ranks on the CPU) and bench/exec_goodput/run.py (exec-in-place, a kill every 8 s)
  d. compute-sanitizer, last because it is the slowest and least predictable step

They run in the order a, b, f, g, e, c, d: what has been proven on earlier machines (the kernel
benchmark, the kill test, the sanitizer) comes last, to take what the budget has left.

The self-test (--cpu-selftest, on a machine without a GPU) runs b and c only, with device cpu.
Every program runs under the limit the budget gives its step (LIMITS below); a step the budget
has no room for is a SKIP row saying so.
"""
import datetime
import fnmatch
import functools
import os
import shutil
import signal
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from . import verdicts
from .budget import Budget, Limit
from .machine import find_compute_sanitizer
from .manifest import ManifestError, make_manifest
from .process import Background, run_captured, run_logged, worker_pid
from .report import FAIL, PASS, SKIP, Report, say

# What each step asks of the budget: (want, minimum) seconds; see budget.py.
GTEST_PROGRAMS = [  # (program, is a GPU program, limit)
    ("cuda_kernels_test", True, Limit(120)),
    ("comm_nccl_communicator_test", True, Limit(120)),
    ("trainer_device_test", True, Limit(180)),
    ("kernels_test", False, Limit(120)),
]
TRAIN_RUN = Limit(240)
KILL_TEST = Limit(180, 60)
KERNEL_BENCH = Limit(150)
TRAIN_STEP_BENCH = Limit(60)  # each run of a configuration asks for this limit
TORCH_STEP = Limit(240, 30)
SANITIZER_KERNEL_TESTS = Limit(120, 30)  # per tool
SANITIZER_TRAINING = Limit(150, 45)
VALIDATE_TIMEOUT_S = 60

# (LAYERS:BATCH, precision). The larger model is bf16 only: in fp32 its steps would take the
# budget (~50 ms each), and what it shows is the tensor cores' rate.
TORCH_FP32_CONFIGS = ["784,256,10:64", "4096,4096,4096,10:512"]
TORCH_BF16_CONFIGS = TORCH_FP32_CONFIGS + ["1024,8192,8192,8192,10:4096"]
TRAIN_STEP_CONFIGS = ([(config, "fp32") for config in TORCH_FP32_CONFIGS]
                      + [(config, "bf16") for config in TORCH_BF16_CONFIGS])
CHECKPOINT_EVERY = 50  # step f's checkpointed runs
ACCURACY_SEEDS = [1, 2, 3, 4]  # step b's bf16 against fp32: the mean over these seeds
SEED_RUN = Limit(60, 20)
EXEC_UNITTEST = Limit(90, 20)
# Minimums: what the two took on an H100's 16 cores (116 s; two runs of 42 s and start-up).
IN_PLACE_RECOVERY = Limit(240, 130)
EXEC_GOODPUT = Limit(150, 100)
# The exec tests' PyTorch programs: the in-place recovery tests without the two that only
# repeat the first with other failures (time), and the goodput benchmark's one system.
IN_PLACE_RECOVERY_FILTER = ("--gtest_filter=*KilledProcessesAreReplaced*:*AStandbyTakes*")
GOODPUT_ARGS = ["--systems", "exec-in-place", "--kill-every", "8", "--ddp-steps", "2400",
                "--step-delay", "0.01", "--timeout", "120"]
SANITIZER_STEPS = 50
# Death tests, the out-of-range label test and the allocation beyond the card make CUDA fail on
# purpose: the tool would rightly report those errors.
SANITIZER_GTEST_FILTER = "--gtest_filter=-*DeathTest*:*OutOfRangeLabel*:*AllocationBeyondTheCard*"
NO_TIME = "no time left in the budget"
NOT_BUILT = "not in the bundle (not built)"


@dataclass
class Context:
    """What every step needs: the unpacked bundle, the logs folder, the budget and the report."""
    work: str               # the unpacked bundle (/tmp/lockstep-gpu)
    log_dir: str
    selftest: bool
    budget: Budget
    report: Report
    torch_version: Optional[str] = None  # None: no PyTorch for python3 here

    def program(self, name: str) -> str:
        return os.path.join(self.work, "bin", name)

    def has_program(self, name: str) -> bool:
        path = self.program(name)
        return os.path.isfile(path) and os.access(path, os.X_OK)

    def log(self, *parts: str) -> str:
        return os.path.join(self.log_dir, *parts)

    def record(self, name: str, state: str, detail: str) -> None:
        self.report.record(name, state, detail)

    def built(self, name: str, program: str) -> bool:
        """Whether the bundle has `program`; if not, step `name` is recorded as skipped."""
        if self.has_program(program):
            return True
        self.record(name, SKIP, NOT_BUILT)
        return False

    def time_for(self, name: str, limit: Limit) -> Optional[int]:
        """The seconds step `name` may take, or None once it is recorded as skipped for want
        of time."""
        seconds = self.budget.limit_for(limit)
        if seconds is None:
            self.record(name, SKIP, NO_TIME)
        return seconds


Step = Callable[[Context], None]


def plan(selftest: bool) -> List[Tuple[str, Step]]:
    """The steps in the order they run, each with the label tests and readers know it by."""
    if selftest:
        return [("b", train_step), ("c", kill_step)]
    steps: List[Tuple[str, Step]] = [
        (f"a. {program}", functools.partial(gtest_step, program=program, gpu_program=gpu_program,
                                            limit=limit))
        for program, gpu_program, limit in GTEST_PROGRAMS]
    steps += [("b", train_step), ("f", step_time_step), ("g", exec_step),
              ("e", kernel_bench_step), ("c", kill_step), ("d", sanitizer_step)]
    return steps


# ---------------------------------------------------------------------------------------------
# a. gtest programs.

def gtest_step(ctx: Context, program: str, gpu_program: bool, limit: Limit, step: str = "a",
               prefix: Sequence[str] = (), extra_args: Sequence[str] = ()) -> None:
    """Runs a gtest program of the bundle (after `prefix`, e.g. an `env` with variables)."""
    name = f"{step}. {program}"
    if not ctx.built(name, program):
        return
    seconds = ctx.time_for(name, limit)
    if seconds is None:
        return
    log, xml = ctx.log(f"{program}.log"), ctx.log(f"{program}.xml")
    status = run_logged(seconds, log, list(prefix) + [ctx.program(program), "--gtest_brief=1",
                                                      f"--gtest_output=xml:{xml}"]
                        + list(extra_args))
    state, detail = verdicts.gtest_verdict(status, seconds, verdicts.gtest_summary(xml),
                                           gpu_program, os.path.exists(xml),
                                           verdicts.read_text(log))
    ctx.record(name, state, detail)


# ---------------------------------------------------------------------------------------------
# b and c: training runs of the Fashion-MNIST manifest, rewritten for the bundle.

def prepare_manifest(ctx: Context, run_dir: str, device: str, steps: Optional[int],
                     checkpoint: bool = False, validate: bool = True,
                     precision: Optional[str] = None, seed: Optional[int] = None) -> bool:
    """run_dir/manifest.yaml (manifest.py), checked by `lockstep validate` when asked; False when
    either failed (make-manifest.log or validate.log says why)."""
    manifest = os.path.join(run_dir, "manifest.yaml")
    with open(os.path.join(run_dir, "make-manifest.log"), "w") as log:
        try:
            make_manifest(os.path.join(ctx.work, "examples", "fashion-mnist.yaml"), manifest,
                          ctx.work, device, steps, checkpoint, precision, seed)
        except (ManifestError, OSError) as error:
            log.write(f"make_manifest: error: {error}\n")
            return False
    if not validate:
        return True
    return run_logged(VALIDATE_TIMEOUT_S, os.path.join(run_dir, "validate.log"),
                      [ctx.program("lockstep"), "validate", manifest], header=False) == 0


def lockstep_run_argv(ctx: Context, run_dir: str) -> List[str]:
    return [ctx.program("lockstep"), "run", os.path.join(run_dir, "manifest.yaml"),
            "--replicas", "1", "--summary", os.path.join(run_dir, "summary.json"),
            "--log-dir", os.path.join(run_dir, "run")]


def train_run(ctx: Context, device: str, run_dir: str, steps: Optional[int], limit: Limit,
              precision: Optional[str] = None, seed: Optional[int] = None) -> int:
    """Writes and validates run_dir/manifest.yaml, then runs it. Returns lockstep's status, or
    verdicts.MANIFEST_FAILED, or verdicts.NO_TIME_LEFT."""
    os.makedirs(run_dir, exist_ok=True)
    if not prepare_manifest(ctx, run_dir, device, steps, precision=precision, seed=seed):
        return verdicts.MANIFEST_FAILED
    seconds = ctx.budget.limit_for(limit)
    if seconds is None:
        return verdicts.NO_TIME_LEFT
    return run_logged(seconds, os.path.join(run_dir, "lockstep-run.log"),
                      lockstep_run_argv(ctx, run_dir))


TRAIN_RUNS = [  # (folder under the logs, device, precision, row name, column label)
    ("train-cpu", "cpu", None, "b. lockstep run, device cpu", "cpu"),
    ("train-cuda", "cuda", None, "b. lockstep run, device cuda", "cuda"),
    ("train-cuda-bf16", "cuda", "bf16", "b. lockstep run, device cuda, bf16", "cuda bf16"),
]  # each with the first of ACCURACY_SEEDS


def train_step(ctx: Context) -> None:  # b.
    runs = TRAIN_RUNS[:1] if ctx.selftest else TRAIN_RUNS
    for folder, device, precision, row, _ in runs:
        run_dir = ctx.log(folder)
        status = train_run(ctx, device, run_dir, None, TRAIN_RUN, precision, ACCURACY_SEEDS[0])
        summary = verdicts.load_run_summary(os.path.join(run_dir, "summary.json"))
        state, detail = verdicts.train_run_verdict(status, summary,
                                                   verdicts.failure_reason(run_dir))
        ctx.record(row, state, detail)
    # Side by side; the verdicts need both of their runs (the self-test has only cpu).
    summaries = {folder: verdicts.load_run_summary(ctx.log(folder, "summary.json"))
                 for folder, *_ in TRAIN_RUNS}
    ctx.report.add_section("b-training", verdicts.training_section(
        [(label, summaries[folder]) for folder, _, _, _, label in runs]))
    state, detail = verdicts.accuracy_verdict(summaries["train-cpu"], summaries["train-cuda"])
    ctx.record("b. cuda accuracy within 0.5 points of cpu", state, detail)
    if not ctx.selftest:
        bf16_against_fp32(ctx, summaries["train-cuda"], summaries["train-cuda-bf16"])


def bf16_against_fp32(ctx: Context, fp32_seed1: dict, bf16_seed1: dict) -> None:
    """bf16's mean test accuracy over ACCURACY_SEEDS within 0.5 points of fp32's, on cuda (the
    seed-1 runs are the rows above; the others run here)."""
    fp32, bf16 = [fp32_seed1], [bf16_seed1]
    for seed in ACCURACY_SEEDS[1:]:
        for precision, runs in (("fp32", fp32), ("bf16", bf16)):
            run_dir = ctx.log(f"train-cuda-{precision}-seed{seed}")
            status = train_run(ctx, "cuda", run_dir, None, SEED_RUN, precision, seed)
            summary = verdicts.load_run_summary(os.path.join(run_dir, "summary.json"))
            if status not in (0, verdicts.NO_TIME_LEFT):
                # A run that failed has a row of its own (the seed-1 runs have theirs above).
                ctx.record(f"b. lockstep run, cuda {precision}, seed {seed}",
                           *verdicts.train_run_verdict(status, summary,
                                                       verdicts.failure_reason(run_dir)))
                summary = dict(summary, status=summary.get("status") or "failed")
            runs.append(summary)
    state, detail = verdicts.mean_accuracy_verdict(fp32, bf16, ("cuda fp32", "cuda bf16"))
    ctx.record("b. bf16 accuracy within 0.5 points of fp32", state, detail)


def names_matching(folder: str, pattern: str) -> List[str]:
    """Names in folder matching pattern, sorted ([] when there is no folder)."""
    try:
        return sorted(name for name in os.listdir(folder) if fnmatch.fnmatch(name, pattern))
    except OSError:
        return []


def kill_step(ctx: Context) -> None:  # c.
    device = "cpu" if ctx.selftest else "cuda"
    name = f"c. kill test, device {device}"
    run_dir = ctx.log(f"kill-{device}")
    want_steps = verdicts.kill_test_steps(
        verdicts.load_run_summary(ctx.log(f"train-{device}", "summary.json")))
    seconds = ctx.time_for(name, KILL_TEST)
    if seconds is None:
        return
    ckpt = os.path.join(ctx.work, "ckpt")
    shutil.rmtree(ckpt, ignore_errors=True)
    os.makedirs(run_dir, exist_ok=True)
    if not prepare_manifest(ctx, run_dir, device, want_steps, checkpoint=True):
        ctx.record(name, FAIL, f"manifest: {verdicts.failure_reason(run_dir)}")
        return
    deadline = time.monotonic() + seconds
    run = Background(lockstep_run_argv(ctx, run_dir), os.path.join(run_dir, "lockstep-run.log"))

    # A committed checkpoint is a step-<N> directory: it appears only by the final rename of the
    # commit (docs/checkpoints.md), so its presence means complete.
    killed: Optional[int] = None
    checkpoint, note = "", ""
    worker_manifest = os.path.join(run_dir, "run", "manifest.json")
    while time.monotonic() < deadline and run.running():
        committed = names_matching(ckpt, "step-[0-9]*")
        if committed:
            checkpoint = committed[0]
            pid = worker_pid(worker_manifest)
            if pid is None:
                note = f"no lockstep-worker process found for {worker_manifest}"
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed = pid
                except OSError:
                    pass
                stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S.%f")[:12]
                with open(os.path.join(run_dir, "kill.log"), "w") as f:
                    f.write(f"gpu-check: {stamp} SIGKILL to lockstep-worker {pid} after "
                            f"{checkpoint} appeared\n")
            break
        time.sleep(0.05)
    # Let the run finish (the replacement trains the rest), bounded by the step's limit.
    if not run.wait_until(deadline, poll_s=0.2):
        run.stop()
        ctx.record(name, FAIL, f"ran out of its {seconds} s")
        return
    status = run.status()
    summary = verdicts.load_run_summary(os.path.join(run_dir, "summary.json"))
    figures = verdicts.kill_test_figures(summary, want_steps, status)
    ctx.report.add_section("c-kill", verdicts.kill_test_section(
        device, want_steps, killed, checkpoint, note, figures, names_matching(ckpt, "step-*")))
    state, detail = verdicts.kill_test_verdict(killed, note, status, summary, want_steps,
                                               verdicts.failure_reason(run_dir))
    ctx.record(name, state, detail)


# ---------------------------------------------------------------------------------------------
# e and f: benchmarks.

def kernel_bench_step(ctx: Context) -> None:  # e.
    name = "e. kernels_cuda_bench"
    if not ctx.built(name, "kernels_cuda_bench"):
        return
    seconds = ctx.time_for(name, KERNEL_BENCH)
    if seconds is None:
        return
    log = ctx.log("kernels_cuda_bench.log")
    status = run_logged(seconds, log, [ctx.program("kernels_cuda_bench")])
    text = verdicts.read_text(log)
    ctx.report.add_section("e-kernels", verdicts.kernel_bench_section(text))
    state, detail = verdicts.kernel_bench_verdict(status, text)
    ctx.record(name, state, detail)


def step_time_step(ctx: Context) -> None:  # f.
    collected: List[str] = []  # every measurement line, also kept as train_step.txt
    if ctx.built("f. train_step_bench", "train_step_bench"):
        for config, precision in TRAIN_STEP_CONFIGS:
            collected += train_step_bench_config(ctx, config, precision)
    for precision, configs in (("fp32", TORCH_FP32_CONFIGS), ("bf16", TORCH_BF16_CONFIGS)):
        name = f"f. torch_step.py {precision}"
        if ctx.torch_version is None:
            ctx.record(name, SKIP, "no PyTorch for python3 here")
            continue
        seconds = ctx.time_for(name, TORCH_STEP)
        if seconds is None:
            continue
        log = ctx.log(f"torch_step-{precision}.log")
        argv = ["python3", os.path.join(ctx.work, "bench", "train_step", "torch_step.py"),
                "--steps", "300", "--warmup", "50", "--precision", precision]
        for config in configs:
            argv += ["--config", config]
        status = run_logged(seconds, log, argv)
        text = verdicts.read_text(log)
        collected += verdicts.lines_starting(text, "torch-")
        state, detail = verdicts.torch_step_verdict(status, text)
        ctx.record(name, state, detail)
    with open(ctx.log("train_step.txt"), "w") as f:
        f.write("".join(line + "\n" for line in collected))
    ctx.report.add_section("f-step-time", verdicts.step_time_section(collected))


def train_step_bench_config(ctx: Context, config: str, precision: str) -> List[str]:
    """Three runs of one configuration (a lent machine's host and GPU vary from run to run: the
    table shows the median and the spread), then one with a single gather thread, to show what
    the host's share of a step is, and for the fp32 models three with asynchronous checkpoints
    every CHECKPOINT_EVERY steps, to show what a checkpoint costs. Returns its measurement
    lines."""
    name = f"f. train_step_bench {config} {precision}"
    seconds = ctx.time_for(name, TRAIN_STEP_BENCH)
    if seconds is None:
        return []
    layers, _, batch = config.partition(":")
    bench_argv = [ctx.program("train_step_bench"), "--device", "cuda", "--layers", layers,
                  "--batch", batch, "--steps", "300", "--warmup", "50", "--precision", precision]
    bench_log = ctx.log(f"train_step_bench-{config.replace(',', '_').replace(':', '_')}"
                        f"-{precision}.log")
    combined, failed = "", 0
    ckpt_dir = os.path.join(ctx.work, "ckpt-bench")
    repeats = ["1", "2", "3", "single"] + (["ckpt1", "ckpt2", "ckpt3"]
                                            if precision == "fp32" else [])
    for repeat in repeats:
        if repeat != "1":  # the first run's limit was given above
            seconds = ctx.budget.limit_for(TRAIN_STEP_BENCH)
            if seconds is None:
                combined += f"# runs from {repeat} on: no time left in the budget\n"
                break
        run_log = f"{bench_log}.{repeat}"
        if repeat == "single":
            status = run_logged(seconds, run_log,
                                ["env", "LOCKSTEP_GATHER_THREADS=1"] + bench_argv)
            combined += verdicts.single_thread_lines(verdicts.read_text(run_log))
        elif repeat.startswith("ckpt"):
            shutil.rmtree(ckpt_dir, ignore_errors=True)
            status = run_logged(seconds, run_log, bench_argv + [
                "--checkpoint-every", str(CHECKPOINT_EVERY), "--checkpoint-dir", ckpt_dir])
            text = verdicts.read_text(run_log)
            combined += text
            shutil.rmtree(ckpt_dir, ignore_errors=True)
            if status == 0 and not verdicts.checkpoints_taken(text):
                status = 1
                combined += "# a run with --checkpoint-every took no checkpoint\n"
        else:
            status = run_logged(seconds, run_log, bench_argv)
            combined += verdicts.read_text(run_log)
        os.remove(run_log)
        if status != 0:
            failed = status
    with open(bench_log, "w") as f:
        f.write(combined)
    if failed == 0:
        ctx.record(name, PASS, verdicts.bench_detail(combined))
    else:
        ctx.record(name, FAIL, f"exit {failed} (see its log)")
    return verdicts.lines_starting(combined, "lockstep-cuda")


# ---------------------------------------------------------------------------------------------
# g. Exec mode on the machine's PyTorch (the newest PyTorch users have; the build machine's is
# Debian's 1.13), with the CPU's gloo: every rank has a core of its own here.

def exec_step(ctx: Context) -> None:  # g.
    if ctx.torch_version is None:
        ctx.record("g. exec mode", SKIP, "no PyTorch for python3 here")
        return
    python = shutil.which("python3") or "python3"
    helpers = os.path.join(ctx.work, "lib", "lockstep", "python")
    name = f"g. lockstep.elastic tests, torch {ctx.torch_version}"
    seconds = ctx.time_for(name, EXEC_UNITTEST)
    if seconds is not None:
        log = ctx.log("exec-unittest.log")
        status = run_logged(seconds, log, [
            "env", f"PYTHONPATH={helpers}", python, "-m", "unittest", "discover", "-v",
            "-s", os.path.join(ctx.work, "tests", "python"), "-p", "test_[epz]*.py"])
        state, detail = verdicts.unittest_verdict(status, verdicts.read_text(log))
        ctx.record(name, state, detail)
    env = ["env", f"LOCKSTEP_TEST_PYTHON={python}", f"LOCKSTEP_TEST_SOURCE_DIR={ctx.work}",
           f"LOCKSTEP_TEST_LOCKSTEP={ctx.program('lockstep')}"]
    gtest_step(ctx, "in_place_recovery_test", gpu_program=False, limit=IN_PLACE_RECOVERY,
               step="g", prefix=env, extra_args=[IN_PLACE_RECOVERY_FILTER])
    name = "g. exec goodput, a kill every 8 s"
    seconds = ctx.time_for(name, EXEC_GOODPUT)
    if seconds is None:
        return
    log = ctx.log("exec-goodput.log")
    status = run_logged(seconds, log, [
        python, os.path.join(ctx.work, "bench", "exec_goodput", "run.py"), "--build", ctx.work,
        "--python", python, "--fashion", os.path.join(ctx.work, "data", "fashion-mnist")]
        + GOODPUT_ARGS)
    text = verdicts.read_text(log)
    ctx.report.add_section("g-goodput", "g. exec goodput (bench/exec_goodput/run.py "
                           + " ".join(GOODPUT_ARGS) + "):\n"
                           + "".join(f"  {line}\n" for line in text.splitlines()[-6:]))
    state, detail = verdicts.goodput_verdict(status, text)
    ctx.record(name, state, detail)


# ---------------------------------------------------------------------------------------------
# d. compute-sanitizer.

def sanitizer_step(ctx: Context) -> None:  # d.
    sanitizer = find_compute_sanitizer()
    if sanitizer is None:
        ctx.record("d. compute-sanitizer", SKIP,
                   "not found (PATH, /usr/local/cuda/bin, pip nvidia packages)")
        return
    _, version_text = run_captured([sanitizer, "--version"], 30)
    version = verdicts.sanitizer_version(version_text)
    say(f"compute-sanitizer: {sanitizer} ({version})")
    for tool in ["memcheck", "racecheck"]:
        name = f"d. {tool} cuda_kernels_test"
        if not ctx.has_program("cuda_kernels_test"):
            ctx.record(name, SKIP, "cuda_kernels_test is not in the bundle")
            continue
        seconds = ctx.time_for(name, SANITIZER_KERNEL_TESTS)
        if seconds is None:
            continue
        log = ctx.log(f"sanitizer-{tool}-cuda_kernels_test.log")
        status = run_logged(seconds, log, [sanitizer, "--tool", tool,
                                           ctx.program("cuda_kernels_test"), "--gtest_brief=1",
                                           SANITIZER_GTEST_FILTER])
        state, detail = verdicts.sanitizer_verdict(status, seconds, [verdicts.read_text(log)])
        ctx.record(name, state, detail)
    # A short cuda training under `lockstep run`: the worker is lockstep's child, hence
    # --target-processes all.
    run_dir = ctx.log("sanitizer-train")
    os.makedirs(run_dir, exist_ok=True)
    name = f"d. memcheck lockstep run (cuda, {SANITIZER_STEPS} steps)"
    if not prepare_manifest(ctx, run_dir, "cuda", SANITIZER_STEPS, validate=False):
        ctx.record(name, FAIL, f"manifest: {verdicts.failure_reason(run_dir)}")
        return
    seconds = ctx.time_for(name, SANITIZER_TRAINING)
    if seconds is None:
        return
    # --report-api-errors no: NCCL's initialisation probes kernel images for other architectures
    # and handles the cudaErrorNoKernelImageForDevice it gets (8 such reports, all inside
    # libnccl's ncclInitKernelsForDevice, on an H100 with PyTorch's NCCL); memory access errors
    # are still reported. cuda_kernels_test above keeps API errors reported: nothing there
    # expects one.
    log = os.path.join(run_dir, "sanitizer.log")
    status = run_logged(seconds, log, [sanitizer, "--tool", "memcheck", "--report-api-errors",
                                       "no", "--target-processes", "all"]
                        + lockstep_run_argv(ctx, run_dir))
    # The worker logs too: a child process's report may land there.
    worker_logs = os.path.join(run_dir, "run")
    texts = [verdicts.read_text(log)] + [verdicts.read_text(os.path.join(worker_logs, worker_log))
                                         for worker_log in names_matching(worker_logs,
                                                                          "worker-*.log")]
    state, detail = verdicts.sanitizer_verdict(status, seconds, texts)
    ctx.record(name, state, detail)
