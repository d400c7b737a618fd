"""Raw records: one JSON file per sweep point, in one schema for measured and simulated runs.

Schema (version 1)::

    {
      "schema_version": 1,
      "paper": "gshard", "experiment": "train_step", "point": "ws4_e8_epr2_overlap_s0",
      "mode": "measured" | "simulated", "backend": "gloo" | "nccl" | "sim", "hardware": "local-cpu",
      "params":  {swept parameters: world_size, num_experts, experts_per_rank, policy, seed, ...},
      "metrics": {"step_ms": {"median": 12.3, "p95": 14.0, "mean": 12.5, "min": ..., "max": ..., "n": 10}, ...},
      "samples": {"step_ms": [per-iteration values, worst rank per iteration], ...},
      "environment": {git_sha, torch, python, host, hosts (every rank's), device, ...},
      "config": {the fully resolved config},
      "noise": {"load_avg": [l1, l5, l15], "cpus": 2, "contention": 0.03 | null, "cv": {"step_ms": 0.05, ...}},
      "digest": "sha256:..."
    }

``noise`` (measured records only) says how busy the host was while the point was timed
(moe_core.host.noise: load average, the share of CPU others used, each metric's coefficient of
variation); moe_core.host.noise.is_noisy decides from it whether the record was taken on a noisy host.

Metric names carry their unit (``_ms``, ``_GBps``, ``_bytes``, ``_share``...), which sets their range
(analysis/record_schema.py checks every record the analysis reads against it). Records are written
atomically (temporary file + ``os.replace``) so a crashed run never leaves a partial record.

``digest`` (:func:`record_digest`) is the SHA-256 of the rest of the record, added by
:func:`write_record`: analysis.collect refuses a record whose content no longer matches it, i.e. one
changed after its run wrote it (a relabelled testbed, rescaled samples). It sits in the record
rather than in a manifest beside the records, so it is written in the same atomic rename, a rerun of
one point replaces both, the jobs of a run running side by side share no file, and a record copied
from another machine carries it. It detects edits, not forgery: anyone can compute a digest.

Records are strict JSON: every number is finite. A metric or sample that is NaN or infinite (a
diverged training run, a failed measurement) is refused with NonFiniteMetricError naming it,
before anything is written, so the run fails instead of recording a success. experiments.launch
and moe_core.runtime.distributed.init_distributed check that ``results_dir`` can be written before any
work starts (:func:`check_writable`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np

from moe_core.host.noise import WINDOW
from moe_core.host.processes import RANK_HOSTS, started_at, status_of
from moe_core.records.tracking import mirror_records

SCHEMA_VERSION = 1
MODES = ("measured", "simulated")


class NonFiniteMetricError(ValueError):
    """A record's metric or sample is NaN or infinite: the run diverged or a measurement failed."""


class ResultsDirError(OSError):
    """``results_dir`` cannot be created or written."""


def check_writable(results_dir: str | Path) -> Path:
    """Create ``results_dir`` if needed and prove it can be written (a file is created and removed).

    Called before any work (experiments.launch, moe_core.runtime.distributed.check_launch), so an
    unwritable directory fails the run at once rather than after it. Raises ResultsDirError
    naming the directory.
    """
    path = Path(results_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as err:
        raise ResultsDirError(
            f"results_dir '{results_dir}' cannot be written ({err.strerror or err}); "
            f"set results_dir=<a writable directory>"
        ) from err
    return path


def check_results_dir(results_dir: str | Path) -> None:
    """Raise ResultsDirError when ``results_dir`` (or, where it does not exist yet, the nearest folder
    above it) cannot be written: a read-only file system, missing permissions. Writes nothing, so
    the workflow can call it when it is parsed (also for a dry run)."""
    path = Path(results_dir).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        why = "is not a folder" if not existing.is_dir() else "cannot be written"
        raise ResultsDirError(f"results_dir '{results_dir}': {existing} {why}; set results_dir=<a writable directory>")


def check_finite(samples: dict[str, Iterable[float]], extra_metrics: dict[str, float] | None = None) -> None:
    """Raise NonFiniteMetricError naming the first metric with a NaN or infinite value."""
    values = {
        **{name: [float(v) for v in vals] for name, vals in samples.items()},
        **{name: [float(value)] for name, value in (extra_metrics or {}).items()},
    }
    for name, vals in values.items():
        bad = [i for i, v in enumerate(vals) if not math.isfinite(v)]
        if bad:
            raise _non_finite(
                name, f"non-finite values ({len(bad)} of {len(vals)}, the first {vals[bad[0]]} at sample {bad[0]})"
            )


def _non_finite(name: str, what: str) -> NonFiniteMetricError:
    loss = "loss" in name or "nll" in name
    advice = "lower train.lr" if loss else "the measurement failed, see the run's log"
    return NonFiniteMetricError(
        f"{'losses diverged: ' if loss else ''}metric '{name}' has {what}; no record is written; {advice}"
    )


def _first_non_finite(obj: Any, path: str = "") -> tuple[str, float] | None:
    """The first (dotted key path, value) in ``obj`` whose number is NaN or infinite, or None."""
    if isinstance(obj, float):
        return None if math.isfinite(obj) else (path, obj)
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        found = _first_non_finite(value, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


def summarize(samples: Iterable[float]) -> dict[str, float]:
    """Median, p95, mean, min, max and count of per-iteration samples."""
    x = np.asarray(list(samples), dtype=float)
    if x.size == 0:
        raise ValueError("cannot summarize an empty list of samples")
    return {
        "median": float(np.median(x)),
        "p95": float(np.percentile(x, 95)),
        "mean": float(x.mean()),
        "min": float(x.min()),
        "max": float(x.max()),
        "n": int(x.size),
    }


def make_record(
    *,
    paper: str,
    experiment: str,
    point: str,
    mode: str,
    backend: str,
    hardware: str,
    params: dict[str, Any],
    samples: dict[str, list[float]],
    config: dict[str, Any],
    extra_metrics: dict[str, float] | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """Assemble a record; ``samples`` are per-iteration values (worst rank), summarized here.

    ``extra_metrics`` are single values (e.g. a final loss) stored as {"value": x}. A measured
    record gets the host's noise during its last timed window (moe_core.host.noise). Raises
    NonFiniteMetricError when a sample or metric is NaN or infinite.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    check_finite(samples, extra_metrics)
    metrics = {name: summarize(vals) for name, vals in samples.items()}
    for name, value in (extra_metrics or {}).items():
        metrics[name] = {"value": float(value)}
    record = {
        "schema_version": SCHEMA_VERSION,
        "paper": paper,
        "experiment": experiment,
        "point": point,
        "mode": mode,
        "backend": backend,
        "hardware": hardware,
        "params": _plain(params),
        "metrics": metrics,
        "samples": {k: [float(v) for v in vals] for k, vals in samples.items()},
        "environment": environment(device),
        "config": _plain(config),
    }
    if mode == "measured":
        record["noise"] = WINDOW.noise(record["samples"])
    return record


DIGEST_KEY = "digest"
DIGEST_PREFIX = "sha256:"


def record_digest(record: dict[str, Any]) -> str:
    """``sha256:<hex>`` of ``record`` without its own digest, as canonical JSON (sorted keys, no
    spaces): equal for the record written and the record read back, whatever its indentation."""
    content = {key: value for key, value in record.items() if key != DIGEST_KEY}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return DIGEST_PREFIX + hashlib.sha256(text.encode()).hexdigest()


def record_path(results_dir: str | Path, paper: str, experiment: str, point: str) -> Path:
    return Path(results_dir) / "raw" / paper / experiment / f"{point}.json"


@contextmanager
def atomic_outputs(*paths: str | Path) -> Iterator[list[Path]]:
    """Yield a temporary path beside each of ``paths``; when the block succeeds they replace the
    paths, when it fails they are removed and the old files stay as they were.

    Readers see the old files or the whole new ones, never a partial write (and for a figure's PNG
    and PDF, never a new one beside an old one). The temporary files are created with the process
    umask (not mkstemp's 0600), so results stay readable on shared clusters.
    """
    paths = [Path(p) for p in paths]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmps = [path.with_name(f".{path.name}.{os.getpid()}.tmp") for path in paths]
    try:
        yield tmps
        for tmp, path in zip(tmps, paths):
            os.replace(tmp, path)
    except BaseException:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """:func:`atomic_outputs` of one file: yield its temporary path."""
    with atomic_outputs(path) as (tmp,):
        yield tmp


def write_record(record: dict[str, Any], path: str | Path) -> Path:
    """Write ``record`` as strict JSON atomically, with its :func:`record_digest`; a NaN or infinite
    number anywhere in it raises NonFiniteMetricError, naming its key path, before anything is written. Inside
    :func:`staged_records` the file goes to the staging folder and reaches ``path`` only when the
    whole run succeeded; the returned path is ``path`` either way. A failed write (a full disk)
    raises ResultsDirError naming the file."""
    found = _first_non_finite(record)
    if found:
        where, value = found
        section, _, rest = where.partition(".")
        if section in ("samples", "metrics") and rest:
            raise _non_finite(rest.split(".")[0], f"the non-finite value {value} (at {where})")
        raise NonFiniteMetricError(
            f"record field '{where}' is {value}, which strict JSON cannot hold; no record is written"
        )
    text = json.dumps({**record, DIGEST_KEY: record_digest(record)}, indent=1, allow_nan=False)
    staging = joined_stage()
    target = Path(staging) / f"{uuid.uuid4().hex}.json" if staging else Path(path)
    try:
        with atomic_output(target) as tmp, open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if staging:
            target.with_suffix(".target").write_text(str(Path(path).absolute()))
    except OSError as err:
        raise ResultsDirError(
            f"cannot write record {path} ({err.strerror or err}); free space in, or fix the permissions of, "
            f"that folder, or set results_dir=<a writable directory>"
        ) from err
    return Path(path)


# Staged records: a run publishes all of its records or none. Set for the processes of a run (the
# launcher's ranks inherit it), it names the folder write_record writes into; staged_records moves
# the files into place when the run ends well.
STAGING_ENV = "MOE_BENCH_STAGING_DIR"
STAGING_ROOT = ".staging"  # under results_dir
STAGE_OWNER = "owner"  # in a stage: "<host> <pid> <start stamp>" of the process that publishes it


STAGE_ATTEMPTS = 10  # tries to create a stage while runs beside this one remove the shared root


class RecordStage:
    """The staging folder of one run's records (under ``<results_dir>/.staging/``, so that publishing
    is a rename on the same file system): one ``<id>.json`` per record, ``<id>.target`` with the
    path it is published to, and ``owner``, the process that publishes it (:func:`stage_owner_ended`)."""

    def __init__(self, results_dir: str | Path):
        root = check_writable(results_dir) / STAGING_ROOT
        remove_stale_stages(root)
        for _ in range(STAGE_ATTEMPTS):
            root.mkdir(exist_ok=True)
            try:
                self.path = Path(tempfile.mkdtemp(dir=root, prefix=f"{os.getpid()}-"))
                break
            except FileNotFoundError:  # a run beside this one published and removed the empty root
                continue
        else:
            raise ResultsDirError(f"cannot create a staging folder under {root}: it keeps disappearing")
        (self.path / STAGE_OWNER).write_text(f"{socket.gethostname()} {os.getpid()} {started_at(os.getpid())}")
        self.discarded = False

    def publish(self) -> list[Path]:
        """Move every staged record to its path (replacing an older one); the published paths."""
        published = []
        for target_file in sorted(self.path.glob("*.target")):
            target = Path(target_file.read_text())
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(target_file.with_suffix(".json"), target)
            published.append(target)
        self.remove()
        return published

    def discard(self) -> None:
        """Drop every staged record: the run failed, so none of its records is published."""
        self.discarded = True
        self.remove()

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        with suppress(OSError):  # other runs may be staging beside this one
            self.path.parent.rmdir()


def stage_owner_ended(stage: Path) -> bool:
    """Whether the process that publishes ``stage`` has ended: its owner file names a process of this
    host that no longer runs (a pid now naming another process counts as ended). A stage of another
    host (a multi-node job's, on a shared file system) or without an owner yet (being created) is
    taken as live: nothing here can tell."""
    try:
        host, pid, start = (stage / STAGE_OWNER).read_text().split()
    except (OSError, ValueError):
        return False
    return host == socket.gethostname() and status_of(int(pid), start) is None


def remove_stale_stages(root: Path) -> None:
    """Remove the stages under ``root`` whose owner has ended (:func:`stage_owner_ended`): a run killed
    with SIGKILL (or a crashed host) never publishes or removes its stage, and its records are no
    run's to publish."""
    for stage in root.glob("*/"):
        if stage_owner_ended(stage):
            shutil.rmtree(stage, ignore_errors=True)


def joined_stage(results_dir: str | Path | None = None) -> Path | None:
    """The stage this process writes its records into: ``STAGING_ENV``'s, set by the run it belongs to
    (:func:`staged_records`, e.g. in experiments.launch for its ranks), or None when it is unset.

    Only a live stage is joined, and given ``results_dir`` only one of that results directory: a
    value inherited from elsewhere (an exported shell variable, a finished or killed run, a run on
    another results_dir) would take this run's records into a folder nobody publishes, and the run
    would end well with no record written. Such a value raises ResultsDirError."""
    value = os.environ.get(STAGING_ENV)
    if not value:
        return None
    stage = Path(value)
    if not stage.is_dir() or stage_owner_ended(stage):
        why = "is no staging folder of a running run"
    elif results_dir is not None and stage.parent.resolve() != (Path(results_dir) / STAGING_ROOT).resolve():
        why = f"is not a staging folder of results_dir '{results_dir}'"
    else:
        return stage
    raise ResultsDirError(
        f"{STAGING_ENV}={value} {why}: a run sets it for its own processes only; unset it (`unset {STAGING_ENV}`)"
    )


@contextmanager
def staged_records(results_dir: str | Path) -> Iterator[RecordStage | None]:
    """Stage every record written inside the block; publish them when it ends without an error and
    without ``stage.discard()``, else drop them, so that a run that fails anywhere (a full disk
    halfway, a W&B error after the last record, a rank hung at teardown) leaves no record it claims.

    Inside a run that already stages (``STAGING_ENV`` set, e.g. an entry point under
    experiments.launch) it joins that stage and yields None: the outer run publishes. A
    ``STAGING_ENV`` that names no live stage of ``results_dir`` raises ResultsDirError (:func:`joined_stage`).
    """
    if joined_stage(results_dir):
        yield None
        return
    stage = RecordStage(results_dir)
    os.environ[STAGING_ENV] = str(stage.path)
    try:
        yield stage
    except BaseException:
        stage.discard()
        raise
    finally:
        del os.environ[STAGING_ENV]
    if stage.discarded:
        return
    try:
        stage.publish()
    except OSError as err:
        stage.remove()
        raise ResultsDirError(f"cannot publish the records of this run under {results_dir} ({err})") from err


@contextmanager
def exit_if_unwritable() -> Iterator[None]:
    """Around a measured entry point's record writes (rank 0): a record that cannot be written (a
    full disk, a folder made read-only) ends the process with exit code 1 and one line naming the
    file, rather than a traceback."""
    try:
        yield
    except ResultsDirError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def write_records(
    records: Iterable[dict[str, Any]], results_dir: str | Path, paths: Iterable[str | Path] | None = None
) -> list[Path]:
    """Write each record to its path in ``paths`` (default: its :func:`record_path` under
    ``results_dir``), all or none (:func:`staged_records`): a failure halfway (a full disk, a
    non-finite metric) leaves none of them; then mirror them to W&B under ``results_dir``
    (moe_core.records.tracking, which never raises). Every record of the suite is written here.
    Raises ResultsDirError or NonFiniteMetricError."""
    records = list(records)
    if not records:  # a rank without records (every measured rank but 0) stages nothing
        return []
    if paths is None:
        paths = [record_path(results_dir, r["paper"], r["experiment"], r["point"]) for r in records]
    with staged_records(results_dir):
        written = [write_record(r, path) for r, path in zip(records, paths, strict=True)]
    mirror_records(records, results_dir)
    return written


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not strict JSON")


def read_record(path: str | Path) -> dict[str, Any]:
    """Read a record; raises ValueError for a wrong schema version or a non-finite number."""
    with open(path) as f:
        try:
            record = json.load(f, parse_constant=_refuse_constant)
        except ValueError as err:
            raise ValueError(f"{path}: not a record ({err})") from err
    if record.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {record.get('schema_version')} != {SCHEMA_VERSION}")
    return record


def environment(device: str = "cpu") -> dict[str, Any]:
    """What the numbers were measured on: versions, host (rank 0's) and hosts (every rank's), device,
    git commit."""
    import torch

    env = {
        "git_sha": _git_sha(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "host": socket.gethostname(),
        "hosts": list(RANK_HOSTS) or [socket.gethostname()],  # every rank's, by rank: the nodes a run spanned
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
    """The commit the code ran from, ``-dirty`` when tracked files differ from it (a record made from
    an uncommitted tree names the commit it started from, not the code it ran)."""

    def git(*args: str) -> str:
        here = Path(__file__).resolve().parent
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, cwd=here).stdout.strip()

    try:
        sha = git("rev-parse", "--short", "HEAD")
        return f"{sha}-dirty" if sha and git("status", "--porcelain", "--untracked-files=no") else sha or "unknown"
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
