"""Lina's inference at the paper's scale, simulated: every placement policy on the paper's testbed.

    python -m experiments lina_inference_sim --config configs/default.yaml

For each count in ``lina.inference_experts`` (experts = GPUs of ``lina.hardware``): the simulated
training model (``lina.overrides``) with top-1 routing and no capacity, on synthetic routing with
the paper's popularity skew (Fig 6) and path following (Fig 9) (moe_core/papers/lina/routing.py).
``inference.profile_batches`` batches are profiled into expert paths of ``inference.path_length``
layers; then ``lina.inference_batches`` batches run under every policy (``ideal`` and
``inference.policies``), each batch's forward pass simulated (moe_core.sim.forward).

Records (paper ``lina``, experiment ``inference``, mode simulated, backend sim, the profile as
hardware), one per policy and expert count, in the measured inference's schema, so the same
reproducers read both: per batch ``forward_ms`` (Fig 16), ``moe_layer_ms`` (Fig 17) and
``moe_layer_norm`` (over ideal's median), per-phase times, each MoE layer's all-to-all time
``a2a_layer<i>_ms`` (Fig 18) and ``load_imbalance``; for Lina's policies the estimation accuracy
and re-plan rate. Point names start with ``sim_``.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import numpy as np
from omegaconf import DictConfig
from tqdm import tqdm

from experiments.benchmark import predictions_main, sim_record
from moe_core.config.load import derive_config
from moe_core.model.capacity import moe_blocks
from moe_core.papers.lina.config import INFERENCE_POLICIES, INFERENCE_UNSTATED
from moe_core.papers.lina.inference_sim import simulate_policies
from moe_core.papers.lina.placement import merge_profiles, profile_paths, schedule_rates
from moe_core.papers.lina.routing import lina_routing
from moe_core.schema.points import own_layout, unstated_param, unstated_variants
from moe_core.sim.forward import ForwardModel
from moe_core.sim.topology import build_topology

PAPER, EXPERIMENT = "lina", "inference"


def policies(cfg: DictConfig) -> list[str]:
    return ["ideal", *(p for p in INFERENCE_POLICIES if p in cfg.inference.policies)]


def point_name(cfg: DictConfig, experts: int, policy: str, variant: str = "") -> str:
    return f"sim_ws{experts}_e{experts}_k1_l{cfg.inference.path_length}_{policy}_s{cfg.train.seed}{variant}"


def runs(cfg: DictConfig) -> dict[tuple[int, str], list[str]]:
    """(experts, variant suffix) -> overrides: every expert count at the chosen values of the unstated
    parameters, and at the other ends of their ranges (``INFERENCE_UNSTATED``)."""
    out = {}
    for experts in cfg.lina.inference_experts:
        out[experts, ""] = []
        stem = f"e{experts}"
        for name, overrides in unstated_variants(cfg, stem, [], INFERENCE_UNSTATED).items():
            out[experts, name.removeprefix(stem)] = overrides
    return out


def record_points(cfg: DictConfig) -> list[str]:
    """The record names of a run (the workflow's outputs)."""
    return [point_name(cfg, e, p, variant) for e, variant in runs(cfg) for p in policies(cfg)]


def inference_config(cfg: DictConfig, experts: int, variant: list[str] = ()) -> DictConfig:
    """The run's config for ``experts`` experts on as many GPUs of ``lina.hardware``, with a
    sensitivity variant's overrides."""
    overrides = [
        *own_layout(),
        *cfg.lina.overrides,
        f"hardware_profile={cfg.lina.hardware}",
        f"parallel.world_size={experts}",
        f"moe.num_experts={experts}",
        "moe.experts_per_rank=1",
        "moe.top_k=1",
        "moe.dispatcher=dropless",
        "moe.permute=index",  # no capacity slots to fill: the training model's einsum does not apply
        "comm.policy=sequential",
        *variant,
    ]
    return derive_config(cfg, overrides)


def batch_inputs(run: DictConfig) -> tuple:
    """What a run's batches and placements depend on: its experts (= GPUs), MoE layers, tokens per GPU
    and routing drift. Runs equal in these (variants of the hardware) see the same batches and
    decisions; only their passes' prices differ."""
    layers = len(moe_blocks(run.model.n_layers, run.model.moe_every))
    return run.moe.num_experts, layers, run.train.batch_size * run.model.seq_len, run.lina.inference_drift


def shared_batch_records(cfg: DictConfig, runs: dict[tuple[int, str], DictConfig]) -> dict[tuple[int, str], list[dict]]:
    """Every policy's records of runs ((experts, variant suffix) -> config) with equal ``batch_inputs``:
    the batches are drawn, profiled and placed once, and each run's forward model prices the
    placements."""
    first = next(iter(runs.values()))
    experts, layers, tokens_per_rank, drift = batch_inputs(first)
    models = [ForwardModel(run, build_topology(run.hardware)) for run in runs.values()]
    routing = lina_routing(experts, layers, drift, seed=cfg.train.seed)
    tokens = experts * tokens_per_rank
    inference = cfg.inference
    profile = merge_profiles(
        [
            profile_paths(routing.batch(tokens, b), experts, inference.path_length)
            for b in range(inference.profile_batches)
        ]
    )
    keep = inference.keep or 1
    samples, schedulers = simulate_policies(
        models, routing, profile, policies(cfg), inference.batches, inference.profile_batches, keep
    )
    records = {}
    for ((_, suffix), run), run_samples in zip(runs.items(), samples):
        ideal_median = float(np.median(run_samples["ideal"]["moe_layer_ms"]))
        records[experts, suffix] = []
        for policy, scheduler in schedulers.items():
            batch = run_samples[policy]
            batch["moe_layer_norm"] = [t / ideal_median for t in batch["moe_layer_ms"]]
            extra = schedule_rates(scheduler.estimate_right, scheduler.replanned) if scheduler.estimate_right else {}
            params = {
                **unstated_param(run),
                "world_size": experts,
                "num_experts": experts,
                "policy": policy,
                "top_k": 1,
                "path_length": inference.path_length,
                "keep": keep,
                "seed": cfg.train.seed,
                "tokens_per_rank": tokens_per_rank,
                "moe_layers": layers,
                "a2a_policy": "library",
                "routing_zipf": routing.zipf,
                "routing_stickiness": routing.stickiness,
                "routing_drift": routing.drift,
            }
            records[experts, suffix].append(
                sim_record(
                    run,
                    paper=PAPER,
                    experiment=EXPERIMENT,
                    point=point_name(cfg, experts, policy, suffix),
                    hardware=run.hardware.name,
                    params=params,
                    samples=batch,
                    extra_metrics=extra,
                )
            )
    return records


def make_records(cfg: DictConfig) -> list[dict]:
    """Every run's records, in ``runs``' order (minutes: a progress bar counts the runs). Runs that
    see the same batches (``batch_inputs``) are simulated together."""
    configs = {key: inference_config(cfg, key[0], variant) for key, variant in runs(cfg).items()}
    groups: dict[tuple, dict[tuple[int, str], DictConfig]] = defaultdict(dict)
    for key, run in configs.items():
        groups[batch_inputs(run)][key] = run
    records = {}
    with tqdm(total=len(configs), desc="lina inference runs", file=sys.stderr) as progress:
        for group in groups.values():
            records.update(shared_batch_records(cfg, group))
            progress.update(len(group))
    return [record for key in configs for record in records[key]]


def run(args: argparse.Namespace) -> int:
    """Compute and write the records of ``args`` (experiments.lina_inference_sim's command line)."""
    return predictions_main(args, make_records)
