#!/usr/bin/python3
"""Recovery time of a PyTorch DDP job after a worker dies: Lockstep's exec agent vs torchrun.

The same script (examples/pytorch/train_ddp.py, gloo, 2 workers on this machine) runs under
  * Lockstep: `lockstep run` with a manifest whose `command` is the script (2 exec agents), and
  * torchrun: two `torchrun --nnodes=1:2 --nproc-per-node=1 --rdzv-backend=c10d
    --rdzv-endpoint=127.0.0.1:PORT --max-restarts=3` agents (torchrun's defaults otherwise,
    e.g. its 5 s monitor interval; Debian's torchrun needs `--redirects 2 --tee 1`).
Once the job has trained `--kill-at-step` steps, rank 1's python process gets SIGKILL. Recovery
is the time from the kill to the first training step completed by the restarted group (the
script's --timeline file records every step with its wall time and TORCHELASTIC_RESTART_COUNT).
Both resume from the script's own checkpoint. Each system runs --reps times; the medians and the
ratio are printed.

  bench/exec_recovery/run.py [--build build] [--reps 3]

Logs stay in /tmp/exec-recovery-*/.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import benchlib  # noqa: E402  (bench/benchlib.py)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "pytorch", "train_ddp.py")
PYTHON = "/usr/bin/python3"


def script_args(tmp, args):
    return [SCRIPT, "--synthetic", "--hidden", "32", "--steps", "1000000",
            "--checkpoint", os.path.join(tmp, "ckpt.pt"), "--checkpoint-every", "10",
            "--timeline", os.path.join(tmp, "timeline.jsonl"),
            "--step-delay", str(args.step_delay)]


def read_timeline(path):
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return out


def wait_for(condition, timeout, what, procs=()):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited ({p.returncode}) while waiting for {what}")
        value = condition()
        if value:
            return value
        time.sleep(0.01)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


def rank1_python(marker):
    for pid, cmdline in benchlib.processes_with_env(f"BENCH_MARKER={marker}", "RANK=1"):
        if b"train_ddp.py" in cmdline and cmdline.startswith(b"/usr/bin/python3"):
            return pid
    return None


def start_lockstep(tmp, marker, args):
    agent = os.path.join(args.build, "bin", "lockstep-worker")
    has_exec = os.access(agent, os.X_OK) and subprocess.run(
        [agent, "exec", "--help"], capture_output=True).returncode == 0
    if not has_exec:  # lockstep-worker has no exec yet: the agent's test binary
        agent = os.path.join(args.build, "bin", "lockstep-exec-agent-test")
    command = json.dumps([PYTHON] + script_args(tmp, args))
    manifest = os.path.join(tmp, "job.yaml")
    with open(manifest, "w") as f:
        f.write("apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\n"
                f"metadata: {{name: bench-{marker[:8]}}}\n"
                f"spec:\n  replicas: 2\n  command: {command}\n"
                "  runPolicy: {restartPolicy: OnFailure, backoffLimit: 3}\n"
                "  metrics: {port: 0}\n")
    env = dict(os.environ, BENCH_MARKER=marker, LOCKSTEP_WORKER_BINARY=agent, OMP_NUM_THREADS="1")
    log = open(os.path.join(tmp, "lockstep.out"), "w")
    return [subprocess.Popen([os.path.join(args.build, "bin", "lockstep"), "run", manifest,
                              "--log-dir", os.path.join(tmp, "logs")],
                             env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)]


def start_torchrun(tmp, marker, args):
    port = benchlib.free_port()
    env = dict(os.environ, BENCH_MARKER=marker, OMP_NUM_THREADS="1")
    procs = []
    for i in range(2):
        log = open(os.path.join(tmp, f"torchrun-{i}.out"), "w")
        procs.append(subprocess.Popen(
            # torch 1.13 spells the flags with underscores.
            ["/usr/bin/torchrun", "--nnodes=1:2", "--nproc_per_node=1", "--rdzv_backend=c10d",
             f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id=bench-{marker[:8]}",
             "--max_restarts=3", "--redirects", "2", "--tee", "1"] + script_args(tmp, args),
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp))
    return procs


def stop(procs, marker):
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + 30
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
    for pid, _ in benchlib.processes_with_env(f"BENCH_MARKER={marker}"):  # anything that escaped its group
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def measure(system, args):
    tmp = tempfile.mkdtemp(prefix=f"exec-recovery-{system}-")
    marker = uuid.uuid4().hex
    timeline = os.path.join(tmp, "timeline.jsonl")
    procs = (start_lockstep if system == "lockstep" else start_torchrun)(tmp, marker, args)
    try:
        wait_for(lambda: any(e.get("step", 0) >= args.kill_at_step for e in read_timeline(timeline)),
                 120, f"{system} to train {args.kill_at_step} steps", procs)
        pid = wait_for(lambda: rank1_python(marker), 30, "rank 1's python process")
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)

        def first_step_after_restart():
            after = [e for e in read_timeline(timeline) if e["event"] == "step" and
                     e["time"] > killed_at and e["restart"] >= 1]
            return min(after, key=lambda e: e["time"]) if after else None

        first = wait_for(first_step_after_restart, 120, f"{system} to train again", procs)
        # Relaunch: until the last rank's new process was running (the agent's share); the rest
        # is the program's own start-up (import torch, init_process_group, checkpoint load).
        starts = [e["time"] for e in read_timeline(timeline)
                  if e["event"] == "start" and e["restart"] >= 1]
        relaunch = (max(starts) - killed_at) if starts else float("nan")
        return first["time"] - killed_at, relaunch, first["step"]
    finally:
        stop(procs, marker)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--kill-at-step", type=int, default=30)
    p.add_argument("--step-delay", type=float, default=0.02)
    p.add_argument("--systems", default="lockstep,torchrun")
    args = p.parse_args()
    args.build = os.path.abspath(args.build)
    results, relaunches = {}, {}
    for rep in range(args.reps):
        for system in args.systems.split(","):
            seconds, relaunch, step = measure(system, args)
            results.setdefault(system, []).append(seconds)
            relaunches.setdefault(system, []).append(relaunch)
            print(f"rep {rep + 1}: {system:9s} training again {seconds:6.2f} s after the kill "
                  f"(new processes running after {relaunch:5.2f} s; first step {step})",
                  flush=True)
    print()
    print(f"{'system':10s} {'median s':>9s} {'min s':>7s} {'max s':>7s} {'relaunch s':>11s}  runs")
    for system, times in results.items():
        print(f"{system:10s} {statistics.median(times):9.2f} {min(times):7.2f} "
              f"{max(times):7.2f} {statistics.median(relaunches[system]):11.2f}  " +
              " ".join(f"{t:.2f}" for t in times))
    if "lockstep" in results and "torchrun" in results:
        ratio = statistics.median(results["torchrun"]) / statistics.median(results["lockstep"])
        print(f"\ntorchrun / lockstep (median): {ratio:.1f}x")
        relaunch_ratio = (statistics.median(relaunches["torchrun"]) /
                          statistics.median(relaunches["lockstep"]))
        print(f"relaunch only (kill to new processes running): {relaunch_ratio:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
