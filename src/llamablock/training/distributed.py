"""Data-parallel training on torch.distributed (DDP), for `torchrun --nproc-per-node N llamablock train`.

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; `from_env` joins the process group with the
gloo backend on CPU and NCCL on GPU (the backends PyTorch recommends for each). Without those
variables, or with WORLD_SIZE=1, training runs in one process and nothing here is used.

Sharding follows torch.utils.data.DistributedSampler: of a global batch of B windows, rank r
takes windows r, r + N, r + 2N, ... (B must be divisible by N). Every rank draws the same global
batch (the sampler is seeded by seed and step), so N processes with B/N windows each and DDP's
averaged gradients compute the same update as one process with B windows, up to float rounding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


def from_env(device: str | None = None) -> DistInfo:
    """Join the process group torchrun describes, or return a single-process DistInfo."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if device is None:
        device = "cuda" if torch.cuda.is_available() and world > 1 else "cpu"
    if world <= 1:
        return DistInfo(device=torch.device(device))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return DistInfo(rank=rank, world=world, device=dev)


def wrap(model: torch.nn.Module, info: DistInfo) -> torch.nn.Module:
    """DDP around the model when there are several processes (it broadcasts rank 0's weights)."""
    if not info.active:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [info.device.index] if info.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def shard(batch: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """This rank's rows of the global batch: rank, rank + world, ... (DistributedSampler's order)."""
    if not info.active:
        return batch
    if batch.shape[0] % info.world:
        raise ValueError(f"batch size {batch.shape[0]} must be divisible by the number of processes ({info.world}) "
                         "so every rank gets the same share")
    return batch[info.rank:: info.world]


def mean_over_ranks(value: float, info: DistInfo) -> float:
    if not info.active:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=info.device)
    dist.all_reduce(t)
    return float(t.item()) / info.world


def barrier(info: DistInfo) -> None:
    if info.active:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.active and dist.is_initialized():
        dist.destroy_process_group()
