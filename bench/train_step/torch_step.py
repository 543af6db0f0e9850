#!/usr/bin/env python3
"""PyTorch peer of Lockstep's training-step benchmark (train_step_bench), on one GPU.

The same work as Lockstep's side: an MLP of Linear layers with ReLU between them (none after the
last), softmax cross-entropy, SGD with momentum 0.9 and learning rate 0.01, fp32 with TF32 off
(PyTorch's default for matmul, and Lockstep's) or, with --precision bf16, the forward pass and
the loss under torch.autocast(dtype=torch.bfloat16) (Lockstep's `precision: bf16`), inputs and labels random and already resident on
the device, so that no copy or data loading is timed. Each configuration runs eagerly and under
torch.compile (mode "default": the model's forward and, through AOTAutograd, its backward are
compiled; the optimizer step stays eager, foreach).

Timing: after --warmup untimed steps (which include torch.compile's compilation), each of
--steps steps is bracketed by CUDA events on the current stream, and step_ms is the median of
those intervals. In steady state the events measure the step's throughput whether the GPU or the
CPU's kernel launches are the bottleneck (a GPU waiting for launches is idle between the two
events). mean_ms is the cross-check: one synchronize, then perf_counter over all timed steps
divided by their number. The loss is never read back inside the timed loop.

Prints one line per configuration and mode, for scripts/gpu-check.sh to collect:
  torch-eager layers=784,256,10 batch=64 step_ms=0.1234 mean_ms=0.1250 steps=300
  torch-compile layers=784,256,10 batch=64 step_ms=0.0987 mean_ms=0.1001 steps=300 compile_s=21.3
  torch-compile layers=... batch=... error=<the exception, one line>   (and it goes on)

  python3 bench/train_step/torch_step.py                          both configurations below
  python3 bench/train_step/torch_step.py --config 784,256,10:64   one
  python3 bench/train_step/torch_step.py --precision bf16         both, under bf16 autocast
  python3 bench/train_step/torch_step.py --device cpu --steps 5 --warmup 2 --no-compile
                                                                   (a smoke test without a GPU)
Exit status: 0 when every eager run worked; 1 otherwise (no CUDA device, an error).
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# The GPU benchmark models: the 784-256-10 MLP at batch 64 and a GEMM-bound [4096, 4096] MLP at batch 512.
DEFAULT_CONFIGS = ["784,256,10:64", "4096,4096,4096,10:512"]


def parse_config(text):
    layers_text, _, batch_text = text.partition(":")
    layers = [int(v) for v in layers_text.split(",")]
    if len(layers) < 2 or not batch_text:
        raise argparse.ArgumentTypeError(f"expected LAYERS:BATCH (784,256,10:64), got {text!r}")
    return layers, int(batch_text)


def make_model(layers, device):
    modules = []
    for i in range(len(layers) - 1):
        modules.append(torch.nn.Linear(layers[i], layers[i + 1]))
        if i + 1 < len(layers) - 1:
            modules.append(torch.nn.ReLU())
    return torch.nn.Sequential(*modules).to(device)


def time_steps(step, steps, warmup, device):
    """Median and mean milliseconds of `step` over `steps` calls after `warmup` calls."""
    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(steps)]
        wall_start = time.perf_counter()
        for start, stop in events:
            start.record()
            step()
            stop.record()
        torch.cuda.synchronize(device)
        wall_ms = (time.perf_counter() - wall_start) * 1e3
        times_ms = [start.elapsed_time(stop) for start, stop in events]
    else:
        times_ms = []
        wall_start = time.perf_counter()
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            times_ms.append((time.perf_counter() - t0) * 1e3)
        wall_ms = (time.perf_counter() - wall_start) * 1e3
    return statistics.median(times_ms), wall_ms / steps


def run(layers, batch, mode, args, device):
    torch.manual_seed(1)
    model = make_model(layers, device)
    inputs = torch.randn(batch, layers[0], device=device)
    labels = torch.randint(0, layers[-1], (batch,), device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    forward = torch.compile(model) if mode == "compile" else model

    bf16 = args.precision == "bf16"

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(forward(inputs), labels)
        loss.backward()
        optimizer.step()

    compile_s = None
    if mode == "compile":
        # The first call compiles (forward and backward); timed apart from the steps.
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        compile_s = time.perf_counter() - t0
    median_ms, mean_ms = time_steps(step, args.steps, args.warmup, device)
    line = (f"torch-{mode} layers={','.join(map(str, layers))} batch={batch} "
            f"precision={args.precision} step_ms={median_ms:.4f} mean_ms={mean_ms:.4f} steps={args.steps}")
    if compile_s is not None:
        line += f" compile_s={compile_s:.1f}"
    print(line, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", action="append", type=parse_config,
                        help=f"LAYERS:BATCH, repeatable (default: {' and '.join(DEFAULT_CONFIGS)})")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-compile", action="store_true", help="eager only")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: forward and loss under torch.autocast(dtype=torch.bfloat16)")
    args = parser.parse_args()
    configs = args.config or [parse_config(c) for c in DEFAULT_CONFIGS]

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("torch_step: torch.cuda.is_available() is false: no usable GPU", file=sys.stderr)
        return 1
    # fp32 throughout: TF32 would trade mantissa bits for speed that Lockstep's GEMMs do not take.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    clock = "CUDA event" if device.type == "cuda" else "perf_counter"
    print(f"# torch {torch.__version__} on {name}; {args.precision}, TF32 off; step_ms: median of per-step "
          f"{clock} intervals after {args.warmup} warm-up steps; mean_ms: wall time / steps",
          flush=True)

    status = 0
    for layers, batch in configs:
        modes = ["eager"] if args.no_compile else ["eager", "compile"]
        for mode in modes:
            try:
                if mode == "compile" and not hasattr(torch, "compile"):
                    raise RuntimeError(f"torch {torch.__version__} has no torch.compile")
                run(layers, batch, mode, args, device)
            except Exception as error:  # report and go on to the next configuration or mode
                message = " ".join(str(error).split())[:300]
                print(f"torch-{mode} layers={','.join(map(str, layers))} batch={batch} "
                      f"error={type(error).__name__}: {message}", flush=True)
                if mode == "eager":
                    status = 1
            finally:
                if hasattr(torch, "_dynamo"):  # drop compiled graphs between configurations
                    torch._dynamo.reset()
    return status


if __name__ == "__main__":
    sys.exit(main())
