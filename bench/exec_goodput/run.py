#!/usr/bin/python3
"""Goodput under repeated failures: a random training process SIGKILLed every --kill-every s.

Nine systems, 4 workers each on this machine, each run twice with the same steps: undisturbed,
then disturbed. goodput = undisturbed wall time / disturbed wall time; lost per failure =
(disturbed - undisturbed) / kills.

  trainer        `lockstep run` of the built-in trainer (MLP 784-128-10 on Fashion-MNIST,
                 batch 64 per worker, job without `elastic`): a killed worker's survivors train
                 on and a replacement joins with the state of a survivor.
  exec           `lockstep run` of examples/pytorch/train_ddp.py (gloo, MLP 784-128-10 on the
                 script's synthetic set, batch 64 per rank, checkpoint every 20 steps): every
                 agent restarts its command, which resumes from the checkpoint.
  exec-in-place  the same script with --in-place (lockstep.elastic): survivors stay, a warm
                 spare replaces the killed process and receives the state from a survivor.
  exec-in-place-idle-spare  the same with the warm spare waiting under SCHED_IDLE
                 (LOCKSTEP_EXEC_SPARE_IDLE=1).
  exec-in-place-no-zygote  the same with every warm spare started from nothing (its own
                 `import torch`) rather than forked from the agent's zygote
                 (LOCKSTEP_EXEC_ZYGOTE=0).
  exec-pod-lost  exec-in-place, but the victim's agent is killed (a lost pod: program, warm
                 spare and zygote go with it); `lockstep run` starts the worker again, and the
                 fixed-size job waits for it.
  exec-pod-lost-standby  the same with `elastic: {standby: 1}`: a fifth worker waits with its
                 program forked ahead (imports and start-up done, waiting in elastic.run())
                 and takes the lost one's place; the restarted one stands by.
  exec-pod-lost-standby-cold  the same with the standby's program started only when the place
                 comes (LOCKSTEP_EXEC_PROGRAM_AHEAD=0): its imports done by its zygote, its
                 start-up (data, model) on the recovery's critical path.
  torchrun       the same script (without --in-place) under torchrun (`python3 -m
                 torch.distributed.run`: c10d, --nproc_per_node=4, restart-all).

Every run of the script appends a line per step with its pid to a timeline; the victim is a
random one of the processes that trained the last step (never an idle warm spare). Besides the
goodput of the two runs, the exec systems report what each kill cost in its own run's timeline
(the steps of the 6 s after it against the rate of the 2 s after those; lost_at_kills), which the
machine's drift between two runs of 40 s (seconds here) does not enter. For
exec-in-place the helper's own account of each recovery (rendezvous, group, state) is averaged.

  bench/exec_goodput/run.py [--build build] [--kill-every 8] [--systems trainer,exec,...]
                            [--python /usr/bin/python3]

Logs stay in /tmp/exec-goodput-*/.
"""
import argparse
import json
import os
import random
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
SCRIPT = os.path.join(REPO, "examples", "pytorch", "train_ddp.py")
WORKERS = 4


def script_args(work, args, in_place):
    data = ["--data-dir", args.fashion] if args.script_data == "fashion" else ["--synthetic"]
    return [SCRIPT] + data + ["--hidden", "128", "--batch-size", "64",
            "--steps", str(args.ddp_steps), "--step-delay", str(args.step_delay),
            "--checkpoint", os.path.join(work, "ckpt.pt"), "--checkpoint-every", "20",
            "--timeline", os.path.join(work, "timeline.jsonl")] + (["--in-place"] if in_place else [])


def write_manifest(path, name, spec):
    with open(path, "w") as f:
        f.write(f"apiVersion: lockstep.io/v1alpha1\nkind: TrainingJob\nmetadata: {{name: {name}}}\n"
                f"spec:\n  replicas: {WORKERS}\n{spec}"
                "  runPolicy: {restartPolicy: OnFailure, backoffLimit: 100}\n"
                "  metrics: {port: 0}\n")


def start(system, work, args, marker):
    env = dict(os.environ, BENCH_MARKER=marker, OMP_NUM_THREADS="1",
               LOCKSTEP_EXEC_BACKOFF_MS="0",
               LOCKSTEP_EXEC_SPARE_IDLE="1" if system == "exec-in-place-idle-spare" else "0",
               LOCKSTEP_EXEC_ZYGOTE="0" if system == "exec-in-place-no-zygote" else "1",
               LOCKSTEP_EXEC_PROGRAM_AHEAD="0" if system.endswith("-cold") else "1")
    log = open(os.path.join(work, "run.out"), "w")
    if system == "torchrun":
        argv = [args.python, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={WORKERS}",
                "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{benchlib.free_port()}",
                "--max_restarts=100", "--redirects", "2", "--tee", "1"] + \
            script_args(work, args, False)
    else:
        manifest = os.path.join(work, "job.yaml")
        name = f"goodput-{marker}"
        if system == "trainer":
            write_manifest(manifest, name, f"""  trainer:
    model: {{type: mlp, hidden: [128], activation: relu}}
    data:
      format: idx
      train: [file://{args.fashion}/train-images-idx3-ubyte.gz, file://{args.fashion}/train-labels-idx1-ubyte.gz]
    batchSize: 64
    steps: {args.trainer_steps}
    optimizer: {{type: sgd, learningRate: 0.05, momentum: 0.9}}
""")
        else:
            in_place = system.startswith("exec-in-place") or system.startswith("exec-pod-lost")
            command = json.dumps([args.python] + script_args(work, args, in_place))
            standby = ("  elastic: {standby: 1}\n" if system.startswith("exec-pod-lost-standby")
                       else "")
            write_manifest(manifest, name, f"  command: {command}\n{standby}")
        argv = [os.path.join(args.build, "bin", "lockstep"), "run", manifest, "--log-dir",
                os.path.join(work, "logs"), "--console", "none"]
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=work)


def step_lines(texts):
    """The step lines among a timeline's lines (a line still being written does not parse)."""
    for text in texts:
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if line.get("event") == "step":
            yield line


class TimelineTail:
    """The newest step lines of a growing timeline, read incrementally: re-reading the whole
    file at every poll costs the bench a core's share that grows with the run, which the
    disturbed runs (the only ones that poll) would count as lost to the failures."""

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.partial = ""
        self.recent = []

    def read(self):
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                data = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return self.recent
        text = self.partial + data
        complete, _, self.partial = text.rpartition("\n")
        self.recent.extend(step_lines(complete.splitlines()))
        del self.recent[:-4 * WORKERS]
        return self.recent


def training_processes(system, tail, marker):
    """Pids that train now (the victims to choose from)."""
    if system == "trainer":
        pids = []
        for pid, cmdline in benchlib.processes_with_env(f"BENCH_MARKER={marker}"):
            argv = cmdline.split(b"\0")
            if argv[0].endswith(b"lockstep-worker") and b"train" in argv[1:2]:
                pids.append(pid)
        return pids
    lines = tail.read()
    if not lines:
        return []
    newest = max(line["step"] for line in lines)
    recent = [line for line in lines if line["step"] >= newest - 1]
    pids = sorted({line["pid"] for line in recent if "pid" in line})
    if system.startswith("exec-pod-lost"):  # their agents: the pod is lost, not the process
        pids = sorted({parent for parent in map(parent_of, pids) if parent > 1})
    return pids


def parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def cleanup(proc, marker):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if f"BENCH_MARKER={marker}".encode() in f.read():
                        os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass


def lost_at_kills(timeline_path, kill_times, window=6.0, base=2.0):
    """Seconds each kill cost, read from the run's own timeline: the steps completed in the
    `window` seconds from the kill against the step rate of the `base` seconds after that window
    (before the next kill at 8 s; a step is complete when its last rank logged it). Local to each
    kill, so the machine's drift between the undisturbed and the disturbed run (seconds over a
    run here) does not enter it, nor the start-up the first kill falls into. Kills whose windows
    reach past the run's end are left out."""
    done = {}
    try:
        with open(timeline_path) as f:
            for line in step_lines(f):
                done[line["step"]] = max(done.get(line["step"], 0.0), line["time"])
    except FileNotFoundError:
        return []
    times = sorted(done.values())
    lost = []
    for kill in kill_times:
        if not times or kill + window + base > times[-1]:
            continue
        rate = sum(1 for t in times if kill + window <= t < kill + window + base) / base
        if rate > 0:
            lost.append(window - sum(1 for t in times if kill <= t < kill + window) / rate)
    return lost


def run_once(system, args, disturbed):
    marker = f"{system}-{'kill' if disturbed else 'calm'}-{os.getpid()}-{random.randrange(10**6)}"
    work = tempfile.mkdtemp(prefix=f"exec-goodput-{marker}-")
    started = time.time()
    proc = start(system, work, args, marker)
    kills = 0
    kill_times = []
    next_kill = None
    tail = TimelineTail(os.path.join(work, "timeline.jsonl"))
    try:
        while proc.poll() is None:
            if time.time() - started > args.timeout:
                raise TimeoutError(f"{system} ran past {args.timeout} s; see {work}")
            time.sleep(0.05)
            if not disturbed:
                continue
            if next_kill is not None and time.time() < next_kill:
                continue  # look for victims only when one is due: the look costs CPU too
            victims = training_processes(system, tail, marker)
            if next_kill is None and victims:
                next_kill = time.time() + args.kill_every  # from the first step trained
            if next_kill is not None and time.time() >= next_kill and victims:
                try:
                    os.kill(random.choice(victims), signal.SIGKILL)
                    kills += 1
                    kill_times.append(time.time())
                except ProcessLookupError:
                    pass
                next_kill = time.time() + args.kill_every
        wall = time.time() - started
        if proc.returncode != 0:
            raise RuntimeError(f"{system} exited {proc.returncode}; see {work}")
    finally:
        cleanup(proc, marker)
    parts = []
    pattern = re.compile(r"after the failure \(rendezvous ([\d.]+) s, group ([\d.]+) s, "
                         r"state ([\d.]+) s\)")
    for root, _, files in os.walk(work):
        for name in files:
            if name.endswith(".log") or name == "run.out":
                with open(os.path.join(root, name), errors="replace") as f:
                    parts += [tuple(map(float, m.groups())) for m in pattern.finditer(f.read())]
    local = lost_at_kills(os.path.join(work, "timeline.jsonl"), kill_times)
    return wall, kills, parts, work, local


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--systems", default="trainer,exec-in-place,exec,torchrun")
    p.add_argument("--kill-every", type=float, default=8.0)
    p.add_argument("--ddp-steps", type=int, default=1500)
    p.add_argument("--trainer-steps", type=int, default=3000)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--python", default="/usr/bin/python3",
                   help="the interpreter of the PyTorch programs (and of torchrun)")
    p.add_argument("--script-data", choices=["synthetic", "fashion"], default="synthetic",
                   help="the script's data: its synthetic set, or Fashion-MNIST decoded at start-up "
                        "(a longer start-up, as a real data set gives)")
    p.add_argument("--fashion", default="/usr/share/datasets/fashion-mnist",
                   help="the folder of the Fashion-MNIST files (the trainer system)")
    args = p.parse_args()
    args.build = os.path.abspath(args.build)
    random.seed(args.seed)
    rows = []
    for system in args.systems.split(","):
        calm = run_once(system, args, disturbed=False)[0]
        hit, kills, parts, work, local = run_once(system, args, disturbed=True)
        lost = (hit - calm) / kills if kills else float("nan")
        local_lost = statistics.median(local) if local else float("nan")
        rows.append((system, calm, hit, kills, calm / hit, lost, parts, local))
        print(f"{system:14s} undisturbed {calm:6.1f} s  disturbed {hit:6.1f} s  kills {kills:2d}  "
              f"goodput {calm / hit:4.2f}  lost per failure {lost:5.2f} s  at the kills "
              f"{' '.join(f'{x:.2f}' for x in local)} s  ({work})", flush=True)
    print()
    print(f"{'system':14s} {'goodput':>8s} {'lost/failure s':>15s} {'kills':>6s} "
          f"{'lost at a kill s (median)':>26s}")
    for system, calm, hit, kills, goodput, lost, parts, local in rows:
        local_lost = statistics.median(local) if local else float("nan")
        print(f"{system:14s} {goodput:8.2f} {lost:15.2f} {kills:6d} {local_lost:26.2f}")
        if parts:
            mean = [statistics.mean(part[i] for part in parts) for i in range(3)]
            print(f"{'':14s} helper's account, mean of {len(parts)} rank-recoveries: rendezvous "
                  f"{mean[0]:.3f} s, group {mean[1]:.3f} s, state {mean[2]:.3f} s after the "
                  "failure was seen")
    return 0


if __name__ == "__main__":
    sys.exit(main())
