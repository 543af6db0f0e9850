"""What the programs under test printed, and the rule that makes each into a row.

Pure functions over text, files and `lockstep run --summary` JSON, so that every rule is tested
on given output (tests/python/test_gpu_check_verdicts.py) without a GPU or a build. A verdict is
(state, detail): the row's PASS/FAIL/SKIP and the words after it.
"""
import collections
import glob
import json
import os
import re
import statistics
import xml.etree.ElementTree as ET
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from .process import TIMED_OUT
from .report import FAIL, PASS, SKIP

Verdict = Tuple[str, str]


def last_line(text: str) -> str:
    """What `tail -n 1` shows of a file's text."""
    lines = text.splitlines()
    return lines[-1] if lines else ""


def read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------
# Before the steps: do the bundle's programs start, and does every library they need resolve?

def loader_verdict(problems: Sequence[str], missing_cuda: Sequence[str], selftest: bool) -> Verdict:
    """problems: "program: problem" lines from the loader's trace; missing_cuda: CUDA libraries
    not found on this machine (no matter in the self-test, which runs nothing on a GPU)."""
    if problems:
        return FAIL, f"{len(problems)} unresolved: {';'.join(problems[:3])}"
    if missing_cuda and not selftest:
        return FAIL, f"not found on this machine: {' '.join(missing_cuda)}"
    return PASS, "all resolve (bundle, CUDA, glibc)"


# ---------------------------------------------------------------------------------------------
# a. gtest programs: their XML report (--gtest_output=xml:PATH).

# The reasons our GPU tests give when they skip for lack of a device ("no CUDA device", "no GPU").
NO_GPU = re.compile(r"no (cuda|gpu)|no .*device|without a gpu", re.I)


class GtestSummary(NamedTuple):
    text: str           # "P passed, F failed, S skipped (reasons)[; failed: a.b, ...]"
    failed: bool        # a test failed, or there is no report to read
    skipped_no_gpu: bool  # a test skipped saying there is no GPU


def gtest_summary(xml_path: str) -> GtestSummary:
    try:
        cases = list(ET.parse(xml_path).getroot().iter("testcase"))
    except (OSError, ET.ParseError) as error:
        return GtestSummary(f"no test report ({error.__class__.__name__}): crashed or ran out of "
                            "time?", True, False)
    failed = [c for c in cases if c.find("failure") is not None]
    skipped = [c for c in cases if c.get("result") == "skipped" or c.find("skipped") is not None]

    def skip_reason(case):  # gtest's message is "file:line" then the reason
        element = case.find("skipped")
        lines = (element.get("message", "") if element is not None else "").strip().splitlines()
        return lines[-1][:80] if lines else ""

    reasons = collections.Counter(skip_reason(c) for c in skipped)
    passed = len(cases) - len(failed) - len(skipped)
    text = f"{passed} passed, {len(failed)} failed, {len(skipped)} skipped"
    if reasons:
        text += " (" + "; ".join(f"{n}x {r or '?'}" for r, n in reasons.most_common(3)) + ")"
    if failed:
        text += "; failed: " + ", ".join(f"{c.get('classname')}.{c.get('name')}"
                                         for c in failed[:4])
    return GtestSummary(text, bool(failed), any(NO_GPU.search(r) for r in reasons))


def gtest_verdict(status: int, limit_s: int, summary: GtestSummary, gpu_program: bool,
                  report_exists: bool, log_text: str) -> Verdict:
    """A gtest program's row. On the GPU machine a GPU program's test skipped "no CUDA device"
    is a failure: there is a GPU, so the program failed to see it."""
    if status == TIMED_OUT:
        return FAIL, f"ran out of its {limit_s} s: {summary.text}"
    if status != 0 or summary.failed:
        text = summary.text
        if not report_exists:
            text += f"; last line: {last_line(log_text)}"
        return FAIL, f"exit {status}: {text}"
    if gpu_program and summary.skipped_no_gpu:
        return FAIL, f"GPU tests skipped although this machine has a GPU: {summary.text}"
    return PASS, summary.text


# ---------------------------------------------------------------------------------------------
# b and c: `lockstep run --summary FILE` (cli/summary.cc: status, steps, final_loss,
# eval_accuracy, samples_per_second, restarts, resumed_from_step, wall_seconds, ...).

def load_run_summary(path: str) -> dict:
    """The run's summary, {} when there is none (the run did not get that far)."""
    try:
        with open(path) as f:
            value = json.load(f)
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def summary_field(summary: dict, key: str) -> str:
    """A field as the rows print it: Python's str() of the value ("None" for JSON null), "?"
    when the field is absent."""
    return str(summary.get(key, "?"))


# The line that says best why a run failed: a worker's or the manifest's error first.
_ERROR_LINE = re.compile(r"error|Error|FATAL|Check failed|not found")
_LOCKSTEP_FAILED = re.compile(r"^lockstep: .*(failed|error)")


def failure_reason(run_dir: str) -> str:
    """Why the run in run_dir failed, in at most 300 characters: the first error line of its
    make-manifest.log, validate.log or run/worker-*.log, else lockstep's own report of the
    failure, else the last line `lockstep run` printed."""
    paths = [os.path.join(run_dir, "make-manifest.log"), os.path.join(run_dir, "validate.log")]
    paths += sorted(glob.glob(os.path.join(run_dir, "run", "worker-*.log")))
    run_log = read_text(os.path.join(run_dir, "lockstep-run.log"))
    line = _first_matching((read_text(p) for p in paths), _ERROR_LINE)
    if line is None:
        line = _first_matching([run_log], _LOCKSTEP_FAILED)
    if line is None:
        line = last_line(run_log)
    return line[:300]


def _first_matching(texts: Iterable[str], pattern) -> Optional[str]:
    for text in texts:
        for line in text.splitlines():
            if pattern.search(line):
                return line
    return None


NO_TIME_LEFT = 97  # train_run's status when the budget had no room for the run
MANIFEST_FAILED = 2  # ... and when its manifest could not be written or did not validate


def train_run_verdict(status: int, summary: dict, reason: str) -> Verdict:
    """Step b's row for one device. status 97: the run did not start, no time was left."""
    if status == 0:
        return PASS, f"accuracy {summary_field(summary, 'eval_accuracy')}"
    if status == NO_TIME_LEFT:
        return SKIP, "no time left in the budget"
    return FAIL, f"exit {status}: {reason}"

ACCURACY_TOLERANCE = 0.005  # a run's test accuracy may be at most 0.5 points below its reference's


def accuracy_verdict(reference: dict, candidate: dict, names: Tuple[str, str] = ("cpu", "cuda")
                     ) -> Verdict:
    """The candidate run's test accuracy within 0.5 points of the reference run's (cuda against
    cpu; cuda bf16 against cuda fp32); SKIP unless both runs succeeded."""
    ref_name, cand_name = names
    if reference.get("status") != "succeeded" or candidate.get("status") != "succeeded":
        return SKIP, "needs both runs to have succeeded"
    ref_acc, cand_acc = reference.get("eval_accuracy"), candidate.get("eval_accuracy")
    if not _is_number(ref_acc) or not _is_number(cand_acc):
        return FAIL, f"no test accuracy to compare ({ref_name} {ref_acc}, {cand_name} {cand_acc})"
    if cand_acc < ref_acc - ACCURACY_TOLERANCE:
        return FAIL, (f"{cand_name} accuracy {cand_acc:.4f} is more than 0.5 points below "
                      f"{ref_name}'s {ref_acc:.4f}")
    return PASS, f"{cand_name} accuracy {cand_acc:.4f} vs {ref_name} {ref_acc:.4f} (within 0.5 points)"


def mean_accuracy_verdict(references: Sequence[dict], candidates: Sequence[dict],
                          names: Tuple[str, str]) -> Verdict:
    """The candidate runs' mean test accuracy within 0.5 points of the reference runs' mean (the
    same seeds on both sides: one run's accuracy after a constant learning rate moves by a point
    or more with any change of rounding, a different CPU's BLAS included). FAIL when a run failed
    (its status is not "succeeded"); SKIP when one did not run (no summary: no time left)."""
    runs = list(references) + list(candidates)
    failed = [run.get("status") for run in runs if run and run.get("status") != "succeeded"]
    if failed:
        return FAIL, f"{len(failed)} of the {len(runs)} runs did not succeed ({', '.join(failed)})"
    if not runs or any(not run for run in runs):
        return SKIP, "needs every run to have run"
    accuracies = [run.get("eval_accuracy") for run in runs]
    if not all(_is_number(value) for value in accuracies):
        return FAIL, f"no test accuracy to compare ({accuracies})"
    ref_runs, cand_runs = accuracies[:len(references)], accuracies[len(references):]
    ref, cand = statistics.mean(ref_runs), statistics.mean(cand_runs)
    each = (f"{names[0]}: {' '.join(f'{v:.4f}' for v in ref_runs)}; "
            f"{names[1]}: {' '.join(f'{v:.4f}' for v in cand_runs)}")
    if cand < ref - ACCURACY_TOLERANCE:
        return FAIL, (f"{names[1]} mean accuracy {cand:.4f} is more than 0.5 points below "
                      f"{names[0]}'s {ref:.4f} ({each})")
    return PASS, (f"{names[1]} mean {cand:.4f} vs {names[0]} {ref:.4f} over {len(ref_runs)} "
                  f"seeds ({each})")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def training_section(runs: Sequence[Tuple[str, dict]]) -> str:
    """Step b's figures, one column per run (cpu, cuda, cuda bf16), side by side ("-" where a run
    has no such figure)."""
    rows = [("status", "status", "{}"), ("steps", "steps", "{}"),
            ("final loss", "final_loss", "{:.4f}"), ("test accuracy", "eval_accuracy", "{:.4f}"),
            ("samples/s", "samples_per_second", "{:.0f}"), ("wall s", "wall_seconds", "{:.1f}")]
    lines = ["b. Fashion-MNIST, examples/fashion-mnist.yaml, 1 worker, batch 64:",
             f"  {'':16}" + "".join(f"{label:>12}" for label, _ in runs)]
    for label, key, form in rows:
        cells = []
        for _, run in runs:
            value = run.get(key)
            if value is None:
                cells.append("-")
            elif _is_number(value) or form == "{}":
                cells.append(form.format(value))
            else:
                cells.append(str(value))
        lines.append(f"  {label:16}" + "".join(f"{cell:>12}" for cell in cells))
    return "\n".join(lines) + "\n"


# c. The kill test.

KILL_TEST_SECONDS = 25       # how long the kill test's run should train
KILL_TEST_MAX_STEPS = 20000
KILL_TEST_MIN_STEPS = 1000
CHECKPOINT_INTERVAL = 200


def kill_test_steps(summary: dict, seconds: float = KILL_TEST_SECONDS,
                    most: int = KILL_TEST_MAX_STEPS) -> int:
    """About `seconds` of training at the rate step b measured on the device (so that the kill
    lands mid-run however fast or slow the device is, and the test stays short), in whole
    checkpoint intervals, between KILL_TEST_MIN_STEPS and `most`. The rate is over the whole run,
    start-up and evaluation included: on the safe side. No rate: `most`."""
    try:
        rate = float(summary["steps"]) / float(summary["wall_seconds"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        rate = 0
    steps = int(rate * seconds) // CHECKPOINT_INTERVAL * CHECKPOINT_INTERVAL if rate > 0 else most
    return min(most, max(KILL_TEST_MIN_STEPS, steps))


def kill_test_figures(summary: dict, want_steps: int, status: int) -> str:
    return (f"steps {summary_field(summary, 'steps')}/{want_steps}, resumed_from_step "
            f"{summary_field(summary, 'resumed_from_step')}, restarts "
            f"{summary_field(summary, 'restarts')}, exit {status}")


def kill_test_verdict(killed: Optional[int], note: str, status: int, summary: dict,
                      want_steps: int, reason: str) -> Verdict:
    """PASS when a worker was killed after a committed checkpoint and the run then finished at
    the manifest's step count, exit 0, having resumed from a checkpoint (step > 0) after at least
    one restart."""
    figures = kill_test_figures(summary, want_steps, status)
    if killed is None:
        why = note or "the run ended before a checkpoint was committed"
        return FAIL, f"nothing killed: {why}; {figures}; {reason}"
    steps = summary_field(summary, "steps")
    resumed = summary_field(summary, "resumed_from_step")
    restarts = summary_field(summary, "restarts")
    if (status == 0 and steps == str(want_steps) and resumed.isdigit() and int(resumed) > 0
            and restarts.isdigit() and int(restarts) >= 1):
        return PASS, figures
    return FAIL, (f"{figures} (want steps {want_steps}, resumed_from_step > 0, restarts >= 1, "
                  "exit 0)")


def kill_test_section(device: str, want_steps: int, killed: Optional[int], checkpoint: str,
                      note: str, figures: str, checkpoints_left: Sequence[str]) -> str:
    lines = [f"c. kill test ({device}, {want_steps} steps, checkpoints every "
             f"{CHECKPOINT_INTERVAL}):"]
    if killed is not None:
        lines.append(f"  killed worker {killed} after {checkpoint} was committed; {figures}")
    else:
        why = note or "no checkpoint was committed while the run lasted"
        lines.append(f"  killed nothing ({why}); {figures}")
    lines.append(f"  checkpoints left: {' '.join(checkpoints_left)}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# e. kernels_cuda_bench: its table goes into the report as printed.

def kernel_bench_section(log_text: str) -> str:
    lines = ["e. kernels_cuda_bench (goal: each kernel >= 85% of the device-to-device copy):"]
    lines += ["  " + line for line in log_text.splitlines() if not line.startswith(("$", "#"))]
    return "\n".join(lines) + "\n"


def kernel_bench_verdict(status: int, log_text: str) -> Verdict:
    if status != 0:
        return FAIL, f"exit {status} (see its log)"
    if "no CUDA device" in log_text:
        return FAIL, "it saw no CUDA device"
    return PASS, "measured (table below)"


# f. train_step_bench and torch_step.py: one line per measurement, "NAME key=value ...":
#   lockstep-cuda layers=784,256,10 batch=64 step_ms=0.1410 samples_per_s=... loss=...
#       gather_ms_one_thread=...
#   torch-eager layers=784,256,10 batch=64 step_ms=1.1510 mean_ms=... steps=300
#   torch-compile layers=... batch=... error=<the exception>

def single_thread_lines(text: str) -> str:
    """The single-gather-thread run's output, its lines renamed lockstep-cuda-1thread."""
    return re.sub(r"^lockstep-cuda ", "lockstep-cuda-1thread ", text, flags=re.M)


def lines_starting(text: str, prefix: str) -> List[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def checkpoints_taken(bench_text: str) -> bool:
    """Whether every `-ckpt` line of train_step_bench's output took a checkpoint."""
    steps = re.findall(r"last_checkpoint_step=(-?[0-9]+)", bench_text)
    return bool(steps) and all(int(step) >= 0 for step in steps)


def bench_detail(bench_text: str) -> str:
    """A train_step_bench row's detail: the step_ms of each lockstep-cuda (threaded) run."""
    figures = []
    for line in lines_starting(bench_text, "lockstep-cuda "):
        figures += re.findall(r"step_ms=[0-9.]+", line)
    return " ".join(figures)


def torch_step_verdict(status: int, log_text: str) -> Verdict:
    lines = log_text.splitlines()
    if status == 0:
        return PASS, (f"{sum('step_ms=' in line for line in lines)} figures; "
                      f"{sum('error=' in line for line in lines)} errors")
    return FAIL, f"exit {status}: {last_line(log_text)}"


STEP_TIME_COLUMNS = ["lockstep-cuda", "lockstep-cuda-1thread", "lockstep-cuda-ckpt", "torch-eager",
                     "torch-compile"]


def step_time_section(lines: Iterable[str]) -> str:
    """Step f's table: one row per (layers, batch), one column per implementation, the median
    (and min-max when there are several runs) of its step_ms; "-" for a measurement that failed
    or is missing; the gather column is one host thread's gather of one batch."""
    rows: Dict[Tuple[str, str, str], Dict[str, List[float]]] = {}
    gather: Dict[Tuple[str, str, str], List[float]] = {}
    for line in lines:
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        name = line.split()[0] if line.strip() else ""
        key = (fields.get("layers", "?"), fields.get("batch", "?"),
               fields.get("precision", "fp32"))
        if name in STEP_TIME_COLUMNS and "step_ms" in fields:
            rows.setdefault(key, {}).setdefault(name, []).append(float(fields["step_ms"]))
        elif name in STEP_TIME_COLUMNS and "error" in fields:
            rows.setdefault(key, {}).setdefault(name, [])
        if name == "lockstep-cuda" and "gather_ms_one_thread" in fields:
            gather.setdefault(key, []).append(float(fields["gather_ms_one_thread"]))

    def cell(values):
        if not values:
            return "-"
        if len(values) == 1:
            return f"{values[0]:.4f}"
        return f"{statistics.median(values):.4f} ({min(values):.3f}-{max(values):.3f})"

    out = ["f. training step, ms (TF32 off; bf16: autocast's rounding points; SGD momentum 0.9). "
           "torch: median of 300 per-step CUDA",
           "   events, inputs already on the GPU. lockstep: wall time over 300 steps of its real "
           "loop,",
           "   batches gathered on the host and copied each step; median (min-max) of 3 runs;",
           "   -1thread: one gather thread; -ckpt: asynchronous checkpoints every 50 steps;",
           "   gather: one host thread's gather of one batch.",
           f"  {'layers':28}{'batch':>6}{'prec':>6}"
           + "".join(f"{c:>26}" for c in STEP_TIME_COLUMNS) + f"{'gather':>22}"]
    for (layers, batch, precision), cells in rows.items():
        out.append(f"  {layers:28}{batch:>6}{precision:>6}"
                   + "".join(f"{cell(cells.get(c, [])):>26}" for c in STEP_TIME_COLUMNS)
                   + f"{cell(gather.get((layers, batch, precision), [])):>22}")
    if not rows:
        out.append("  (no figures)")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# d. compute-sanitizer: memcheck's "ERROR SUMMARY: N errors"; racecheck's "RACECHECK SUMMARY:
# H hazards displayed (N errors, W warnings)". One per process the tool watched.

_SANITIZER_SUMMARY = re.compile(r"ERROR SUMMARY: ([0-9]+) error"
                                r"|RACECHECK SUMMARY: [0-9]+ hazards displayed \(([0-9]+) error")


def sanitizer_version(version_text: str) -> str:
    """The release in `compute-sanitizer --version` ("Version 2025.1.0.0 ..."), or ""."""
    match = re.search(r"[0-9]{4}\.[0-9.]+", version_text)
    return match.group(0) if match else ""


def sanitizer_errors(texts: Iterable[str]) -> Tuple[int, int]:
    """(errors in all, processes reported) over the tool's output and, for `lockstep run`, the
    worker logs, where a child process's report may land."""
    errors = processes = 0
    for text in texts:
        for match in _SANITIZER_SUMMARY.finditer(text):
            errors += int(match.group(1) or match.group(2))
            processes += 1
    return errors, processes


def sanitizer_verdict(status: int, limit_s: int, texts: Sequence[str]) -> Verdict:
    errors, processes = sanitizer_errors(texts)
    if status == TIMED_OUT:
        return FAIL, (f"ran out of its {limit_s} s (narrow it with --gtest_filter); {errors} "
                      "errors so far")
    if processes == 0:
        return FAIL, f"exit {status} and no ERROR SUMMARY line (unsupported here? see its log)"
    if errors > 0:
        return FAIL, f"ERROR SUMMARY: {errors} errors ({processes} processes)"
    if status != 0:
        return FAIL, f"ERROR SUMMARY: 0 errors, but exit {status}"
    return PASS, f"ERROR SUMMARY: 0 errors ({processes} processes)"


# ---------------------------------------------------------------------------------------------
# g. Exec mode on the machine's PyTorch: the helpers' unittest run and the goodput benchmark.

_UNITTEST_RAN = re.compile(r"^Ran ([0-9]+) tests? in", re.M)
_UNITTEST_SKIPPED = re.compile(r"^(?:OK|FAILED) \(.*?skipped=([0-9]+)", re.M)


def unittest_verdict(status: int, log_text: str) -> Verdict:
    """`python3 -m unittest`: PASS when it exited 0 having run at least one test."""
    ran = _UNITTEST_RAN.search(log_text)
    count = int(ran.group(1)) if ran else 0
    skipped = _UNITTEST_SKIPPED.search(log_text)
    detail = f"{count} tests, {skipped.group(1) if skipped else 0} skipped"
    if status != 0:
        return FAIL, f"exit {status}: {detail}; {last_line(log_text)}"
    if count == 0:
        return FAIL, "no test ran"
    return PASS, detail


# bench/exec_goodput/run.py's table row: system, goodput, lost per failure, kills, lost at a kill.
_GOODPUT_ROW = re.compile(r"^(\S+)\s+([0-9.]+|nan)\s+([0-9.-]+|nan)\s+([0-9]+)\s+([0-9.-]+|nan)$",
                          re.M)


def goodput_rows(log_text: str) -> List[Tuple[str, str, str, str, str]]:
    return [match.groups() for match in _GOODPUT_ROW.finditer(log_text)]


def goodput_verdict(status: int, log_text: str) -> Verdict:
    """A measurement, not a goal: PASS when the benchmark ran to its table."""
    rows = goodput_rows(log_text)
    if status != 0 or not rows:
        return FAIL, f"exit {status}: {last_line(log_text)}"
    return PASS, "; ".join(f"{system} goodput {goodput}, lost/failure {lost} s, kills {kills}"
                           for system, goodput, lost, kills, _ in rows)
