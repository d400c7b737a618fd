"""Measured MoE training steps: one sweep point, run under torchrun.

    torchrun --standalone --nproc-per-node=4 -m experiments train_step \\
        --config configs/default.yaml moe.num_experts=8 comm.policy=overlap

Each iteration: barrier, forward, backward, gradient synchronisation (the policy's plan), optimizer
step; a plan with a re-layout hook (moe_core.schedule.plan.Relayout: Lina's ``lina``, ``lina-pack`` pack
experts) re-decides the expert layout between steps and moves the experts when it changes.
Phases are timed per rank (moe_core.host.timing); per iteration the worst rank is kept; the record holds
median and p95 over the timed iterations. Rank 0 writes the record atomically once every rank has
finished, then mirrors it to W&B. ``--profile DIR`` runs a few more steps after the timed ones under
torch.profiler and writes each rank's trace and kernel summary there (moe_core.runtime.profiling). A bad
config exits with code 2 before any process group is created; a failing or hung rank makes every
rank exit non-zero within ``parallel.timeout_s``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.profiler import record_function
from tqdm import tqdm

from experiments.benchmark import measured_record
from moe_core.config.load import ConfigError, load_config, validate_measured
from moe_core.host.timing import PhaseTimer, gather_worst_rank
from moe_core.model.data import MarkovTokens
from moe_core.model.transformer import MoETransformer
from moe_core.parallel.grid import GRID_COLLECTIVES
from moe_core.parallel.layout import layout_of
from moe_core.parallel.parallelize import ParallelGroups, build_groups, parallelize_model
from moe_core.records.results import exit_if_unwritable, write_records
from moe_core.records.step_metrics import STEP_PHASES, a2a_shares, step_terms
from moe_core.runtime.distributed import Env, init_distributed, leave_together, naming_failed_ranks, shutdown
from moe_core.runtime.profiling import PROFILER_WARMUP_STEPS, TIMED_STEP, step_profiler, write_profile
from moe_core.schedule.executor import CommPolicy, make_policy, make_relayout
from moe_core.schedule.gradients import layout_plan
from moe_core.schema.points import point_name, point_params


def step_metrics(phases_ms: dict[str, float], counters: dict[str, float]) -> dict[str, float]:
    """One rank's metrics of one step from its timer's phase totals (``name.fwd``/``name.bwd``)."""
    ms = {p: phases_ms.get(f"{p}.fwd", 0.0) + phases_ms.get(f"{p}.bwd", 0.0) for p in STEP_PHASES}
    # a 3D grid's collectives (moe_core.parallel.grid_parallel regions grid_<kind>_<axis>.<pass>), by kind
    grid = {kind: 0.0 for kind in GRID_COLLECTIVES}
    for name, value in phases_ms.items():
        if name.startswith("grid_"):
            grid[next(k for k in GRID_COLLECTIVES if name.startswith(f"grid_{k}_"))] += value
    return {
        **step_terms(
            phases_ms["step"],
            ms,
            a2a_ms=ms["dispatch_a2a"] + ms["combine_a2a"],
            a2a_fwd_ms=phases_ms.get("dispatch_a2a.fwd", 0.0) + phases_ms.get("combine_a2a.fwd", 0.0),
            a2a_bwd_ms=phases_ms.get("dispatch_a2a.bwd", 0.0) + phases_ms.get("combine_a2a.bwd", 0.0),
            allreduce_exposed_ms=phases_ms["allreduce_exposed"],
        ),
        "grid_comm_ms": sum(grid.values()),
        **{f"grid_{kind}_ms": v for kind, v in grid.items()},
        "a2a_bytes": counters.get("dispatch_a2a.bytes", 0.0) + counters.get("combine_a2a.bytes", 0.0),
    }


@dataclass
class Training:
    """What the timed steps run on: the model parallelised on the layout's groups, the executor of
    its policy's plan, the optimizer, the re-layout driver, the data and the precision."""

    groups: ParallelGroups  # of the configured layout (groups.layout)
    model: MoETransformer
    timer: PhaseTimer
    policy: CommPolicy
    optimizer: torch.optim.Optimizer
    relayout: object  # moe_core.schedule.executor.make_relayout's driver
    data: MarkovTokens
    autocast: object  # a context manager: bfloat16 autocast, or none


def set_up(cfg, env: Env) -> Training:
    """The plan (built once, on the configured layout), the groups it needs, the model on them and
    the plan's executor attached to it."""
    layout = layout_of(cfg)
    element_bytes = torch.get_default_dtype().itemsize  # parameters (and so gradients) stay float32 under autocast
    plan = layout_plan(cfg, layout, element_bytes)
    groups = build_groups(
        layout,
        env.device.type,
        env.timeout_s,
        high_priority_ep=plan.gradients_yield_to_a2a,
        hierarchical_devices_per_node=cfg.hardware.devices_per_node if plan.exchange.route != "direct" else None,
    )
    torch.manual_seed(cfg.train.seed)
    model = MoETransformer(cfg, dropless=not plan.exchange.drops)
    parallelize_model(model, groups)
    model.to(env.device)
    timer = PhaseTimer(env.device)
    policy = make_policy(cfg, plan, groups, timer)
    policy.attach(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    relayout = make_relayout(plan, cfg, env, groups, len(model.moe_layers()), element_bytes)
    data = MarkovTokens(cfg.model.vocab_size, cfg.train.data_branching, cfg.train.data_zipf, cfg.train.seed)
    autocast = torch.autocast(env.device.type, dtype=torch.bfloat16) if cfg.train.dtype == "bfloat16" else nullcontext()

    return Training(groups, model, timer, policy, optimizer, relayout, data, autocast)


def train(
    cfg, env: Env, profile_dir: str | None = None, profile_steps: int = 0
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Run warm-up + timed steps; return worst-rank per-iteration samples and single-value metrics.

    With ``profile_dir``, ``profile_steps`` more steps (and the profiler's warm-up step) follow the
    timed ones under torch.profiler; they are not in the samples.

    A plan with a re-layout hook starts on the configured layout and re-decides it during the run
    (its driver, moe_core.schedule.executor.make_relayout). Decisions and exchanges run between two steps,
    before the barrier that opens the next step's timed window, so no timed sample contains them
    (every iteration keeps its sample); the exchanges' time is recorded as ``exchange_ms``. A
    re-layout moves experts, never the math: the losses are the configured layout's (up to float
    reordering).
    """
    run = set_up(cfg, env)
    policy = run.policy  # a re-layout may replace it between steps
    local: dict[str, list[float]] = defaultdict(list)
    losses = []
    timed_end = cfg.train.warmup_iters + cfg.train.iters
    extra = PROFILER_WARMUP_STEPS + profile_steps if profile_dir else 0
    profiler = step_profiler(profile_dir, timed_end, profile_steps, env.device.type == "cuda")
    profiled_step_ms = []
    with profiler:
        for it in tqdm(
            range(timed_end + extra),
            desc=f"train_step {cfg.comm.policy}",
            disable=env.rank != 0,
            file=sys.stderr,
            mininterval=1.0,
        ):
            policy = run.relayout.before_step(it, run.model, run.optimizer, policy)
            batch = run.data.batch(cfg.train.batch_size, cfg.model.seq_len, it, run.groups.data_rank)
            x, y = (t.to(env.device) for t in batch)
            with record_function(TIMED_STEP):  # what a profile summarises (moe_core.runtime.profiling)
                nll = timed_step(run.model, x, y, policy, run.optimizer, run.timer, run.autocast)

            # Outside the timed window: global mean loss and routing statistics.
            nll = nll.detach().clone()
            dist.all_reduce(nll)  # the "tp" ranks of a replica hold the same loss
            metrics = step_metrics(run.timer.elapsed_ms(), run.timer.counters)
            run.relayout.after_step(metrics)
            if it >= timed_end:  # a profiled step: traced, never a sample
                profiled_step_ms.append(metrics["step_ms"])
                profiler.step()
                continue
            losses.append(nll.item() / env.world_size)
            if it >= cfg.train.warmup_iters:
                keep_sample(local, metrics, run.model)
            if profile_dir:
                profiler.step()
    if profile_dir:
        traced_ms = profiled_step_ms[PROFILER_WARMUP_STEPS:]
        summary = write_profile(profiler, profile_dir, env.rank, profile_steps, traced_ms)
        if env.rank == 0:
            print(f"profile: {json.dumps(summary['per_step'])}", file=sys.stderr)
    return summarise(cfg, run.groups.layout.data_replicas, local, losses, run.relayout.metrics())


def keep_sample(local: dict[str, list[float]], metrics: dict[str, float], model: MoETransformer) -> None:
    """A timed step's sample: its metrics, and the share of routed tokens its MoE layers dropped."""
    for name, value in metrics.items():
        local[name].append(value)
    gating = [layer.last_gating for layer in model.moe_layers()]
    local["dropped_fraction"].append(sum(float(g.dropped_fraction) for g in gating) / max(1, len(gating)))


def timed_step(model, x, y, policy, optimizer, timer: PhaseTimer, autocast):
    """One timed training step (barrier, forward, backward, the policy's gradient sync, optimizer),
    its phases in ``timer`` (``step``, ``allreduce_exposed``); returns the step's loss term."""
    dist.barrier()
    timer.reset()
    start = timer.stamp()
    with autocast:
        loss, nll = model(x, y)
    loss.backward()
    backward_end = timer.stamp()
    policy.finish_gradient_sync()
    sync_end = timer.stamp()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    timer.add("step", start, timer.stamp())
    timer.add("allreduce_exposed", backward_end, sync_end)
    return nll


def summarise(
    cfg, data_replicas: int, local: dict[str, list[float]], losses: list[float], relayout_metrics: dict[str, float]
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """The record's samples (worst rank per timed iteration, all ranks take part) and single-value
    metrics from this rank's per-iteration ``local`` metrics and the global ``losses``."""
    samples = gather_worst_rank(local)
    samples["loss"] = losses[cfg.train.warmup_iters :]
    # of the worst rank's times, iteration by iteration
    shares = [a2a_shares(*t) for t in zip(samples["a2a_ms"], samples["moe_layer_ms"], samples["step_ms"])]
    samples.update({name: [s[name] for s in shares] for name in ("a2a_share", "a2a_share_of_moe")})
    a2a_bytes = samples.pop("a2a_bytes")
    tokens_per_step = cfg.train.batch_size * cfg.model.seq_len * data_replicas
    step_median = sorted(samples["step_ms"])[len(samples["step_ms"]) // 2]
    single_metrics = {
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "a2a_bytes": max(a2a_bytes),
        "tokens_per_s": tokens_per_step / (step_median / 1e3),
        **relayout_metrics,
    }
    return samples, single_metrics


def run(args: argparse.Namespace, world_size_key: str) -> int:
    """One measured point on every rank for ``args`` (experiments.train_step's command line): exit
    code 2 for a bad config, before any process group is created."""
    try:
        cfg = load_config(args.config, args.overrides)
        validate_measured(cfg)  # the simulator's settings this executor has no mechanism for
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    env = init_distributed(cfg, world_size_key=world_size_key)
    try:
        with naming_failed_ranks(env):
            samples, single_metrics = train(cfg, env, args.profile, args.profile_steps)
        if env.rank == 0:
            params = point_params(cfg)
            point = point_name(params)
            record = measured_record(
                cfg,
                paper=cfg.paper,
                experiment=cfg.experiment,
                point=point,
                params=params,
                samples=samples,
                extra_metrics=single_metrics,
            )
            with exit_if_unwritable():
                (path,) = write_records([record], cfg.results_dir, [args.out] if args.out else None)
            print(
                f"wrote {path}: step {record['metrics']['step_ms']['median']:.2f} ms median, "
                f"a2a share {record['metrics']['a2a_share']['median']:.1%}",
                file=sys.stderr,
            )
        leave_together(env)
    finally:
        shutdown()
    return 0
