"""Process-group start-up shared by every measured entry point (run under ``torchrun``)."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterator

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf


@dataclass(frozen=True)
class Env:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    health_group: object  # gloo group used only to find unresponsive ranks after a failure
    timeout_s: float


def init_distributed(cfg: DictConfig, world_size_key: str = "parallel.world_size") -> Env:
    """Join the process group that ``torchrun`` (or SLURM) set up in the environment.

    Backend and device from ``cfg.hardware``; one device per LOCAL_RANK on GPU.
    ``parallel.timeout_s`` bounds every collective, so a hung or dead peer ends the run with an
    error instead of a hang. Raises RuntimeError when the launcher's world size differs from the
    config key ``world_size_key`` (the entry point's own world size).
    """
    backend, device_type, timeout_s = cfg.hardware.backend, cfg.hardware.device, cfg.parallel.timeout_s
    expected_world_size = OmegaConf.select(cfg, world_size_key)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size != expected_world_size:
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
        torch.set_num_threads(cpu_threads_per_rank())
    if "MASTER_ADDR" not in os.environ:  # a plain `python -m ...` run: a world of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK="0", WORLD_SIZE="1")
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timedelta(seconds=timeout_s))
    else:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
    health_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    return Env(dist.get_rank(), dist.get_world_size(), local_rank, device, backend, health_group, timeout_s)


def cpu_threads_per_rank() -> int:
    """Intra-op threads of one CPU rank: the host's cores shared by its local ranks.

    NOTE: Snakemake exports OMP_NUM_THREADS=<job threads> and torchrun passes it on, so 4 ranks of a
    2-core job would each start 2 threads; oversubscribed ranks spin against each other and step
    times grow several-fold. OMP_NUM_THREADS still caps the share when it is smaller.
    """
    cores = len(os.sched_getaffinity(0))
    share = max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return min(share, int(os.environ.get("OMP_NUM_THREADS", share)))


FAILED_RANK_EXIT_CODE = 3


@contextmanager
def naming_failed_ranks(env: Env) -> Iterator[None]:
    """Turn a failed or timed-out collective into an exit that names the unresponsive ranks.

    A dead peer shows up on the others as "Connection closed by peer", a hung one as a timeout
    after ``timeout_s``; neither names the culprit. After such an error every surviving rank enters
    a ``monitored_barrier`` on a separate gloo group, which on rank 0 reports which ranks did not
    arrive (e.g. "Rank 1 failed to pass monitoredBarrier in 10000 ms"), prints it and exits with
    FAILED_RANK_EXIT_CODE at once.

    NOTE: the exit skips interpreter teardown on purpose: destroying a process group whose peer is
    hung can block forever, and the launcher only stops the other ranks once one has exited.
    """
    try:
        yield
    except (RuntimeError, dist.DistError) as err:
        if env.world_size == 1:
            raise
        try:
            dist.monitored_barrier(env.health_group, timeout=timedelta(seconds=min(env.timeout_s, 30.0)),
                                   wait_all_ranks=True)
            diagnosis = "every rank still responds, so the failure is local to this rank"
        except RuntimeError as probe:
            diagnosis = str(probe).strip().splitlines()[0]
        print(f"error: rank {env.rank} stopped: {str(err).strip().splitlines()[0]} | {diagnosis}",
              file=sys.stderr, flush=True)
        if env.rank != 0:
            time.sleep(2.0)  # let rank 0, which knows who is missing, report before the launcher stops all
        os._exit(FAILED_RANK_EXIT_CODE)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
