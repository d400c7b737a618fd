"""Measured MoE inference with Lina's dynamic expert placement: every policy in one run, under torchrun.

    torchrun --standalone --nproc-per-node=4 -m experiments inference --config configs/default.yaml \\
        parallel.world_size=4 moe.num_experts=4 model.n_layers=8 model.moe_every=1 train.data_zipf=1.5 \\
        inference.batches=30 --checkpoint results/checkpoints/lina_inference_e4.pt

1. Rank 0 trains the model for ``inference.train_steps`` steps on MarkovTokens (``train.data_zipf`` > 1
   skews token, hence expert, popularity; the skew comes from the model's own gate) or loads
   ``--checkpoint``, and sends the weights to every rank.
2. Rank 0 profiles the expert paths (top-``inference.top_k`` gate, path length ``inference.path_length``) on
   ``inference.profile_batches`` further batches and sends the profile to every rank.
3. ``inference.warmup_batches`` + ``inference.batches`` inference batches: every rank draws its own
batch, and every policy
   runs on the same tokens, in an order rotated per batch so that machine drift hits all alike.
   Each forward starts after a barrier; the MoE layers' phases are timed per rank, the worst rank
   kept per batch (moe_core.host.timing).
4. Rank 0 writes one record per policy (paper ``lina``, experiment ``inference``): per batch, the
   whole forward's time ``forward_ms`` (Lina Fig 16's inference time), the MoE layers' time
   ``moe_layer_ms`` (Fig 17) and the same normalised to the median of ``ideal``, per-phase times,
   each MoE layer's all-to-all time ``a2a_layer<i>_ms`` (Fig 18), load imbalance, nll (equal for
   every policy but ``ideal``: placement never changes the math); the profiled model's expert
   popularity ratio (Fig 6) and path top-k shares (Fig 9); and for Lina's policies the estimation
   accuracy and re-plan rate (overall and per layer) and the scheduler's host time per decision and
   per phase-2 check (§5.2).

Its settings are the config's ``inference`` keys (moe_core/papers/lina/config.py, InferenceConfig).
``inference.a2a_policy=aurora`` (or ``aurora-sjf``, ``aurora-rcs``) runs every token all-to-all as
Aurora's ordered point-to-point rounds instead of ``all_to_all_single``; the records then carry the
policy in their params and a ``_a2a-<policy>`` suffix in their point names.
Layout keys: ``parallel.world_size`` is the number of devices N; ``moe.experts_per_rank`` only has
to satisfy the config's layout check (the placement, not the training layout, decides where
experts run). ``parallel.timeout_s`` must exceed rank 0's time for HEARTBEAT_STEPS training steps.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from experiments.benchmark import measured_record
from moe_core.config.load import ConfigError, load_config, to_container
from moe_core.dispatch import routes_dropless
from moe_core.host.timing import PhaseTimer, gather_worst_rank
from moe_core.model.data import MarkovTokens
from moe_core.model.transformer import MoETransformer
from moe_core.papers.lina.inference import Scheduler, attach, batch_metrics, top1_choices, use_inference_gating
from moe_core.papers.lina.placement import path_topk_share, popularity_ratio, profile_paths, schedule_rates
from moe_core.records.results import atomic_output, exit_if_unwritable, write_records
from moe_core.runtime.distributed import Env, init_distributed, leave_together, naming_failed_ranks, shutdown

PAPER, EXPERIMENT = "lina", "inference"


HEARTBEAT_STEPS = 10  # rank 0 trains alone; the others meet it at a barrier every this many steps


def trained_model(cfg, args, env: Env) -> tuple[MoETransformer, dict[str, float]]:
    """The same trained weights on every rank: rank 0 trains (or loads ``--checkpoint``), then broadcasts.

    While rank 0 trains, the other ranks wait in barriers every HEARTBEAT_STEPS steps rather than in
    one long broadcast, so a hung rank 0 is still found within ``parallel.timeout_s``.
    """
    torch.manual_seed(cfg.train.seed)
    model = MoETransformer(cfg, dropless=routes_dropless(cfg)).to(env.device)
    fingerprint = {k: to_container(cfg)[k] for k in ("model", "moe", "train")} | {"steps": cfg.inference.train_steps}
    ckpt = Path(args.checkpoint) if args.checkpoint else None
    saved = None
    if env.rank == 0 and ckpt is not None and ckpt.is_file():
        saved = torch.load(ckpt, map_location=env.device)
        if saved["fingerprint"] != fingerprint:
            raise RuntimeError(
                f"--checkpoint {ckpt} was trained with another model/moe/train config or "
                f"inference.train_steps; delete it or pass another path"
            )
    must_train = [saved is None]
    dist.broadcast_object_list(must_train, 0)
    info = {}
    if env.rank == 0 and saved is not None:
        model.load_state_dict(saved["state"])
        info = saved["info"]
    elif env.rank == 0:
        info = train(model, cfg, cfg.inference.train_steps, env.device)
        if ckpt is not None:
            with atomic_output(ckpt) as tmp:  # sweep points sharing a checkpoint never read a partial one
                torch.save({"fingerprint": fingerprint, "state": model.state_dict(), "info": info}, tmp)
    elif must_train[0]:
        for _ in range(cfg.inference.train_steps // HEARTBEAT_STEPS):
            dist.barrier()
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, 0)
    return model, info


def train(model: MoETransformer, cfg, steps: int, device: torch.device) -> dict[str, float]:
    """Plain single-process training with the config's gate (top-k, capacity, aux loss).

    On CPU it uses every core of the host: the other ranks only wait for the weights meanwhile.
    """
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    data = MarkovTokens(cfg.model.vocab_size, cfg.train.data_branching, cfg.train.data_zipf, cfg.train.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    nll_first = nll = float("nan")
    start = time.perf_counter()
    for step in tqdm(range(steps), desc="inference: training", file=sys.stderr):  # rank 0 alone
        x, y = (t.to(device) for t in data.batch(cfg.train.batch_size, cfg.model.seq_len, step, 0))
        loss, nll = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        nll = nll.item()
        nll_first = nll if step == 0 else nll_first
        if (step + 1) % HEARTBEAT_STEPS == 0:
            dist.barrier()
    torch.set_num_threads(threads)
    if steps == 0:  # an untrained gate: no training loss to record (records hold finite numbers only)
        return {}
    print(
        f"trained {steps} steps in {time.perf_counter() - start:.1f} s: nll {nll_first:.3f} -> {nll:.3f}",
        file=sys.stderr,
    )
    return {"train_nll_first": nll_first, "train_nll_last": nll}


def profile(model: MoETransformer, cfg, env: Env, data: MarkovTokens):
    """Rank 0 records the top-1 expert paths on fresh batches; every rank gets the PathProfile.

    Returns (profile, statistics of the profiled choices): on rank 0, Fig 6's ``popularity_ratio``
    (left out when every layer has an expert without tokens) and Fig 9's ``path_topk_share_k1`` and
    ``_k2`` (groups of tokens that picked the same expert in the layer before); empty elsewhere.
    """
    box, stats = [None], {}
    if env.rank == 0:
        batches = [
            data.batch(cfg.train.batch_size, cfg.model.seq_len, cfg.inference.train_steps + b, 0)
            for b in range(cfg.inference.profile_batches)
        ]
        choices = np.concatenate([top1_choices(model, x.to(env.device), y.to(env.device)) for x, y in batches], axis=1)
        box[0] = profile_paths(choices, cfg.moe.num_experts, cfg.inference.path_length)
        one_back = profile_paths(choices, cfg.moe.num_experts, 1)
        stats = {f"path_topk_share_k{k}": path_topk_share(one_back, k) for k in (1, 2)}
        ratio = popularity_ratio(choices, cfg.moe.num_experts)
        stats |= {} if np.isnan(ratio) else {"popularity_ratio": ratio}
    dist.broadcast_object_list(box, 0)
    return box[0], stats


def run_policies(model, placed, schedulers: dict[str, Scheduler], cfg, env: Env, data: MarkovTokens, timer: PhaseTimer):
    """Every batch through every policy; returns worst-rank samples per policy."""
    local = {p: defaultdict(list) for p in schedulers}
    names = list(schedulers)
    first_step = cfg.inference.train_steps + cfg.inference.profile_batches
    batches = range(cfg.inference.warmup_batches + cfg.inference.batches)
    for b in tqdm(batches, desc="inference: batches", file=sys.stderr, disable=env.rank != 0):
        x, y = (t.to(env.device) for t in data.batch(cfg.train.batch_size, cfg.model.seq_len, first_step + b, env.rank))
        if b == cfg.inference.warmup_batches:
            for sched in schedulers.values():
                sched.reset_stats()
        for policy in names[b % len(names) :] + names[: b % len(names)]:
            sched = schedulers[policy]
            for layer in placed:
                layer.scheduler = sched
            sched.begin_batch()
            n_checks = len(sched.imbalance)
            dist.barrier()
            timer.reset()
            start = timer.stamp()
            with torch.no_grad():
                _, nll = model(x, y)
            timer.add("forward", start, timer.stamp())
            ms = timer.elapsed_ms()
            nll = nll.detach().clone()
            dist.all_reduce(nll)
            if b >= cfg.inference.warmup_batches:
                out = local[policy]
                for name, value in batch_metrics(ms, len(placed)).items():
                    out[name].append(value)
                out["forward_ms"].append(ms["forward"])
                out["load_imbalance"].append(float(np.mean(sched.imbalance[n_checks:])))
                out["nll"].append(nll.item() / env.world_size)
    return {p: gather_worst_rank(v) for p, v in local.items()}


def policy_metrics(samples: dict[str, list[float]], ideal_median_ms: float, sched: Scheduler) -> dict[str, float]:
    """Add the normalised time to ``samples``; return the single-value metrics of a policy."""
    samples["moe_layer_norm"] = [t / ideal_median_ms for t in samples["moe_layer_ms"]]
    if not sched.estimate_right:
        return {}
    extra = schedule_rates(sched.estimate_right, sched.replanned)
    extra["schedule_decision_ms"] = float(np.median(sched.decide_ms))  # rank 0's host time per layer
    if sched.check_ms:
        extra["phase2_check_ms"] = float(np.median(sched.check_ms))
    layers = np.asarray(sched.checked_layers)
    right = np.asarray(sched.estimate_right)
    for layer in np.unique(layers):
        extra[f"estimation_accuracy_layer{layer}"] = float(right[layers == layer].mean())
    return extra


def policy_point(cfg, world_size: int, policy: str, keep: int, moe_layers: int) -> tuple[dict, str]:
    """A policy's record parameters and point name in an inference run of ``cfg``."""
    params = {
        "world_size": world_size,
        "num_experts": cfg.moe.num_experts,
        "policy": policy,
        "top_k": cfg.inference.top_k,
        "path_length": cfg.inference.path_length,
        "keep": keep,
        "seed": cfg.train.seed,
        "data_zipf": cfg.train.data_zipf,
        "tokens_per_rank": cfg.train.batch_size * cfg.model.seq_len,
        "moe_layers": moe_layers,
        "train_steps": cfg.inference.train_steps,
        "a2a_policy": cfg.inference.a2a_policy,
    }
    a2a = "" if cfg.inference.a2a_policy == "library" else f"_a2a-{cfg.inference.a2a_policy}"
    point = (
        f"ws{world_size}_e{cfg.moe.num_experts}_k{cfg.inference.top_k}_l{cfg.inference.path_length}"
        f"_{policy}_s{cfg.train.seed}{a2a}"
    )
    return params, point


def summary_line(m: dict, extra: dict) -> str:
    """What the console says of a policy's record (``m``: its metrics)."""
    rates = (
        f", estimation accuracy {extra['estimation_accuracy']:.0%}, re-plan rate {extra['replan_rate']:.0%}"
        if "replan_rate" in extra
        else ""
    )
    return (
        f"MoE layers {m['moe_layer_ms']['median']:.2f} ms median "
        f"({m['moe_layer_norm']['median']:.2f}x ideal), p95 {m['moe_layer_norm']['p95']:.2f}x ideal, "
        f"imbalance {m['load_imbalance']['median']:.2f}{rates}"
    )


def run(args: argparse.Namespace, world_size_key: str) -> int:
    """Every policy's inference on every rank for ``args`` (experiments.inference's command line):
    exit code 2 for a bad config, before any process group is created."""
    try:
        cfg = load_config(args.config, args.overrides, data={"paper": PAPER, "experiment": EXPERIMENT})
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    env = init_distributed(cfg, world_size_key=world_size_key)
    try:
        with naming_failed_ranks(env):
            model, info = trained_model(cfg, args, env)
            model.eval()
            use_inference_gating(model, cfg.inference.top_k)
            data = MarkovTokens(cfg.model.vocab_size, cfg.train.data_branching, cfg.train.data_zipf, cfg.train.seed)
            path_profile, profile_stats = profile(model, cfg, env, data)
            timer = PhaseTimer(env.device)
            placed = attach(model, cfg.inference.top_k, timer, a2a_policy=cfg.inference.a2a_policy)
            keep = cfg.inference.keep or cfg.inference.top_k
            schedulers = {
                p: Scheduler(p, path_profile, env.world_size, cfg.inference.top_k, keep)
                for p in ["ideal", *cfg.inference.policies]
            }
            samples = run_policies(model, placed, schedulers, cfg, env, data, timer)
        if env.rank == 0:
            ideal_median = float(np.median(samples["ideal"]["moe_layer_ms"]))
            for policy, sched in schedulers.items():
                extra = info | profile_stats | policy_metrics(samples[policy], ideal_median, sched)
                params, point = policy_point(cfg, env.world_size, policy, keep, len(placed))
                record = measured_record(
                    cfg,
                    paper=PAPER,
                    experiment=EXPERIMENT,
                    point=point,
                    params=params,
                    samples=samples[policy],
                    extra_metrics=extra,
                )
                with exit_if_unwritable():
                    out = [Path(args.out_dir) / f"{point}.json"] if args.out_dir else None
                    (path,) = write_records([record], cfg.results_dir, out)
                print(f"wrote {path}: {summary_line(record['metrics'], extra)}", file=sys.stderr)
        leave_together(env)
    finally:
        shutdown()
    return 0
