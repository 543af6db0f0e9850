#!/usr/bin/python3
"""A small DistributedDataParallel MLP for Lockstep's exec mode (or torchrun).

Runs unchanged under `lockstep run examples/pytorch-ddp.yaml` and under torchrun: it reads the
standard variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, TORCHELASTIC_RESTART_COUNT)
through init_method="env://". It

  * trains on Fashion-MNIST (IDX .gz files read with gzip + numpy) or, with --synthetic or when
    the files are missing, on a fixed synthetic data set;
  * saves its own checkpoint (torch.save, written to a temporary file and renamed, so a kill
    never leaves half a file) every --checkpoint-every steps and resumes from it after a restart;
  * with --in-place, recovers from a peer's failure without exiting, through Lockstep's elastic
    helper (`from lockstep import elastic`): the survivors keep their processes and their state
    in memory, and the replaced rank receives the state from a survivor (docs/exec.md);
  * reports its progress with Lockstep's helper (`from lockstep import progress`, on the
    PYTHONPATH the agent gives it): steps, samples, loss, total steps and compute time, which the
    agent passes to `lockstep run`, the job's status and Prometheus. Outside Lockstep (torchrun)
    the helper is not importable and nothing is reported.

Debian's torch 1.13 can hang in gloo's destructors at interpreter exit, so the script ends with
os._exit after destroy_process_group.
"""
import time

STARTED_AT = time.time()  # before the heavy imports: benchmarks separate start-up from relaunch

import argparse
import contextlib
import datetime
import gzip
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

try:
    from lockstep import progress
except ImportError:  # not under a Lockstep agent: nobody reads progress
    progress = None

FASHION_DIR = "/usr/share/datasets/fashion-mnist"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="optimizer steps in total")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--data-dir", default=FASHION_DIR)
    p.add_argument("--synthetic", action="store_true", help="synthetic data, no files needed")
    p.add_argument("--checkpoint", default=os.environ.get("TRAIN_CHECKPOINT", ""),
                   help="checkpoint file (default: $TRAIN_CHECKPOINT; empty: none)")
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--progress-file", default=os.environ.get("LOCKSTEP_PROGRESS_FILE", ""))
    p.add_argument("--timeline", default="",
                   help="append {rank, step, time, restart, world, generation} per step to this "
                        "file (benchmarks)")
    p.add_argument("--step-delay", type=float, default=0.0,
                   help="seconds to sleep per step (paces a demo or a test; 0 in real use)")
    p.add_argument("--in-place", action="store_true",
                   help="recover from a peer's failure in place (lockstep.elastic)")
    p.add_argument("--save-parameters", default="",
                   help="rank 0 writes the final parameters here (torch.save; tests)")
    return p.parse_args()


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_data(args):
    images = os.path.join(args.data_dir, "train-images-idx3-ubyte.gz")
    labels = os.path.join(args.data_dir, "train-labels-idx1-ubyte.gz")
    if not args.synthetic and os.path.exists(images) and os.path.exists(labels):
        x = torch.from_numpy(read_idx(images).reshape(-1, 784).astype(np.float32) / 255.0)
        y = torch.from_numpy(read_idx(labels).astype(np.int64))
        return x, y
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(10, 784, generator=g)
    y = torch.randint(0, 10, (8192,), generator=g)
    x = centers[y] + 0.5 * torch.randn(8192, 784, generator=g)
    return x, y


def record_start(args, rank, restart):
    """When this process started (STARTED_AT), written once its rank is known."""
    if args.timeline:
        os.makedirs(os.path.dirname(os.path.abspath(args.timeline)), exist_ok=True)
        with open(args.timeline, "a") as f:
            f.write(json.dumps({"event": "start", "rank": rank, "time": STARTED_AT,
                                "restart": restart}) + "\n")


def train_step(args, ddp, optimizer, loss_fn, x, y, step, rank, world, reporter):
    """One optimizer step; the batch depends only on the step, so a resumed or recovered run
    sees the data it would have seen. Returns the loss."""
    n = x.shape[0]
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, n, (args.batch_size * world,), generator=g)
    ids = ids[rank * args.batch_size:(rank + 1) * args.batch_size]
    # Compute time for the scaling efficiency: the step's work, not the pacing sleep
    # (DDP's backward also waits for the gradient all-reduce it does not hide).
    with reporter.computing() if reporter else contextlib.nullcontext():
        optimizer.zero_grad()
        loss = loss_fn(ddp(x[ids]), y[ids])
        loss.backward()
        optimizer.step()
    return loss


def after_step(args, model, optimizer, loss, done, rank, world, restart, reporter, timeline,
               generation):
    """What follows a step: checkpoint, progress, timeline, pacing (nothing collective)."""
    if args.checkpoint and rank == 0 and (done % args.checkpoint_every == 0 or
                                          done == args.steps):
        tmp = f"{args.checkpoint}.tmp"
        torch.save({"step": done, "model": model.state_dict(),
                    "optimizer": optimizer.state_dict()}, tmp)
        os.replace(tmp, args.checkpoint)
    if reporter:
        reporter.report(step=done, samples=done * args.batch_size * world, loss=loss,
                        total_steps=args.steps)
    if timeline:
        timeline.write(json.dumps({"event": "step", "rank": rank, "step": done,
                                   "time": time.time(), "restart": restart, "world": world,
                                   "generation": generation, "pid": os.getpid()}) + "\n")
        timeline.flush()
    if args.step_delay:
        time.sleep(args.step_delay)


def open_outputs(args):
    reporter = progress.Reporter(args.progress_file) if progress and args.progress_file else None
    # Small appends to an O_APPEND file are atomic, so every rank may share one timeline.
    for path in (args.timeline, args.checkpoint):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    timeline = open(args.timeline, "a") if args.timeline else None
    return reporter, timeline


def finish(args, model, loss, world, rank, reporter):
    # loss is None when the checkpoint was already at the last step (a finished job applied again
    # with the same checkpoint, or pods lost after the last save): nothing was left to train, and
    # the job's progress says where it is.
    if loss is None and reporter:
        reporter.report(step=args.steps, samples=args.steps * args.batch_size * world,
                        total_steps=args.steps)
    shown = "nothing left to train" if loss is None else f"loss {loss.item():.4f}"
    print(f"finished at step {args.steps} (world {world}, {shown})", flush=True)
    if args.save_parameters and rank == 0:
        torch.save(model.state_dict(), args.save_parameters)
    sys.stdout.flush()
    os._exit(0)


def main_in_place(args):
    """The same training through lockstep.elastic: one train() call per generation. Nothing
    before elastic.run() reads the rank, so a standby's agent can run all of it ahead of a place
    (docs/exec.md, "A standby's program waits warm in the helper")."""
    from lockstep import elastic
    torch.set_num_threads(1)
    x, y = load_data(args)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(784, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state = elastic.State(model=model, optimizer=optimizer)
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state.step = saved["step"]
    loss_fn = nn.CrossEntropyLoss()
    reporter, timeline = open_outputs(args)
    started = []

    def train(ctx):
        if not started:
            started.append(True)
            record_start(args, ctx.rank, ctx.restart_count)
        print(f"generation {ctx.generation}: rank {ctx.rank} of {ctx.world_size} from step "
              f"{ctx.state.step} (restart {ctx.restart_count})", flush=True)
        ddp = DistributedDataParallel(model, process_group=ctx.group)
        loss = None
        for step in ctx.steps(args.steps):
            loss = train_step(args, ddp, optimizer, loss_fn, x, y, step, ctx.rank,
                              ctx.world_size, reporter)
            after_step(args, model, optimizer, loss, step + 1, ctx.rank, ctx.world_size,
                       ctx.restart_count, reporter, timeline, ctx.generation)
        return loss, ctx.world_size, ctx.rank

    loss, world, rank = elastic.run(train, state, backend="gloo",
                                    timeout=datetime.timedelta(seconds=60))
    finish(args, model, loss, world, rank, reporter)


def main():
    args = parse_args()
    if args.in_place:
        return main_in_place(args)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    generation = int(os.environ.get("LOCKSTEP_GENERATION", "0"))  # 0 outside Lockstep
    record_start(args, rank, restart)
    x, y = load_data(args)

    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(784, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    start_step = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        start_step = state["step"]
        print(f"resumed from step {start_step} (world {world}, restart {restart})", flush=True)
    else:
        print(f"starting at step 0 (world {world}, restart {restart})", flush=True)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    if start_step and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    loss_fn = nn.CrossEntropyLoss()
    reporter, timeline = open_outputs(args)
    loss = None
    for step in range(start_step, args.steps):
        loss = train_step(args, ddp, optimizer, loss_fn, x, y, step, rank, world, reporter)
        after_step(args, model, optimizer, loss, step + 1, rank, world, restart, reporter,
                   timeline, generation)
    dist.barrier()
    dist.destroy_process_group()
    finish(args, model, loss, world, rank, reporter)


if __name__ == "__main__":
    main()
