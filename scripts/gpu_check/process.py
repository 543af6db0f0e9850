"""Running the programs under test: every one under a time limit, none outliving the check.

Each program runs in a process group of its own (a new session), so that a limit, or the end of
the check, stops the program together with whatever it started (`lockstep run` starts workers).
Statuses are reported as a shell reports them, which is what the report's rows have always said:
128 + N for a program ended by signal N, 124 for one that ran out of its limit (as timeout(1)
says it), 126/127 for one that could not be started.
"""
import os
import signal
import subprocess
import time
from typing import IO, List, Optional, Sequence, Tuple

TIMED_OUT = 124
KILL_AFTER_S = 10  # after SIGTERM at the limit, SIGKILL this much later (timeout --kill-after=10)

# Programs started in the background and not yet waited for: stop_background() ends them when the
# check itself ends early (the device tool's limit, Ctrl-C).
_background: List[subprocess.Popen] = []


def shell_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the program's group, SIGKILL KILL_AFTER_S later if the program is still there."""
    _signal_group(process, signal.SIGTERM)
    try:
        process.wait(timeout=KILL_AFTER_S)
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
        process.wait()


def _not_started(argv: Sequence[str], error: OSError, output: Optional[IO[str]]) -> int:
    if output is not None:
        output.write(f"gpu-check: cannot run {argv[0]}: {error}\n")
        output.flush()
    return 127 if isinstance(error, FileNotFoundError) else 126


def run_limited(argv: Sequence[str], limit_s: float, output: IO[str], env=None) -> int:
    """Runs argv with stdout and stderr into `output` (an open file); returns its shell status."""
    try:
        process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True, env=env)
    except OSError as error:
        return _not_started(argv, error, output)
    try:
        return shell_status(process.wait(timeout=limit_s))
    except subprocess.TimeoutExpired:
        _stop_group(process)
        return TIMED_OUT
    finally:
        if process.returncode is None:  # the check is ending (an exception): take it along
            _signal_group(process, signal.SIGKILL)
            process.wait()


def run_logged(limit_s: int, log_path: str, argv: Sequence[str], header: bool = True) -> int:
    """Runs argv under limit_s, output to log_path after a line naming the command and its limit.

    Returns its shell status (TIMED_OUT when it ran out of time).
    """
    with open(log_path, "w") as log:
        if header:
            log.write(f"$ {' '.join(argv)}\n# time limit {limit_s} s; "
                      f"LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')}\n")
            log.flush()
        return run_limited(argv, limit_s, log)


def run_captured(argv: Sequence[str], limit_s: float, stderr_too: bool = True,
                 env=None) -> Tuple[int, str]:
    """Runs a short query (nvidia-smi, ldconfig -p, the loader's trace) and returns
    (shell status, its output); TIMED_OUT and what it wrote so far when it ran out of time."""
    try:
        process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT if stderr_too else subprocess.DEVNULL,
                                   start_new_session=True, env=env)
    except OSError as error:
        return _not_started(argv, error, None), f"cannot run {argv[0]}: {error}"
    try:
        out, _ = process.communicate(timeout=limit_s)
        status = shell_status(process.returncode)
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
        out, _ = process.communicate()
        status = TIMED_OUT
    finally:
        if process.returncode is None:
            _signal_group(process, signal.SIGKILL)
            process.wait()
    return status, out.decode(errors="replace")


class Background:
    """A program running while the check watches it (the kill test's `lockstep run`)."""

    def __init__(self, argv: Sequence[str], log_path: str):
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        _background.append(self.process)

    def running(self) -> bool:
        return self.process.poll() is None

    def wait_until(self, deadline: float, poll_s: float) -> bool:
        """Waits for it to end until time.monotonic() reaches deadline; True if it ended."""
        while self.running() and time.monotonic() < deadline:
            time.sleep(poll_s)
        return not self.running()

    def stop(self, grace_s: float = 6) -> None:
        """SIGTERM (it stops its own workers), then SIGKILL to its group after grace_s."""
        if self.running():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.process, signal.SIGKILL)
        self.process.wait()
        self._forget()

    def status(self) -> int:
        """Waits for it and returns its shell status."""
        status = shell_status(self.process.wait())
        self._forget()
        return status

    def _forget(self) -> None:
        if self.process in _background:
            _background.remove(self.process)


def worker_pid(manifest: str, proc: str = "/proc") -> Optional[int]:
    """The pid of the lockstep-worker that `lockstep run` started with this manifest copy
    (argv: .../lockstep-worker train --manifest MANIFEST), from /proc: procps may be absent on
    the GPU machine."""
    wanted = f"lockstep-worker train --manifest {manifest} "
    for entry in sorted(os.listdir(proc)):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "cmdline"), "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if wanted in cmdline:
            return int(entry)
    return None


def stop_background() -> None:
    """SIGTERM to every background program still running: the check is ending."""
    for process in list(_background):
        if process.poll() is None:
            try:
                process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    _background.clear()
