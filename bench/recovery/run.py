#!/usr/bin/python3
"""Recovery time after a worker is killed: Lockstep's elastic `lockstep run` vs torchrun.

Both train the same MLP (784-128-10, ReLU, SGD, batch 64 per worker) on Fashion-MNIST with N
workers (default 3) on this machine; once the job has trained --kill-at-step steps, one worker
process gets SIGKILL. Recovery is the time from the kill to training again:

  * Lockstep (`lockstep run`, restartPolicy OnFailure): the survivors re-form without the dead
    worker and go on with their state. Reported: `recovery_seconds` from the summary (measured
    by the rendezvous service: generation ended -> first step past the survivors' state), and a
    cross-check from the logs: kill time -> the first "step" log line of rank 0 in the next
    generation (worker logs carry wall-clock timestamps with milliseconds).
  * torchrun (`--rdzv_backend=c10d --max_restarts=3`; Debian's torch 1.13 spells the flags with
    underscores and needs `--redirects 2 --tee 1`) running examples/pytorch/train_ddp.py, which appends a timestamped line per step
    to a timeline: kill time -> the first step line of the restarted group (restart count 1).
    torchrun restarts every worker and resumes from the script's checkpoint (every 20 steps).

Each system runs --reps times; the medians and the ratio are printed. Logs: /tmp/recovery-*/.

With --standby, Lockstep runs twice per rep, without and with one hot standby
(spec.elastic.standby: 1), and torchrun not at all. What a standby changes is when the job is
back at full size: "full" is the time from the kill to rank 0's first step in a generation of
--workers ranks (without a standby: the replacement's start, data load and join, and a second
re-formation; with one: the standby is already waiting).

  bench/recovery/run.py [--build build-elastic] [--workers 3] [--reps 3] [--standby]
"""
import argparse
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import benchlib  # noqa: E402  (bench/benchlib.py)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FASHION = "/usr/share/datasets/fashion-mnist"
DDP_SCRIPT = os.path.join(REPO, "examples", "pytorch", "train_ddp.py")
RUN_TIMEOUT_S = 300


def wait_for(condition, timeout_s, what, process):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if condition():
            return
        if process.poll() is not None:
            raise RuntimeError(f"{what}: it exited {process.returncode} first")
        time.sleep(0.01)
    raise TimeoutError(what)


def lockstep_manifest(path, name, workers, steps, standby=0):
    elastic = f"\n  elastic: {{standby: {standby}}}" if standby else ""
    with open(path, "w") as f:
        f.write(f"""apiVersion: lockstep.io/v1alpha1
kind: TrainingJob
metadata: {{name: {name}}}
spec:
  replicas: {workers}{elastic}
  trainer:
    model: {{type: mlp, hidden: [128], activation: relu}}
    data:
      format: idx
      train: [file://{FASHION}/train-images-idx3-ubyte.gz, file://{FASHION}/train-labels-idx1-ubyte.gz]
    batchSize: 64
    steps: {steps}
    optimizer: {{type: sgd, learningRate: 0.05, momentum: 0.9}}
    logIntervalSteps: 1
  runPolicy: {{restartPolicy: OnFailure, backoffLimit: 3}}
  metrics: {{port: 0}}
""")


def log_time(line):
    """Wall time (epoch seconds) of a worker log line '2026-11-21T22:36:05.867Z ...'."""
    stamp = line.split(" ", 1)[0]
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def run_lockstep(build, workers, steps, kill_at_step, work, standby=0):
    name = f"recovery-{os.getpid()}-{int(time.time() * 1000) % 100000}"
    manifest = os.path.join(work, name + ".yaml")
    lockstep_manifest(manifest, name, workers, steps, standby)
    out_path = os.path.join(work, name + ".out")
    summary_path = os.path.join(work, name + ".json")
    log_dir = os.path.join(work, name + "-logs")
    env = dict(os.environ, LOCKSTEP_RUN_PROGRESS_INTERVAL_MS="20", LOCKSTEP_LOG_LEVEL="info")
    with open(out_path, "w") as out:
        run = subprocess.Popen([os.path.join(build, "bin", "lockstep"), "run", manifest,
                                "--summary", summary_path, "--log-dir", log_dir],
                               stdout=out, stderr=subprocess.STDOUT, env=env)

    def step():
        steps_seen = [int(m) for m in re.findall(r"step (\d+)/", open(out_path).read())]
        return max(steps_seen, default=-1)

    wait_for(lambda: step() >= kill_at_step, RUN_TIMEOUT_S, "lockstep never reached the step", run)
    # A worker of the first generation (with a standby, the one that has not joined stands by).
    trainer = 1
    if standby:
        joined = [i for i in range(workers + standby)
                  if "joined generation 1 " in open(os.path.join(log_dir, f"worker-{i}.log"),
                                                      errors="replace").read()]
        trainer = joined[1]
    victim = [p for p, _ in benchlib.processes_with_env(f"LOCKSTEP_JOB=default/{name}",
                                                        f"LOCKSTEP_POD={name}-worker-{trainer}")
              if open(f"/proc/{p}/stat").read().split()[3] == str(run.pid)]
    killed_at = time.time()
    os.kill(victim[0], signal.SIGKILL)
    run.wait(RUN_TIMEOUT_S)
    if run.returncode != 0:
        raise RuntimeError(f"lockstep run exited {run.returncode}; see {out_path}")
    summary = json.load(open(summary_path))
    # Cross-check: the first step logged by rank 0 of a generation formed after the kill; and
    # the first in a generation of every worker (back at full size).
    worlds = {}
    lines = []
    for log in os.listdir(log_dir):
        if not log.startswith("worker-"):
            continue
        for line in open(os.path.join(log_dir, log), errors="replace"):
            joined = re.search(r"joined generation (\d+) as rank \d+ of (\d+)", line)
            if joined:
                worlds[int(joined.group(1))] = int(joined.group(2))
            m = re.search(r"rank=0 gen=(\d+)\] step \d+/", line)
            if m and int(m.group(1)) >= 2:
                lines.append((log_time(line), int(m.group(1))))
    after = [t for t, _ in lines if t > killed_at]
    full = [t for t, g in lines if t > killed_at and worlds.get(g) == workers]
    from_logs = min(after) - killed_at if after else float("nan")
    summary["full_size_seconds"] = min(full) - killed_at if full else float("nan")
    return summary["recovery_seconds"], from_logs, summary


def run_torchrun(workers, steps, kill_at_step, work):
    tag = f"torchrun-{os.getpid()}-{int(time.time() * 1000) % 100000}"
    timeline = os.path.join(work, tag + ".timeline")
    checkpoint = os.path.join(work, tag + ".pt")
    log_path = os.path.join(work, tag + ".log")
    env = dict(os.environ, BENCH_MARKER=tag, OMP_NUM_THREADS="1")
    with open(log_path, "w") as log:
        run = subprocess.Popen(
            ["/usr/bin/torchrun", "--nnodes=1", f"--nproc_per_node={workers}",
             "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{benchlib.free_port()}",
             "--max_restarts=3", "--redirects", "2", "--tee", "1",
             DDP_SCRIPT, "--steps", str(steps), "--hidden", "128", "--batch-size", "64",
             "--timeline", timeline, "--checkpoint", checkpoint, "--checkpoint-every", "20"],
            stdout=log, stderr=subprocess.STDOUT, env=env)

    def events():
        if not os.path.exists(timeline):
            return []
        return [json.loads(l) for l in open(timeline) if l.strip().endswith("}")]

    wait_for(lambda: any(e.get("event") == "step" and e["step"] >= kill_at_step
                         for e in events()), RUN_TIMEOUT_S, "torchrun never reached the step",
             run)
    victim = [p for p, cmdline in benchlib.processes_with_env(f"BENCH_MARKER={tag}", "RANK=1",
                                                               "LOCAL_RANK=1")
              if b"python" in cmdline]
    killed_at = time.time()
    os.kill(victim[0], signal.SIGKILL)
    run.wait(RUN_TIMEOUT_S)
    if run.returncode != 0:
        raise RuntimeError(f"torchrun exited {run.returncode}; see {log_path}")
    after = [e["time"] for e in events()
             if e.get("event") == "step" and e.get("restart", 0) >= 1 and e["time"] > killed_at]
    return min(after) - killed_at


def compare_standby(args, work):
    full = {0: [], 1: []}
    for rep in range(args.reps):
        for standby in (0, 1):
            seconds, from_logs, summary = run_lockstep(args.build, args.workers, args.steps,
                                                       args.kill_at_step, work, standby)
            full[standby].append(summary["full_size_seconds"])
            print(f"standby {standby} rep {rep}: training again {from_logs:.3f} s (service: "
                  f"{seconds:.3f} s from the generation's end), back at "
                  f"{args.workers} ranks {summary['full_size_seconds']:.3f} s after the kill; "
                  f"generations {summary['generations']}, wall {summary['wall_seconds']:.2f} s",
                  flush=True)
    without, with_standby = (statistics.median(full[k]) for k in (0, 1))
    print(f"\nmedian time back at full size: without a standby {without:.3f} s, with one "
          f"{with_standby:.3f} s ({without / max(with_standby, 1e-6):.1f}x)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--kill-at-step", type=int, default=100)
    p.add_argument("--standby", action="store_true",
                   help="Lockstep without and with a hot standby; no torchrun")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="recovery-")
    print(f"logs in {work}; {args.workers} workers, kill at step {args.kill_at_step}",
          flush=True)
    if args.standby:
        return compare_standby(args, work)
    lockstep, cross, torch_times = [], [], []
    for rep in range(args.reps):
        seconds, from_logs, summary = run_lockstep(args.build, args.workers, args.steps,
                                                   args.kill_at_step, work)
        lockstep.append(seconds)
        cross.append(from_logs)
        print(f"lockstep  rep {rep}: recovery_seconds {seconds:.3f}  (kill -> first step in "
              f"logs {from_logs:.3f})  generations {summary['generations']} restarts "
              f"{summary['restarts']}", flush=True)
        t = run_torchrun(args.workers, args.steps, args.kill_at_step, work)
        torch_times.append(t)
        print(f"torchrun  rep {rep}: kill -> first step after restart {t:.3f}", flush=True)
    ls, lx, tr = (statistics.median(x) for x in (lockstep, cross, torch_times))
    print(f"\nmedian recovery: lockstep {ls:.3f} s (log cross-check {lx:.3f} s), "
          f"torchrun {tr:.3f} s; torchrun / lockstep = {tr / max(lx, ls, 1e-6):.1f}x "
          f"(against the larger of lockstep's two measures)")


if __name__ == "__main__":
    sys.exit(main())
