"""External validation: the simulator against published hardware measurements that no one on this project made.

    python -m experiments external_validation --config configs/default.yaml

analysis/external_hardware.yaml lists each published number with its source and setting. For every entry the
simulator (moe_core.sim; no processes, no tensors) predicts the same quantity on the entry's hardware profile as
the profile is. Nothing here is fitted to these numbers: they are the held-out check, and tuning a profile to them
would make it circular. The prediction is computed the way the source computes its number:

* ``busbw_GBps`` (nccl-tests): size / time, times the collective's nccl-tests bus factor;
* ``nic_GBps``: the bytes one NIC carries in a uniform all-to-all, over the time;
* ``deepep_nvl_GBps`` / ``deepep_rdma_GBps`` (DeepEP's normal kernels, its tests/test_intranode.py and
  test_internode.py): the bytes DeepEP counts for a rank over the time: every token the rank receives, its own
  included ("NVL"), or one copy per (token, destination node), its own node included ("RDMA").

Records: ``results/raw/common/external_validation/<id>.json`` (mode simulated, backend sim, hardware: the
profile) with metrics ``predicted``, ``published``, ``published_low``, ``published_high``,
``rel_error = predicted / published - 1`` and ``predicted_ms`` (the simulated time of the operation).
"""

from __future__ import annotations

import argparse
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from experiments.benchmark import predicted_record, predictions_main, published_entries
from moe_core.comm.workloads import bus_bandwidth_factor
from moe_core.config.load import CONFIG_DIR, REPO_ROOT, ConfigError, load_config
from moe_core.sim.collectives import RING_COLLECTIVES, collective_op, simulate_collective, simulate_on
from moe_core.sim.engine import Op
from moe_core.sim.topology import Transfer, build_topology
from moe_core.units import GB

PAPER, EXPERIMENT = "common", "external_validation"
HARDWARE_FILE = REPO_ROOT / "analysis" / "external_hardware.yaml"

NCCL_TESTS_COLLECTIVES = (*RING_COLLECTIVES, "all_to_all")  # what an entry may name
# Bytes per hidden element as DeepEP counts them: FP8 is 1 byte plus one fp32 scale per 128 channels (its
# fp8_factor (1 + 4/128) / 2 of the BF16 bytes).
DEEPEP_ELEMENT_BYTES = {"fp8": 1 + 4 / 128, "bf16": 2.0}

REQUIRED_KEYS = ("id", "what", "source", "kind", "profile", "nodes", "world_size", "metric", "published", "notes")
KINDS = {  # kind -> (its own keys, the metrics it can predict)
    "nccl-tests": (("collective", "size_bytes"), ("busbw_GBps", "nic_GBps")),
    "deepep": (("workload",), ("deepep_nvl_GBps", "deepep_rdma_GBps")),
}
WORKLOAD_KEYS = ("phase", "dtype", "tokens_per_rank", "hidden", "num_experts", "top_k", "topk_groups")


# ----------------------------------------------------------------------------------------------
# The entries


def load_entries(path: str | Path = HARDWARE_FILE) -> list[dict[str, Any]]:
    """The entries of ``path`` in file order, checked; a bad one raises ValueError naming its id."""
    return published_entries(path, REQUIRED_KEYS, _checked)


def _checked(entry: Any, where: str) -> dict[str, Any]:
    """``entry`` (a mapping with every required key) with published_low/high defaulted to published,
    or ValueError saying what to fix."""
    if entry["kind"] not in KINDS:
        raise ValueError(f"{where}: unknown kind {entry['kind']!r}; use one of {list(KINDS)}")
    own_keys, metrics = KINDS[entry["kind"]]
    missing = [key for key in own_keys if key not in entry]
    if missing:
        raise ValueError(f"{where}: kind {entry['kind']!r} needs keys {missing}")
    if entry["metric"] not in metrics:
        raise ValueError(f"{where}: kind {entry['kind']!r} predicts {list(metrics)}, not {entry['metric']!r}")
    if not (CONFIG_DIR / "hardware" / f"{entry['profile']}.yaml").is_file():
        raise ValueError(f"{where}: unknown profile {entry['profile']!r}; add configs/hardware/<profile>.yaml")
    if entry["kind"] == "nccl-tests":
        _check_collective(entry, where)
    else:
        check_ep_workload(entry, where, WORKLOAD_KEYS, "dtype", DEEPEP_ELEMENT_BYTES)
    entry = {"published_low": entry["published"], "published_high": entry["published"], **entry}
    values = [entry[key] for key in ("published_low", "published", "published_high")]
    if not all(_positive(v) for v in values) or values != sorted(values):
        raise ValueError(f"{where}: need 0 < published_low <= published <= published_high, got {values}")
    return entry


def _check_collective(entry: dict, where: str) -> None:
    if entry["collective"] not in NCCL_TESTS_COLLECTIVES:
        raise ValueError(
            f"{where}: unknown collective {entry['collective']!r}; use one of {list(NCCL_TESTS_COLLECTIVES)}"
        )
    if entry["metric"] == "nic_GBps" and entry["collective"] != "all_to_all":
        raise ValueError(f"{where}: nic_GBps is defined for all_to_all only")
    if not _positive(entry["size_bytes"]):
        raise ValueError(f"{where}: size_bytes must be a positive number of bytes")


def check_ep_workload(entry: dict, where: str, keys: tuple[str, ...], element: str, elements) -> None:
    """An expert-parallel exchange's workload of a published entry (DeepEP's tables: this file's and
    external_dispatch.yaml's), or ValueError saying what to fix: its ``keys`` all given, its token
    ``element`` (how a token's values are stored) one of ``elements``, a phase, experts that divide
    over the ranks and node groups that exist."""
    w = entry["workload"]
    missing = [key for key in keys if key not in (w if isinstance(w, dict) else {})]
    if missing:
        raise ValueError(f"{where}: workload needs keys {missing}")
    if w[element] not in elements or w["phase"] not in ("dispatch", "combine"):
        raise ValueError(f"{where}: workload {element} must be one of {list(elements)}, phase dispatch|combine")
    if w["num_experts"] % entry["world_size"] or not 1 <= w["topk_groups"] <= entry["nodes"]:
        raise ValueError(f"{where}: need num_experts divisible by world_size and 1 <= topk_groups <= nodes")


def _positive(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value > 0


def record_points(cfg: DictConfig) -> list[str]:
    """Every point name one run writes: the entries' ids (pure; the workflow declares them)."""
    return [entry["id"] for entry in load_entries()]


def entry_hardware(entry: dict) -> DictConfig:
    """The entry's profile as it is, with the entry's node count (which must hold exactly its ranks)."""
    overrides = [f"hardware_profile={entry['profile']}", f"hardware.nodes={entry['nodes']}"]
    try:
        hw = load_config(overrides=overrides, whole_run=False).hardware
    except ConfigError as err:
        raise ValueError(f"entry {entry['id']!r}: {err}") from err
    if entry["world_size"] != hw.nodes * hw.devices_per_node:
        raise ValueError(
            f"entry {entry['id']!r}: world_size {entry['world_size']} must be nodes x devices_per_node "
            f"= {hw.nodes} x {hw.devices_per_node} of profile {hw.name!r}"
        )
    return hw


# ----------------------------------------------------------------------------------------------
# Simulated time, and bandwidth as each source defines it


def simulated_seconds(hw: DictConfig, topo, kind: str, footprint: Transfer) -> float:
    """Seconds of collective ``kind`` with ``footprint`` alone on ``topo`` (with the profile's calibrated terms
    for ``kind``, if it has any)."""
    timeline = simulate_on(hw, topo, [Op(kind, "comm", **collective_op(hw, topo, kind, footprint))])
    return float(timeline.end_s[0] - timeline.start_s[0])


def collective_seconds(hw: DictConfig, topo, collective: str, world_size: int, size_bytes: float) -> float:
    """Simulated seconds of one nccl-tests collective of nccl-tests' ``size_bytes`` over ranks
    0..world_size-1 (moe_core.sim.collectives.footprint says which buffer that is)."""
    point = {"collective": collective, "world_size": world_size, "size_bytes": size_bytes}
    return simulate_collective(hw, topo, point) * 1e-3


def bus_bandwidth_GBps(collective: str, world_size: int, size_bytes: float, seconds: float) -> float:
    """nccl-tests busbw: algbw = size / time, times the collective's bus factor."""
    return size_bytes / seconds * bus_bandwidth_factor(collective, world_size) / GB


def nic_GBps(hw: DictConfig, world_size: int, size_bytes: float, seconds: float) -> float:
    """What one NIC carries per second in a uniform all-to-all of ``size_bytes`` per rank: each GPU's bytes for
    the ranks on other nodes, times the GPUs that share a NIC."""
    remote = world_size - hw.devices_per_node
    return size_bytes * remote / world_size * hw.devices_per_node / hw.nics_per_node / seconds / GB


def nccl_prediction(entry: dict, hw: DictConfig, topo) -> tuple[float, float]:
    """(the entry's metric as simulated, the simulated seconds) of one nccl-tests collective."""
    n, size = entry["world_size"], entry["size_bytes"]
    seconds = collective_seconds(hw, topo, entry["collective"], n, size)
    if entry["metric"] == "busbw_GBps":
        return bus_bandwidth_GBps(entry["collective"], n, size, seconds), seconds
    return nic_GBps(hw, n, size, seconds), seconds


@dataclass(frozen=True)
class DeepepRouting:
    """Expected routing of one token of DeepEP's benchmark, sent by a rank of local index 0 on node 0."""

    rank_hit: float  # probability that the token goes to a given rank
    nodes: float  # destination nodes, its own included (DeepEP's "RDMA" count)
    remote_nodes: float  # destination nodes other than its own: its copies over the network
    forwarded: float  # NVLink copies: per destination node, the ranks beyond the one of local index 0


def deepep_routing(workload: dict, world_size: int, nodes: int, tokens: int = 16384, seed: int = 0) -> DeepepRouting:
    """Expected routing of DeepEP's benchmark, from a seeded sample of its procedure (tests/test_internode.py;
    tests/test_intranode.py is the one-group case).

    Scores are |randn| + 1 per (token, expert); a token keeps the ``topk_groups`` nodes whose best expert scores
    highest, then its ``top_k`` experts among those nodes' experts. It goes to a rank once however many of its
    experts the rank holds, and (over RDMA) to a node once. The groups' best experts usually make the top k, so a
    token reaches about ``topk_groups`` nodes, more than uniform top-k over the same experts would give. Routing
    is the same from every rank, so the sender is taken to be rank 0.
    """
    k, groups, experts = workload["top_k"], workload["topk_groups"], workload["num_experts"]
    scores = np.abs(np.random.default_rng(seed).standard_normal((tokens, experts))) + 1  # (tokens, experts)
    best = scores.reshape(tokens, nodes, -1).max(axis=2)  # (tokens, nodes)
    chosen = _hits(np.argpartition(-best, groups - 1, axis=1)[:, :groups], nodes)  # (tokens, nodes)
    masked = np.where(np.repeat(chosen, experts // nodes, axis=1), scores, -np.inf)
    top = np.argpartition(-masked, k - 1, axis=1)[:, :k]  # (tokens, k) expert ids
    ranks_hit = _hits(top // (experts // world_size), world_size)  # (tokens, ranks)
    nodes_hit = _hits(top // (experts // nodes), nodes)  # (tokens, nodes)
    per_node = ranks_hit.reshape(tokens, nodes, world_size // nodes)  # (tokens, node, local index)
    return DeepepRouting(
        rank_hit=float(ranks_hit.mean()),
        nodes=float(nodes_hit.sum(axis=1).mean()),
        remote_nodes=float(nodes_hit[:, 1:].sum(axis=1).mean()),
        forwarded=float(per_node[:, :, 1:].sum(axis=(1, 2)).mean()),
    )


def _hits(owners: np.ndarray, count: int) -> np.ndarray:
    """(tokens, count) bool: whether each token picked anything owned by each of ``count`` owners."""
    hit = np.zeros((len(owners), count), dtype=bool)
    np.put_along_axis(hit, owners, True, axis=1)
    return hit


def deepep_prediction(entry: dict, hw: DictConfig, topo) -> tuple[float, float]:
    """(DeepEP's bandwidth as simulated, the simulated seconds) of one dispatch or combine.

    The exchange is DeepEP's own: each token crosses the network once per remote destination node and is
    forwarded there over NVLink (``forwarded_all_to_all``), with every rank sending and receiving the expected
    traffic of its tokens_per_rank tokens. A combine is the same exchange reversed, which leaves a uniform
    exchange unchanged; only its dtype differs. Inside one node this is a uniform all-to-all over NVLink.
    """
    w, n = entry["workload"], entry["world_size"]
    token_bytes = w["hidden"] * DEEPEP_ELEMENT_BYTES[w["dtype"]]
    routing = deepep_routing(w, n, entry["nodes"])
    sent = {
        leg: w["tokens_per_rank"] * copies * token_bytes
        for leg, copies in (("network", routing.remote_nodes), ("nvlink", routing.forwarded))
    }
    exchange = topo.forwarded_all_to_all(np.arange(n), sent["network"], sent["nvlink"])
    seconds = simulated_seconds(hw, topo, "all_to_all", exchange)
    if entry["metric"] == "deepep_nvl_GBps":  # every token the rank receives, its own included
        return n * w["tokens_per_rank"] * routing.rank_hit * token_bytes / seconds / GB, seconds
    return w["tokens_per_rank"] * routing.nodes * token_bytes / seconds / GB, seconds


PREDICTORS = {"nccl-tests": nccl_prediction, "deepep": deepep_prediction}


# ----------------------------------------------------------------------------------------------
# Records


def entry_params(entry: dict) -> dict[str, Any]:
    """The record's params: what was measured and its setting (``measure``: the metric's meaning; ``metric`` is a
    column of the records table)."""
    params = {"what": entry["what"], "kind": entry["kind"], "measure": entry["metric"]}
    params.update(world_size=entry["world_size"], nodes=entry["nodes"])
    if entry["kind"] == "nccl-tests":
        params.update(collective=entry["collective"], size_bytes=entry["size_bytes"])
    else:
        params.update(entry["workload"])
    return params


def external_records(cfg: DictConfig, path: str | Path = HARDWARE_FILE) -> list[dict]:
    """One predicted record per entry of ``path``."""
    records = []
    for entry in load_entries(path):
        hw = entry_hardware(entry)
        predicted, seconds = PREDICTORS[entry["kind"]](entry, hw, build_topology(hw))
        metrics = {key: entry[key] for key in ("published", "published_low", "published_high")}
        metrics.update(predicted=predicted, rel_error=predicted / entry["published"] - 1, predicted_ms=seconds * 1e3)
        records.append(
            predicted_record(
                cfg,
                paper=PAPER,
                experiment=EXPERIMENT,
                point=entry["id"],
                hardware=hw.name,
                params=entry_params(entry),
                metrics=metrics,
                backend="sim",
            )
        )
    return records


def run(args: argparse.Namespace) -> int:
    """Compute and write the records of ``args`` (experiments.external_validation's command line)."""
    return predictions_main(args, external_records)
