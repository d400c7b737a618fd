"""Process-group start-up shared by every measured entry point (run under ``torchrun``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Env:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def init_distributed(backend: str, device_type: str, timeout_s: float, expected_world_size: int | None = None,
                     world_size_key: str = "parallel.world_size") -> Env:
    """Join the process group that ``torchrun`` (or SLURM) set up in the environment.

    One device per LOCAL_RANK on GPU. ``timeout_s`` bounds every collective, so a hung or dead
    peer ends the run with an error instead of a hang. Raises RuntimeError when the launcher's
    world size differs from the configured one (``world_size_key`` names that config key).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if expected_world_size is not None and world_size != expected_world_size:
        raise RuntimeError(f"launched with WORLD_SIZE={world_size} but the config says {world_size_key}="
                           f"{expected_world_size}; launch with torchrun --nproc-per-node={expected_world_size}")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("hardware.device is 'cuda' but torch sees no GPU; use hardware_profile=local-cpu")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        # NOTE: torchrun sets OMP_NUM_THREADS=1 only when nproc > 1; keep ranks from oversubscribing.
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if "MASTER_ADDR" not in os.environ:  # a plain `python -m ...` run: a world of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK="0", WORLD_SIZE="1")
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timedelta(seconds=timeout_s))
    else:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
    return Env(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
