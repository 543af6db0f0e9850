#!/usr/bin/python3
"""Stragglers under `lockstep run`: what one slow worker costs, how soon it is named, and what
replacing it gives back.

4 workers of the built-in trainer (MLP 784-2048-10 on Fashion-MNIST, batch 64 per worker: steps
that are mostly compute), run three times for the same wall time: undisturbed; with worker 2
slowed by a SIGSTOP/SIGCONT duty cycle (stopped --stop-ms, running --run-ms) from its first step;
and the same with spec.elastic.replaceStragglers, where the slowed process is replaced (the
slowdown stays behind with it, as a slow node does). Reports each run's step rate, relative to
the undisturbed one, the seconds from the slowdown's start to the launcher's
`straggler: worker 2` line, and for the replacing run the step rate after the replacement; a
worker named in the undisturbed run is a false positive and is reported.

  bench/straggler/run.py [--build build] [--seconds 60] [--stop-ms 30 --run-ms 30]

Logs stay in /tmp/straggler-bench-*/.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import benchlib  # noqa: E402  (bench/benchlib.py)

FASHION = "/usr/share/datasets/fashion-mnist"
STEP = re.compile(r"^step (\d+)/", re.M)


def write_manifest(path, name, replace):
    with open(path, "w") as f:
        f.write(f"""apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {{name: {name}}}
spec:
  replicas: 4
  trainer:
    model: {{type: mlp, hidden: [2048], activation: relu}}
    data:
      format: idx
      train: [file://{FASHION}/train-images-idx3-ubyte.gz, file://{FASHION}/train-labels-idx1-ubyte.gz]
    batchSize: 64
    steps: 100000000
    optimizer: {{type: sgd, learningRate: 0.05, momentum: 0.9}}
  elastic: {{replaceStragglers: {'true' if replace else 'false'}}}
  runPolicy: {{restartPolicy: Never}}
  metrics: {{port: 0}}
""")


def worker_pid(marker, index):
    for pid, cmdline in benchlib.processes_with_env(f"BENCH_MARKER={marker}",
                                                    f"LOCKSTEP_POD=straggler-{marker}-worker-{index}"):
        if cmdline.split(b"\0")[0].endswith(b"lockstep-worker"):
            return pid
    return None


def run_once(args, slowed, replace=False):
    marker = f"{'replace' if replace else 'slow' if slowed else 'calm'}{os.getpid()}"
    work = tempfile.mkdtemp(prefix=f"straggler-bench-{marker}-")
    manifest = os.path.join(work, "job.yaml")
    write_manifest(manifest, f"straggler-{marker}", replace)
    out_path = os.path.join(work, "run.out")
    env = dict(os.environ, BENCH_MARKER=marker, LOCKSTEP_RUN_PROGRESS_INTERVAL_MS="200")
    with open(out_path, "w") as out:
        proc = subprocess.Popen([os.path.join(args.build, "bin", "lockstep"), "run", manifest,
                                 "--log-dir", os.path.join(work, "logs")],
                                stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)

    def text():
        with open(out_path, errors="replace") as f:
            return f.read()

    def latest_step():
        steps = [int(s) for s in STEP.findall(text())]
        return max(steps) if steps else -1

    deadline = time.time() + 120
    while latest_step() <= 0:
        if time.time() > deadline or proc.poll() is not None:
            raise RuntimeError(f"no step within 120 s; see {work}")
        time.sleep(0.05)
    victim = worker_pid(marker, 2)
    started, first_step = time.time(), latest_step()
    named_after = None
    replaced_at, replaced_step = None, None
    while time.time() - started < args.seconds:
        if slowed and victim:
            try:
                os.kill(victim, signal.SIGSTOP)
                time.sleep(args.stop_ms / 1000)
                os.kill(victim, signal.SIGCONT)
                time.sleep(args.run_ms / 1000)
            except ProcessLookupError:
                victim = None  # replaced: its successor runs at full speed
        else:
            time.sleep(0.05)
        if named_after is None and "straggler: worker 2 " in text():
            named_after = time.time() - started
        if replaced_at is None and "a straggler's: not a restart" in text():
            replaced_at, replaced_step = time.time(), latest_step()
    ended, last_step = time.time(), latest_step()
    rate = (last_step - first_step) / (ended - started)
    after = None
    if replaced_at is not None and ended - replaced_at > 5:
        after = (last_step - replaced_step) / (ended - replaced_at)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=60)
    named = sorted(set(re.findall(r"straggler: worker (\d+) ", text())))
    return rate, named_after, named, work, after


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build")
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--stop-ms", type=float, default=30)
    p.add_argument("--run-ms", type=float, default=30)
    args = p.parse_args()
    calm_rate, _, calm_named, calm_work, _ = run_once(args, slowed=False)
    slow_rate, named_after, slow_named, slow_work, _ = run_once(args, slowed=True)
    rep_rate, rep_named_after, rep_named, rep_work, rep_after = run_once(args, slowed=True,
                                                                         replace=True)
    print(f"undisturbed: {calm_rate:.1f} steps/s, named: {calm_named or 'nobody'} ({calm_work})")

    def named_text(after):
        return (f"{after:.1f} s after the slowdown began" if after is not None else "never")

    print(f"worker 2 stopped {args.stop_ms:.0f} ms of every {args.stop_ms + args.run_ms:.0f}: "
          f"{slow_rate:.1f} steps/s ({slow_rate / calm_rate:.2f} of undisturbed), named: "
          f"{slow_named or 'nobody'}, worker 2 named {named_text(named_after)} ({slow_work})")
    print(f"the same, replaceStragglers: {rep_rate:.1f} steps/s over the run "
          f"({rep_rate / calm_rate:.2f}), worker 2 named and replaced "
          f"{named_text(rep_named_after)}, after the replacement "
          + (f"{rep_after:.1f} steps/s ({rep_after / calm_rate:.2f})" if rep_after else "n/a")
          + f" ({rep_work})")


if __name__ == "__main__":
    main()
