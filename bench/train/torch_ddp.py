#!/usr/bin/python3
"""PyTorch DDP peer of Lockstep's training benchmark (bench/train/run.sh).

The same job as Lockstep's side: a 784-256-10 ReLU MLP on Fashion-MNIST, per-worker batch B,
SGD with momentum, a seeded global permutation per epoch sliced by rank, gloo backend, one
intra-op thread per process. Prints one JSON line from rank 0:
  {"world": W, "steps": S, "samples_per_second": ..., "seconds": ...}
samples_per_second is global (all ranks' samples) over the timed training loop only (data
loading and process-group setup excluded), as Lockstep's figure is.
"""
import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import benchlib  # noqa: E402  (bench/benchlib.py)

DATA = "/usr/share/datasets/fashion-mnist"


def load_fashion():
    with gzip.open(os.path.join(DATA, "train-images-idx3-ubyte.gz"), "rb") as f:
        images = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(os.path.join(DATA, "train-labels-idx1-ubyte.gz"), "rb") as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    return (torch.from_numpy(images.astype(np.float32) / 255.0),
            torch.from_numpy(labels.astype(np.int64)))


def worker(rank, world, port, args, queue):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    features, labels = load_fashion()
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(784, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    n = features.shape[0]
    global_batch = world * args.batch
    generator = torch.Generator().manual_seed(args.seed)
    permutation = torch.randperm(n, generator=generator)
    offset = 0
    dist.barrier()
    started = time.perf_counter()
    for _ in range(args.steps):
        if offset + global_batch > n:
            permutation = torch.randperm(n, generator=generator)
            offset = 0
        ids = permutation[offset + rank * args.batch: offset + (rank + 1) * args.batch]
        offset += global_batch
        x = features.index_select(0, ids)
        y = labels.index_select(0, ids)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        optimizer.step()
    dist.barrier()
    seconds = time.perf_counter() - started
    if rank == 0:
        queue.put({"world": world, "steps": args.steps, "seconds": seconds,
                   "samples_per_second": args.steps * global_batch / seconds,
                   "final_loss": float(loss)})
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    port = benchlib.free_port()
    processes = [context.Process(target=worker, args=(r, args.world, port, args, queue))
                 for r in range(args.world)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=600)
        if p.exitcode != 0:
            raise SystemExit("torch worker failed with exit code %s" % p.exitcode)
    print(json.dumps(queue.get()))


if __name__ == "__main__":
    main()
