"""What the Python benchmarks share: a free port, and finding processes by their environment.

Each benchmark is a standalone script (`python3 bench/<name>/run.py`); it puts this folder on its
path and imports this module.
"""

import os
import socket


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes_with_env(*needles):
    """(pid, cmdline bytes) of the processes whose environment holds every `KEY=value` in
    needles (a benchmark marks what it starts with a unique BENCH_MARKER)."""
    wanted = [needle.encode() for needle in needles]
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if all(needle in env for needle in wanted):
            found.append((int(entry), cmdline))
    return found
