"""Report a training program's progress to its Lockstep agent.

The agent that runs the program sets LOCKSTEP_PROGRESS_FILE; each report() appends one JSON line
to it (docs/exec.md, "Progress"), which the agent sends to `lockstep run`'s display and summary,
the job's `status.progress` (`kubectl get tj`) and its Prometheus metrics. Outside Lockstep (no
LOCKSTEP_PROGRESS_FILE: plain `python`, torchrun) report() does nothing, so a program needs no
change to run elsewhere.

    from lockstep import progress

    for step in range(start, total):
        with progress.computing():        # optional: compute time, for scaling efficiency
            loss = model(x).loss
            loss.backward()
            optimizer.step()
        progress.report(step=step + 1, samples=(step + 1) * global_batch, loss=loss,
                        total_steps=total)

Every rank may report (each rank's agent reads its own file); `samples` counts the whole job's
samples so far, not one rank's. `loss` may be a number or a one-element tensor (float() of it,
which waits for the device). A write that fails (a full disk) is reported once as a warning and
never stops training.
"""
import contextlib
import json
import math
import os
import threading
import time
import warnings
import weakref

__all__ = ["Reporter", "report", "computing", "enabled", "ENVIRONMENT_VARIABLE"]

ENVIRONMENT_VARIABLE = "LOCKSTEP_PROGRESS_FILE"


def _count(name, value):
    """A non-negative integer argument, or a TypeError/ValueError naming it."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if not isinstance(value, int):
        try:
            index = value.__index__()  # numpy and torch integers
        except (AttributeError, TypeError):
            raise TypeError(f"{name} must be an integer, got {value!r}") from None
        value = int(index)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


class Reporter:
    """Appends progress lines to one file; thread-safe.

    path: the progress file; None reads LOCKSTEP_PROGRESS_FILE (empty or unset: disabled).
    """

    def __init__(self, path=None):
        self._path = os.environ.get(ENVIRONMENT_VARIABLE, "") if path is None else path
        self._fd = None
        self._failed = False
        self._lock = threading.Lock()
        self._compute_seconds = 0.0
        self._computed = False
        if hasattr(os, "register_at_fork"):
            reporter = weakref.ref(self)  # the hook must not keep the reporter alive
            os.register_at_fork(
                after_in_child=lambda: reporter() and reporter()._after_fork_in_child())

    @property
    def enabled(self):
        """True when reports go somewhere (a path is set and no write has failed)."""
        return bool(self._path) and not self._failed

    def report(self, step, *, samples=None, loss=None, total_steps=None, compute_seconds=None):
        """Records that `step` optimizer steps are done; returns True when a line was written.

        samples: samples trained so far by the whole job; loss: the latest training loss (a
        non-finite loss is left out: JSON has no NaN); total_steps: the steps the run will take
        (for the time left); compute_seconds: seconds spent computing since the last report,
        added to what computing() measured.
        """
        line = {"step": _count("step", step)}
        if not self.enabled:
            return False  # before float(loss), which would wait for the device
        if samples is not None:
            line["samples"] = _count("samples", samples)
        if total_steps is not None:
            line["total_steps"] = _count("total_steps", total_steps)
        if loss is not None:
            try:
                value = float(loss)
            except (TypeError, ValueError):
                raise TypeError(f"loss must be a number or a one-element tensor, got {loss!r}") \
                    from None
            if math.isfinite(value):
                line["loss"] = value
        if compute_seconds is not None:
            try:
                seconds = float(compute_seconds)
            except (TypeError, ValueError):
                raise TypeError(f"compute_seconds must be a number, got {compute_seconds!r}") \
                    from None
            if not math.isfinite(seconds) or seconds < 0:
                raise ValueError(f"compute_seconds must be a finite number >= 0, got {seconds}")
        with self._lock:
            if compute_seconds is not None:
                self._compute_seconds += seconds
                self._computed = True
            if self._computed:
                line["compute_seconds"] = round(self._compute_seconds, 6)
            line["time"] = time.time()
            return self._write(json.dumps(line, separators=(",", ":")) + "\n")

    @contextlib.contextmanager
    def computing(self):
        """Times the block as compute (forward, backward, optimizer step) for the next report."""
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            with self._lock:
                self._compute_seconds += elapsed
                self._computed = True

    def close(self):
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _write(self, text):
        if not self.enabled:
            return False
        try:
            if self._fd is None:
                self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                                   0o644)
            # One write of one line to an O_APPEND file: lines of several threads or processes
            # never interleave.
            os.write(self._fd, text.encode())
            return True
        except OSError as error:
            self._failed = True
            try:
                warnings.warn(f"lockstep.progress: cannot write {self._path}: {error}; "
                              "progress is no longer reported", RuntimeWarning, stacklevel=3)
            except Exception:  # warnings turned into errors (-W error): still never stop training
                pass
            return False

    def _after_fork_in_child(self):
        # A fork while another thread held the lock would leave the child's copy held forever.
        self._lock = threading.Lock()


_default = None
_default_lock = threading.Lock()


def _reset_default_lock():
    global _default_lock
    _default_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_default_lock)


def _reporter():
    global _default
    with _default_lock:
        if _default is None:
            _default = Reporter()
        return _default


def report(step, *, samples=None, loss=None, total_steps=None, compute_seconds=None):
    """Reporter.report on the file the agent named (LOCKSTEP_PROGRESS_FILE)."""
    return _reporter().report(step, samples=samples, loss=loss, total_steps=total_steps,
                              compute_seconds=compute_seconds)


def computing():
    """Reporter.computing on the file the agent named."""
    return _reporter().computing()


def enabled():
    """True when the program runs under a Lockstep agent that reads its progress."""
    return _reporter().enabled
