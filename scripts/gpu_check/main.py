"""gpu-check's command line and the run from start to summary (see the package's docstring)."""
import os
import shutil
import signal
import sys
import time
from typing import List, NamedTuple, Optional

from . import machine, process, steps, verdicts
from .budget import Budget, budget_from_environment
from .report import FAIL, Report, say

WORK = "/tmp/lockstep-gpu"  # where the bundle is unpacked; the manifests are rewritten to it

USAGE = """\
Lockstep's checks on a GPU machine, in one command and under 10 minutes.

  scripts/gpu-check.sh                    from the repository root, with the archive of
                                          scripts/gpu-bundle.sh in gpu-bundle/
  scripts/gpu-check.sh --bundle ARCHIVE   another archive
  scripts/gpu-check.sh --cpu-selftest     on a machine without a GPU: only steps b and c, with
                                          device cpu, to check this script and the bundle
  scripts/gpu-check.sh --steps a,b,f      only these steps (a letter, or a whole label such as
                                          "a. trainer_device_test"), e.g. to check a fix again
"""

EXIT_PASSED, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2


class Refused(Exception):
    """The check cannot run here (no GPU, no archive, bad arguments): exit 2, saying why."""


class UsageError(Refused):
    """Bad arguments: exit 2, printed without "refused:" (as the shell script printed it)."""


class Options(NamedTuple):
    bundle: str
    selftest: bool
    help: bool = False
    steps: Optional[List[str]] = None  # None: every step


def selected(label: str, wanted: Optional[List[str]]) -> bool:
    """Whether the step of `label` ("b", "a. kernels_test") is among --steps' `wanted`."""
    return wanted is None or label in wanted or label.split(".")[0] in wanted


def repository_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_arguments(argv: List[str], root: str) -> Options:
    bundle = os.path.join(root, "gpu-bundle", "lockstep-gpu-bundle.tar.xz")
    selftest = False
    wanted: Optional[List[str]] = None
    i = 0
    while i < len(argv):
        argument = argv[i]
        if argument == "--bundle":
            if i + 1 >= len(argv) or not argv[i + 1]:
                raise UsageError("--bundle needs an archive")
            bundle = argv[i + 1]
            i += 2
        elif argument == "--steps":
            wanted = [item.strip() for item in (argv[i + 1] if i + 1 < len(argv) else "").split(",")
                      if item.strip()]
            if not wanted:
                raise UsageError("--steps needs a list of steps, e.g. a,b,f")
            i += 2
        elif argument == "--cpu-selftest":
            selftest = True
            i += 1
        elif argument in ("-h", "--help"):
            return Options(bundle, selftest, help=True)
        else:
            raise UsageError(f"unknown argument {argument} (see --help)")
    if wanted is not None:
        known = {label for label, _ in steps.plan(selftest)}
        known |= {label.split(".")[0] for label in known}
        unknown = [item for item in wanted if item not in known]
        if unknown:
            raise UsageError(f"--steps: no step {', '.join(unknown)} (steps: "
                             f"{', '.join(sorted(known))})")
    return Options(bundle, selftest, steps=wanted)


def main(argv: Optional[List[str]] = None, environ=None, work: str = WORK,
         root: Optional[str] = None) -> int:
    """Runs the check; returns the exit status (0 passed or skipped, 1 a step failed, 2 refused).

    environ is read for OUT and LOCKSTEP_GPU_CHECK_BUDGET_S (default: os.environ); the programs
    under test run in os.environ, with LD_LIBRARY_PATH set for the bundle. root: the repository
    (the default archive is in its gpu-bundle/, results without OUT go to its build/gpu-check/).
    """
    argv = sys.argv[1:] if argv is None else argv
    environ = os.environ if environ is None else environ
    root = repository_root() if root is None else root
    previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return _run(argv, environ, work, root)
    except UsageError as why:
        print(f"gpu-check: {why}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    except Refused as why:
        print(f"gpu-check: refused: {why}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return 130
    finally:
        # A background `lockstep run` (the kill test) stops its workers on SIGTERM.
        process.stop_background()
        signal.signal(signal.SIGTERM, previous_handler)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(143)


def _run(argv: List[str], environ, work: str, root: str) -> int:
    started = time.monotonic()  # the budget counts from here
    options = parse_arguments(argv, root)
    if options.help:
        print(USAGE, end="")
        return EXIT_PASSED
    try:
        budget = Budget(budget_from_environment(environ), started=started)
    except ValueError as error:
        raise UsageError(str(error))
    device_tool = bool(environ.get("OUT"))
    if device_tool:  # the tool brings back $OUT: the summary and one archive of the logs
        result_dir, log_dir = environ["OUT"], os.path.join(work, "logs")
    else:
        result_dir = os.path.join(root, "build", "gpu-check")
        log_dir = os.path.join(result_dir, "logs")

    # Refuse before touching anything when there is no GPU.
    if not options.selftest:
        reason = machine.gpu_missing_reason()
        if reason:
            raise Refused(f"no usable GPU on this machine: {reason}. Run it on a GPU machine "
                          "(or use --cpu-selftest to check the CPU steps of this script).")
    if not os.path.isfile(options.bundle):
        raise Refused(f"no archive at {options.bundle}: run scripts/gpu-bundle.sh on the build "
                      "machine and carry gpu-bundle/ along (device tool: carry=[\"gpu-bundle\"]).")

    problem = machine.unpack(options.bundle, work)
    if problem:
        raise Refused(problem)
    shutil.rmtree(log_dir, ignore_errors=True)
    os.makedirs(log_dir)
    if device_tool:
        for name in ("summary.txt", "logs.tar.gz"):
            try:
                os.remove(os.path.join(result_dir, name))
            except OSError:
                pass

    report = Report(budget, log_dir, result_dir, device_tool)
    ctx = steps.Context(work=work, log_dir=log_dir, selftest=options.selftest, budget=budget,
                        report=report)
    prepare_machine(ctx, options)
    for label, step in steps.plan(options.selftest):
        if selected(label, options.steps):
            step(ctx)

    report.publish()
    if device_tool:
        say("logs: $OUT/logs.tar.gz; summary: $OUT/summary.txt")
    with open(report.summary_path()) as f:
        print("\n" + f.read(), end="", flush=True)
    return EXIT_FAILED if report.failures else EXIT_PASSED


def prepare_machine(ctx: steps.Context, options: Options) -> None:
    """Finds this machine's CUDA libraries and GCC runtime, sets LD_LIBRARY_PATH for every program
    run from here on, writes what the summary says about the machine, and records whether the
    bundle's programs start and find their libraries (the first rows)."""
    bundle_info_path = os.path.join(ctx.work, "BUNDLE-INFO")
    info = machine.read_bundle_info(bundle_info_path)
    cache = machine.ldconfig_listing()
    libraries = machine.find_cuda_libraries(
        machine.cuda_library_names(info), machine.nvidia_package_roots(),
        machine.CUDA_TOOLKIT_DIRS, cache)
    library_path = machine.library_path_for(ctx.work, libraries)

    # The GCC runtime: this machine's own unless the loader says it is too old for our programs.
    # The same trace names any other library or symbol the programs cannot find here.
    bin_dir = os.path.join(ctx.work, "bin")
    gcc_runtime = "this machine's"
    problems = machine.loader_problems(bin_dir, library_path)
    if problems:
        fallback_path = f"{library_path}:{os.path.join(ctx.work, 'lib', 'gcc-fallback')}"
        fallback_problems = machine.loader_problems(bin_dir, fallback_path)
        if machine.prefer_bundled_gcc_runtime(problems, fallback_problems):
            library_path = fallback_path
            gcc_runtime = "the bundle's (this machine's is missing or too old)"
            problems = fallback_problems
    os.environ["LD_LIBRARY_PATH"] = library_path
    # PyTorch as the steps will see it: with this LD_LIBRARY_PATH.
    ctx.torch_version = machine.probe_torch().version

    lines = [f"bundle: {options.bundle} (commit {info.get('commit', '')})"]
    if options.selftest:
        lines.append("mode: --cpu-selftest (no GPU steps; device cpu for b and c)")
    else:
        lines += machine.gpu_lines()
    lines.append(machine.host_line(info, ctx.torch_version))
    lines.append("CUDA libraries:")
    lines += [f"  {name}: {path if path else 'NOT FOUND'}" for name, path in libraries]
    lines.append("  libcuda.so.1 (driver): "
                 f"{machine.ldconfig_lookup(cache, 'libcuda.so.1') or 'not in the loader cache'}")
    lines.append(f"GCC runtime: {gcc_runtime}")
    lines.append(f"LD_LIBRARY_PATH={library_path}")
    ctx.report.machine_lines = lines
    print("\n".join(lines), flush=True)
    with open(ctx.log("machine.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
        f.write("--- BUNDLE-INFO\n" + verdicts.read_text(bundle_info_path))
        if not options.selftest:
            f.write("--- nvidia-smi\n" + machine.nvidia_smi_output())

    # A program actually started from the unpacked folder (a /tmp mounted noexec would stop
    # everything here, with this message).
    status, started = process.run_captured([ctx.program("lockstep"), "version"],
                                           machine.QUERY_TIMEOUT_S)
    if status != 0:
        ctx.record("loader: bin/lockstep starts", FAIL, started.rstrip("\n")[:300])
    if problems:
        with open(ctx.log("loader-problems.txt"), "w") as f:
            f.write("\n".join(problems) + "\n")
    missing_cuda = [name for name, path in libraries if path is None]
    state, detail = verdicts.loader_verdict(problems, missing_cuda, options.selftest)
    ctx.record("loader: every program's libraries", state, detail)
