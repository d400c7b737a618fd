"""Raw records: one JSON file per sweep point, in one schema for measured and simulated runs.

Schema (version 1)::

    {
      "schema_version": 1,
      "paper": "gshard", "experiment": "train_step", "point": "ws4_e8_epr2_overlap_s0",
      "mode": "measured" | "simulated", "backend": "gloo" | "nccl" | "sim", "hardware": "local-cpu",
      "params":  {swept parameters: world_size, num_experts, experts_per_rank, policy, seed, ...},
      "metrics": {"step_ms": {"median": 12.3, "p95": 14.0, "mean": 12.5, "min": ..., "max": ..., "n": 10}, ...},
      "samples": {"step_ms": [per-iteration values, worst rank per iteration], ...},
      "environment": {git_sha, torch, python, host, device, ...},
      "config": {the fully resolved config}
    }

Metric names carry their unit (``_ms``, ``_GBps``, ``_bytes``, ``_share``...). Records are written
atomically (temporary file + ``os.replace``) so a crashed run never leaves a partial record.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

SCHEMA_VERSION = 1
MODES = ("measured", "simulated")


def summarize(samples: Iterable[float]) -> dict[str, float]:
    """Median, p95, mean, min, max and count of per-iteration samples."""
    x = np.asarray(list(samples), dtype=float)
    if x.size == 0:
        raise ValueError("cannot summarize an empty list of samples")
    return {"median": float(np.median(x)), "p95": float(np.percentile(x, 95)), "mean": float(x.mean()),
            "min": float(x.min()), "max": float(x.max()), "n": int(x.size)}


def make_record(*, paper: str, experiment: str, point: str, mode: str, backend: str, hardware: str,
                params: dict[str, Any], samples: dict[str, list[float]], config: dict[str, Any],
                extra_metrics: dict[str, float] | None = None, device: str = "cpu") -> dict[str, Any]:
    """Assemble a record; ``samples`` are per-iteration values (worst rank), summarized here.

    ``extra_metrics`` are single values (e.g. a final loss) stored as {"value": x}.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    metrics = {name: summarize(vals) for name, vals in samples.items()}
    for name, value in (extra_metrics or {}).items():
        metrics[name] = {"value": float(value)}
    return {
        "schema_version": SCHEMA_VERSION,
        "paper": paper, "experiment": experiment, "point": point,
        "mode": mode, "backend": backend, "hardware": hardware,
        "params": _plain(params),
        "metrics": metrics,
        "samples": {k: [float(v) for v in vals] for k, vals in samples.items()},
        "environment": environment(device),
        "config": _plain(config),
    }


def record_path(results_dir: str | Path, paper: str, experiment: str, point: str) -> Path:
    return Path(results_dir) / "raw" / paper / experiment / f"{point}.json"


@contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``, on error it is removed.

    Readers see the old file or the whole new one, never a partial write. The temporary file is
    created with the process umask (not mkstemp's 0600), so results stay readable on shared clusters.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_record(record: dict[str, Any], path: str | Path) -> Path:
    """Write ``record`` as JSON atomically."""
    with atomic_output(path) as tmp:
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def read_record(path: str | Path) -> dict[str, Any]:
    with open(path) as f:
        record = json.load(f)
    if record.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {record.get('schema_version')} != {SCHEMA_VERSION}")
    return record


def environment(device: str = "cpu") -> dict[str, Any]:
    """What the numbers were measured on: versions, host, device, git commit."""
    import torch

    env = {
        "git_sha": _git_sha(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "device": device,
    }
    if device == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return env


def _git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _plain(obj: Any) -> Any:
    """numpy scalars (e.g. from Snakemake's Paramspace) -> Python scalars, recursively."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj
