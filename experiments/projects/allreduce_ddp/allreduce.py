"""All-reduce across the processes of one host, as a data-parallel training step does with its
gradients: each rank contributes `rank + 1`, so every element of the sum is
world_size * (world_size + 1) / 2, checked after every all-reduce.

Started by torchrun, which sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT:

    torchrun --standalone --nproc_per_node=2 allreduce.py --size 65536 --iters 20
    python -m torch.distributed.run --standalone --nproc_per_node=2 allreduce.py   # the same

Rank 0 prints what it did and the mean time of one all-reduce:

    allreduce backend gloo world_size 2 size 65536 iters 20 visible 0,1
    time 0.412ms

A wrong sum, or a world size other than the number of devices given with `--devices`, exits
non-zero (the run, and so the job, fails).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=65536, help="float32 elements per all-reduce")
    parser.add_argument("--iters", type=int, default=20, help="timed all-reduces")
    parser.add_argument("--warmup", type=int, default=2, help="untimed all-reduces first")
    parser.add_argument(
        "--backend",
        choices=["gloo", "nccl"],
        default="gloo",
        help="gloo: CPU tensors (any machine); nccl: one GPU per rank (cuda:LOCAL_RANK)",
    )
    parser.add_argument(
        "--devices",
        default=None,
        help="the devices the job was given (the autopilot's {devices}: 0,1,...); if given, "
        "the world size must be their number",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.backend == "gloo":
        # One host: torchrun --standalone meets on localhost. In a sandbox without network the
        # loopback is the only interface, and gloo would otherwise look for the hostname's.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend=args.backend)
    try:
        return run(args, device)
    finally:
        dist.destroy_process_group()


def run(args: argparse.Namespace, device: torch.device) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.devices is not None and world != len(args.devices.split(",")):
        print(f"world size {world} but devices {args.devices}", file=sys.stderr)
        return 2
    expected = world * (world + 1) / 2
    mine = torch.full((args.size,), float(rank + 1), device=device)
    elapsed = 0.0
    for i in range(args.warmup + args.iters):
        buffer = mine.clone()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= args.warmup:
            elapsed += time.perf_counter() - started
        wrong = int((buffer != expected).sum())
        if wrong:
            print(f"rank {rank}: all-reduce {i}: {wrong} elements differ from {expected}",
                  file=sys.stderr)  # fmt: skip
            return 1
    if rank == 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        print(
            f"allreduce backend {args.backend} world_size {world} size {args.size} "
            f"iters {args.iters} visible {visible}"
        )
        print(f"time {elapsed / max(args.iters, 1) * 1000:.4f}ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
