#!/usr/bin/python3
"""Stragglers under `lockstep run`: what one slow worker costs, and how soon it is named.

4 workers of the built-in trainer (MLP 784-2048-10 on Fashion-MNIST, batch 64 per worker: steps
that are mostly compute), run twice for the same wall time: undisturbed, then with worker 2
slowed by a SIGSTOP/SIGCONT duty cycle (stopped --stop-ms, running --run-ms) from its first step.
Reports each run's step rate, the slowed run's relative rate, and the seconds from the
slowdown's start to the launcher's `straggler: worker 2` line; a worker named in the undisturbed
run is a false positive and is reported.

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


def write_manifest(path, name):
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
  runPolicy: {{restartPolicy: Never}}
  metrics: {{port: 0}}
""")


def worker_pid(marker, index):
    for pid, cmdline in benchlib.processes_with_env(f"BENCH_MARKER={marker}",
                                                    f"LOCKSTEP_POD=straggler-{marker}-worker-{index}"):
        if cmdline.split(b"\0")[0].endswith(b"lockstep-worker"):
            return pid
    return None


def run_once(args, slowed):
    marker = f"{'slow' if slowed else 'calm'}{os.getpid()}"
    work = tempfile.mkdtemp(prefix=f"straggler-bench-{marker}-")
    manifest = os.path.join(work, "job.yaml")
    write_manifest(manifest, f"straggler-{marker}")
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
    while time.time() - started < args.seconds:
        if slowed and victim:
            os.kill(victim, signal.SIGSTOP)
            time.sleep(args.stop_ms / 1000)
            os.kill(victim, signal.SIGCONT)
            time.sleep(args.run_ms / 1000)
        else:
            time.sleep(0.05)
        if named_after is None and "straggler: worker 2 " in text():
            named_after = time.time() - started
    rate = (latest_step() - first_step) / (time.time() - started)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=60)
    named = sorted(set(re.findall(r"straggler: worker (\d+) ", text())))
    return rate, named_after, named, work


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build")
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--stop-ms", type=float, default=30)
    p.add_argument("--run-ms", type=float, default=30)
    args = p.parse_args()
    calm_rate, _, calm_named, calm_work = run_once(args, slowed=False)
    slow_rate, named_after, slow_named, slow_work = run_once(args, slowed=True)
    print(f"undisturbed: {calm_rate:.1f} steps/s, named: {calm_named or 'nobody'} ({calm_work})")
    print(f"worker 2 stopped {args.stop_ms:.0f} ms of every {args.stop_ms + args.run_ms:.0f}: "
          f"{slow_rate:.1f} steps/s ({slow_rate / calm_rate:.2f} of undisturbed), named: "
          f"{slow_named or 'nobody'}, worker 2 named "
          + (f"{named_after:.1f} s after the slowdown began" if named_after is not None
             else "never") + f" ({slow_work})")


if __name__ == "__main__":
    main()
