#!/usr/bin/python3
"""A pipeline-parallel PyTorch MLP for Lockstep's exec mode (or torchrun): GPipe with data
parallelism.

The ranks Lockstep's rendezvous gives (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, read by
init_method="env://") are laid out as Lockstep's own pipelines lay them out: rank r is stage
r % S of replica r // S, so a replica's stages are neighbouring ranks, which the rendezvous puts
in the same pod and node (docs/pipeline.md). Each step

  * cuts the replica's share of the global batch into --micro-batches micro-batches;
  * runs every micro-batch forward through the stages, activations going to the next stage with
    torch.distributed send/recv, then every micro-batch backward, the activations' gradients
    going back the same way (the GPipe schedule: the pipeline is flushed every step, so the step
    is the step one process would take);
  * averages each stage's gradients over its replicas with an all-reduce in the stage's own
    process group, and steps the optimizer.

Plain point-to-point calls, so it runs on any torch with torch.distributed (Debian's 1.13
included, which predates torch.distributed.pipelining). With --check, rank 0 also trains the whole model in one process on the same global
batches and compares: the pipeline must end with its parameters, up to the order of the sums.
Progress goes through Lockstep's helper when it is there (`from lockstep import progress`).

Debian's torch 1.13 can hang in gloo's destructors at interpreter exit, so the script ends with
os._exit after destroy_process_group.
"""
import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

try:
    from lockstep import progress
except ImportError:  # not under a Lockstep agent: nobody reads progress
    progress = None


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", type=int, default=2, help="pipeline stages; WORLD_SIZE a multiple")
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--global-batch", type=int, default=64, help="samples per step, all replicas")
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 48, 32, 24])
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--samples", type=int, default=2048, help="synthetic training set size")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--check", action="store_true",
                   help="rank 0 compares the result with one process training the whole model")
    p.add_argument("--progress-file", default=os.environ.get("LOCKSTEP_PROGRESS_FILE", ""))
    return p.parse_args()


def synthetic_data(args):
    """A fixed data set every rank builds alike: features and the labels of a random teacher."""
    g = torch.Generator().manual_seed(args.seed + 1000)
    x = torch.randn(args.samples, args.features, generator=g)
    teacher = torch.randn(args.features, args.classes, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def whole_model(args):
    """The whole model from the seed: every rank builds it alike and keeps its stage's layers."""
    torch.manual_seed(args.seed)
    widths = [args.features] + args.hidden + [args.classes]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def stage_bounds(args, layers):
    """Linear layers per stage as even as the count allows; each Linear keeps the ReLU after it."""
    linear = [i for i, m in enumerate(layers) if isinstance(m, nn.Linear)]
    if args.stages > len(linear):
        sys.exit(f"--stages {args.stages}: the model has only {len(linear)} layers")
    bounds = []
    for s in range(args.stages):
        first = linear[len(linear) * s // args.stages]
        end = len(linear) * (s + 1) // args.stages
        last = linear[end] if end < len(linear) else len(layers)
        bounds.append((first, last))
    return bounds


def batch_of(args, step, x, y):
    """Global batch `step`: consecutive samples of the fixed order, wrapping around."""
    idx = (torch.arange(args.global_batch) + step * args.global_batch) % args.samples
    return x[idx], y[idx]


def train_pipeline(args, rank, world):
    stages = args.stages
    if world % stages:
        sys.exit(f"WORLD_SIZE {world} is not a multiple of --stages {stages}")
    replicas = world // stages
    stage, replica = rank % stages, rank // stages
    if args.global_batch % (replicas * args.micro_batches):
        sys.exit(f"--global-batch {args.global_batch} does not split into {replicas} replicas of "
                 f"{args.micro_batches} micro-batches")
    # Every rank creates every stage group, in the same order (new_group is collective).
    groups = [dist.new_group([r * stages + s for r in range(replicas)]) for s in range(stages)]
    x, y = synthetic_data(args)
    full = whole_model(args)
    first, last = stage_bounds(args, full)[stage]
    model = full[first:last]
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    in_width = model[0].in_features
    out_width = [m for m in model if isinstance(m, nn.Linear)][-1].out_features
    prev, nxt = rank - 1, rank + 1
    is_first, is_last = stage == 0, stage == stages - 1
    rows = args.global_batch // replicas // args.micro_batches
    reporter = progress.Reporter(args.progress_file) if progress and args.progress_file else None
    print(f"rank {rank}: stage {stage} of {stages} (modules {first}..{last - 1}), replica "
          f"{replica} of {replicas}", flush=True)
    loss_value = None
    for step in range(args.steps):
        started = time.time()
        gx, gy = batch_of(args, step, x, y)
        lo = replica * rows * args.micro_batches
        inputs, outputs, step_loss = [], [], 0.0
        optimizer.zero_grad()
        # Forward: every micro-batch.
        for m in range(args.micro_batches):
            a, b = lo + m * rows, lo + (m + 1) * rows
            if is_first:
                inp = gx[a:b]
            else:
                inp = torch.empty(rows, in_width)
                dist.recv(inp, src=prev)
                inp.requires_grad_()
            out = model(inp)
            if is_last:
                out = loss_fn(out, gy[a:b]) / args.global_batch
                step_loss += out.item()
            else:
                dist.send(out.detach(), dst=nxt)
            inputs.append(inp)
            outputs.append(out)
        # Backward: every micro-batch, last first.
        for m in reversed(range(args.micro_batches)):
            if is_last:
                outputs[m].backward()
            else:
                grad = torch.empty(rows, out_width)
                dist.recv(grad, src=nxt)
                outputs[m].backward(grad)
            if not is_first:
                dist.send(inputs[m].grad, dst=prev)
        # The stage's replicas sum their gradients: the loss was divided by the global batch.
        if replicas > 1:
            for p in model.parameters():
                dist.all_reduce(p.grad, group=groups[stage])
        optimizer.step()
        loss_value = step_loss if is_last else None
        if reporter is not None:
            reporter.report(step + 1, samples=args.global_batch, loss=loss_value,
                            total_steps=args.steps, compute_seconds=time.time() - started)
    if is_last and replica == 0:
        print(f"finished at step {args.steps} (loss {loss_value:.4f})", flush=True)
    return model


def check_against_one_process(args, model, rank):
    """Replica 0's stages send their layers to rank 0, which compares them with one process."""
    stages = args.stages
    if rank != 0:
        if rank < stages:
            dist.send(torch.cat([p.detach().flatten() for p in model.parameters()]), dst=0)
        return True
    reference = whole_model(args)
    optimizer = torch.optim.SGD(reference.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    x, y = synthetic_data(args)
    for step in range(args.steps):
        gx, gy = batch_of(args, step, x, y)
        optimizer.zero_grad()
        (loss_fn(reference(gx), gy) / args.global_batch).backward()
        optimizer.step()
    worst = 0.0
    for s, (first, last) in enumerate(stage_bounds(args, reference)):
        expected = torch.cat([p.detach().flatten() for p in reference[first:last].parameters()])
        if s == 0:
            got = torch.cat([p.detach().flatten() for p in model.parameters()])
        else:
            got = torch.empty_like(expected)
            dist.recv(got, src=s)
        worst = max(worst, ((got - expected).abs().max() / expected.abs().max()).item())
    ok = worst <= 1e-5
    print(f"pipeline {'matches' if ok else 'DIFFERS FROM'} one process: max |difference| "
          f"{worst:.3g} of the largest parameter", flush=True)
    return ok


def main():
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = train_pipeline(args, rank, world)
    ok = check_against_one_process(args, model, rank) if args.check else True
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
