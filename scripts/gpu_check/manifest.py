"""The training manifests of steps b, c and d: the bundle's examples/fashion-mnist.yaml, rewritten.

Rewritten as text (the GPU machine has no YAML library, and the rewrites are few): the bundle's
copy of the data, one replica, the device (and precision and seed, when given), the step count, the metrics endpoint on a free port
(the example's 9400 is also dcgm-exporter's, which GPU machines often run), and for the kill test
checkpoints every 200 steps with restartPolicy OnFailure. Every rewrite must match exactly once
(the data paths four times), or the example changed under us and ManifestError says so.
"""
import re
import socket
from typing import Optional

from .verdicts import CHECKPOINT_INTERVAL

DATASET_URI = "file:///usr/share/datasets/fashion-mnist/"


class ManifestError(Exception):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rewrite_manifest(text: str, work: str, device: str, steps: Optional[int], port: int,
                     checkpoint: bool = False, precision: Optional[str] = None,
                     seed: Optional[int] = None) -> str:
    """The example's text for one run: steps None keeps the example's own step count."""

    def rewrite(pattern, replacement, count=1):
        nonlocal text
        text, n = re.subn(pattern, replacement, text, flags=re.M)
        if n != count:
            raise ManifestError(f"{pattern!r} matched {n} times in the example, expected {count}")

    rewrite(re.escape(DATASET_URI), f"file://{work}/data/fashion-mnist/", count=4)
    rewrite(r"^(\s+)replicas:\s*\d+.*$", r"\g<1>replicas: 1")
    rewrite(r"^(\s+)device:\s*\w+.*$", rf"\g<1>device: {device}"
            + (rf"\n\g<1>precision: {precision}" if precision else ""))
    if steps is not None:
        rewrite(r"^(\s+)steps:\s*\d+.*$", rf"\g<1>steps: {steps}")
    if seed is not None:
        rewrite(r"^(\s+)seed:\s*\d+.*$", rf"\g<1>seed: {seed}")
    rewrite(r"^(\s+)metrics:.*$", rf"\g<1>metrics: {{port: {port}}}")
    if checkpoint:
        rewrite(r"^(\s+)restartPolicy:\s*\w+.*$",
                r"\g<1>restartPolicy: OnFailure\n\g<1>backoffLimit: 3")
        text = text.rstrip("\n") + (f"\n  checkpoint: {{uri: file://{work}/ckpt, intervalSteps: "
                                    f"{CHECKPOINT_INTERVAL}, keep: 3, async: true}}\n")
    return text


def make_manifest(example: str, out: str, work: str, device: str, steps: Optional[int],
                  checkpoint: bool = False, precision: Optional[str] = None,
                  seed: Optional[int] = None) -> None:
    """Writes the rewritten example to out; ManifestError (or OSError) when it cannot."""
    with open(example) as f:
        text = f.read()
    text = rewrite_manifest(text, work, device, steps, free_port(), checkpoint, precision, seed)
    with open(out, "w") as f:
        f.write(text)
