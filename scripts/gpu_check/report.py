"""The check's report: one row per step, sections of figures, and the summary they make.

The summary is written to summary.txt after every row (and, under the device tool, the logs are
packed into logs.tar.gz as well), so that a run cut short by the tool's limit still brings back
what it did. The format is what docs/gpu.md and docs/benchmarks.md quote:

    =============== Lockstep GPU check (2026-11-24T10:00:00Z) ===============
    <machine lines>

    step                                                 state   secs  detail
    a. cuda_kernels_test                                 PASS       4  29 passed, 0 failed, 0 skipped
    ...

    <each section, in the order of its key: b-training, c-kill, e-kernels, f-step-time,
     g-goodput>

    total 312 s of a 540 s budget; 0 step(s) failed; logs: $OUT/logs.tar.gz
"""
import datetime
import os
import tarfile
from typing import Dict, List, NamedTuple, Optional, Sequence

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"

# The device tool brings back files of at most 16 MiB: a log over 4 MiB keeps its first and last
# 2 MiB.
LOG_CAP_BYTES = 4 * 1024 * 1024
LOG_KEEP_BYTES = 2 * 1024 * 1024
CUT_NOTE = b"\n[... gpu-check: cut to its first and last 2 MiB ...]\n"


class Row(NamedTuple):
    name: str
    state: str  # PASS, FAIL or SKIP
    seconds: int
    detail: str


def say(text: str) -> None:
    print(f"gpu-check: {text}", flush=True)


def table_line(name: str, state: str, seconds, detail: str) -> str:
    return f"{name:<52} {state:<5} {seconds!s:>6}  {detail}"


def render_summary(rows: Sequence[Row], machine_lines: Sequence[str], sections: Dict[str, str],
                   total_s: int, budget_s: int, logs: str, now: datetime.datetime) -> str:
    """The summary's text. sections maps a key (its order) to text ending in a newline."""
    lines = [f"=============== Lockstep GPU check ({now:%Y-%m-%dT%H:%M:%SZ}) ==============="]
    lines += machine_lines
    lines.append("")
    lines.append(table_line("step", "state", "secs", "detail"))
    lines += [table_line(row.name, row.state, row.seconds, row.detail) for row in rows]
    text = "\n".join(lines) + "\n"
    for key in sorted(sections):
        text += "\n" + sections[key]
    failures = sum(1 for row in rows if row.state == FAIL)
    text += (f"\ntotal {total_s} s of a {budget_s} s budget; {failures} step(s) failed; "
             f"logs: {logs}\n")
    return text


def cap_large_logs(log_dir: str) -> None:
    """Cuts every file over LOG_CAP_BYTES under log_dir to its first and last LOG_KEEP_BYTES."""
    for folder, _, files in os.walk(log_dir):
        for name in files:
            path = os.path.join(folder, name)
            try:
                if os.path.islink(path) or os.path.getsize(path) <= LOG_CAP_BYTES:
                    continue
                with open(path, "rb") as f:
                    head = f.read(LOG_KEEP_BYTES)
                    f.seek(-LOG_KEEP_BYTES, os.SEEK_END)
                    tail = f.read()
                with open(path + ".cut", "wb") as f:
                    f.write(head + CUT_NOTE + tail)
                os.replace(path + ".cut", path)
            except OSError:
                pass


def write_atomically(path: str, text: str) -> None:
    with open(path + ".partial", "w") as f:
        f.write(text)
    os.replace(path + ".partial", path)


def pack_logs(log_dir: str, archive: str) -> bool:
    """log_dir as archive (a .tar.gz holding its folder by name); False, and the previous archive
    left as it was, when packing failed."""
    partial = archive + ".partial"
    try:
        with tarfile.open(partial, "w:gz") as tar:
            tar.add(log_dir, arcname=os.path.basename(log_dir.rstrip("/")))
        os.replace(partial, archive)
        return True
    except (OSError, tarfile.TarError):
        try:
            os.remove(partial)
        except OSError:
            pass
        return False


class Report:
    """The rows so far and where they are published.

    log_dir: the steps' logs (sections are written there too, as report-<key>.txt);
    result_dir: where summary.txt (and logs.tar.gz) go; device_tool: $OUT is set, so the logs are
    packed into result_dir/logs.tar.gz (the tool brings back files, not folders).
    """

    def __init__(self, budget, log_dir: str, result_dir: str, device_tool: bool):
        self.budget = budget
        self.log_dir = log_dir
        self.result_dir = result_dir
        self.device_tool = device_tool
        self.rows: List[Row] = []
        self.sections: Dict[str, str] = {}
        self.machine_lines: List[str] = []
        self._row_started_s = budget.elapsed_s()

    @property
    def failures(self) -> int:
        return sum(1 for row in self.rows if row.state == FAIL)

    def record(self, name: str, state: str, detail: str) -> None:
        """A row. Its seconds are those since the previous row: the steps run one after the
        other, each ending in its row(s)."""
        now_s = self.budget.elapsed_s()
        self.rows.append(Row(name, state, now_s - self._row_started_s, detail))
        self._row_started_s = now_s
        say(f"[{state}] {name}: {detail}")
        self.publish()

    def add_section(self, key: str, text: str) -> None:
        """A section of figures printed after the table, in the order of the keys."""
        if not text.endswith("\n"):
            text += "\n"
        self.sections[key] = text
        with open(os.path.join(self.log_dir, f"report-{key}.txt"), "w") as f:
            f.write(text)

    def summary(self, now: Optional[datetime.datetime] = None) -> str:
        now = now or datetime.datetime.now(datetime.timezone.utc)
        logs = "$OUT/logs.tar.gz" if self.device_tool else self.log_dir
        return render_summary(self.rows, self.machine_lines, self.sections,
                              self.budget.elapsed_s(), self.budget.total_s, logs, now)

    def summary_path(self) -> str:
        return os.path.join(self.result_dir, "summary.txt")

    def publish(self) -> None:
        os.makedirs(self.result_dir, exist_ok=True)
        write_atomically(self.summary_path(), self.summary())
        if self.device_tool and os.path.isdir(self.log_dir):
            cap_large_logs(self.log_dir)
            pack_logs(self.log_dir, os.path.join(self.result_dir, "logs.tar.gz"))
