"""Measured MoE training steps: one sweep point, run under torchrun.

    torchrun --standalone --nproc-per-node=4 -m experiments.train_step \\
        --config configs/default.yaml moe.num_experts=8 comm.policy=overlap

Each iteration: barrier, forward, backward, gradient synchronisation (the policy), optimizer step;
Lina's packing policies (``lina``, ``lina-pack``) re-decide their expert layout between steps
(ExpertPacking) and move the experts when it changes. Phases are timed per rank
(moe_core.timing); per iteration the worst rank is kept; the record holds median and p95 over the
timed iterations. Rank 0 writes the record atomically once every rank has finished, then mirrors it
to W&B. A bad config exits with code 2 before any process group is created; a failing or hung rank
makes every rank exit non-zero within ``parallel.timeout_s``.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from contextlib import nullcontext

import torch
import torch.distributed as dist
from tqdm import tqdm

from moe_core.config import (ConfigError, config_arg_parser, layout_of, load_config, point_name, point_params,
                             to_container)
from moe_core.data import MarkovTokens
from moe_core.distributed import Env, init_distributed, naming_failed_ranks, shutdown
from moe_core.lina import (LINA_POLICIES, layer_a2a_micro_ops, max_packing_factor, packed_layout, packing_due,
                           packing_factor)
from moe_core.model import MoETransformer
from moe_core.packing import repack
from moe_core.parallel import ParallelGroups, build_groups, shard_experts
from moe_core.policies import CommPolicy, make_policy
from moe_core.results import make_record, record_path, write_record
from moe_core.timing import PhaseTimer, gather_worst_rank
from moe_core.tracking import log_point

PHASES = ("gate", "dispatch_a2a", "expert", "combine_a2a")


def step_metrics(phases_ms: dict[str, float], counters: dict[str, float]) -> dict[str, float]:
    """One rank's metrics of one step from its timer's phase totals (``name.fwd``/``name.bwd``)."""
    ms = {p: phases_ms.get(f"{p}.fwd", 0.0) + phases_ms.get(f"{p}.bwd", 0.0) for p in PHASES}
    a2a = ms["dispatch_a2a"] + ms["combine_a2a"]
    moe = ms["gate"] + a2a + ms["expert"]
    step, exposed = phases_ms["step"], phases_ms["allreduce_exposed"]
    return {
        "step_ms": step,
        **{f"{p}_ms": v for p, v in ms.items()},
        "a2a_ms": a2a,
        "a2a_fwd_ms": phases_ms.get("dispatch_a2a.fwd", 0.0) + phases_ms.get("combine_a2a.fwd", 0.0),
        "a2a_bwd_ms": phases_ms.get("dispatch_a2a.bwd", 0.0) + phases_ms.get("combine_a2a.bwd", 0.0),
        "moe_layer_ms": moe,
        "allreduce_exposed_ms": exposed,
        "dense_ms": step - moe - exposed,  # attention, embeddings, dense FFNs, loss, optimizer
        "a2a_bytes": counters.get("dispatch_a2a.bytes", 0.0) + counters.get("combine_a2a.bytes", 0.0),
    }


class ExpertPacking:
    """Lina's expert packing inside a training run (Li et al. §4; decision: moe_core.lina).

    The run starts on the configured layout. After the warm-up steps, then every
    ``comm.packing_interval_iters`` steps (lina.packing_due), the packing factor (experts per rank
    relative to the configured layout) is decided by lina.packing_factor from this run's own times:

    * FFN time of a micro-op: the median expert phase of the steps since the last decision, per MoE
      layer, pass (backward = 2 forwards) and all-to-all micro-op (lina.layer_a2a_micro_ops). A rank
      computes the rows it sends whatever the packing, so the current layout's time stands for
      every candidate factor.
    * All-to-all time of a micro-op at factor k: one micro-op's buffer exchanged by a real
      all_to_all_single on the expert-parallel groups of the layout with k times the experts per
      rank (median of 5, after one untimed exchange).

    Both are the worst rank's (all_reduce MAX), so every rank takes the same decision. A changed
    factor moves the experts and their optimizer state to the new layout (moe_core.packing.repack).
    Each layout's process groups are built once and kept, since creating a group is collective and
    costly: the candidates measured are the layouts a repack then trains on.
    """

    def __init__(self, cfg, env: Env, groups: ParallelGroups, moe_layers: int, high_priority_ep: bool):
        self.env, self.high_priority_ep = env, high_priority_ep
        self.warmup_iters, self.interval_iters = cfg.train.warmup_iters, cfg.comm.packing_interval_iters
        self.base = groups.layout
        self.groups = {1: groups}  # packing factor -> its layout's process groups
        self.factor, self.repacks, self.exchange_ms = 1, 0, 0.0
        self.expert_ms: list[float] = []  # this rank's expert phase per step since the last decision
        dtype = torch.bfloat16 if cfg.train.dtype == "bfloat16" else torch.float32
        chunks = layer_a2a_micro_ops(cfg, dtype.itemsize)
        self.micro_ops = len(chunks) * moe_layers * 3  # per step: forward + backward (2 forwards)
        a, b = chunks[0]
        self.micro_op = torch.zeros(cfg.moe.num_experts * (b - a) * cfg.model.d_model, device=env.device,
                                    dtype=dtype)  # (E * rows, M) flattened: one micro-op's send buffer

    def groups_at(self, factor: int) -> ParallelGroups:
        """The process groups of the layout with ``factor`` times the configured experts per rank."""
        if factor not in self.groups:
            self.groups[factor] = build_groups(packed_layout(self.base, factor), self.env.device.type,
                                               self.env.timeout_s, high_priority_ep=self.high_priority_ep)
        return self.groups[factor]

    def before_step(self, iteration: int, model, optimizer, policy: CommPolicy) -> CommPolicy:
        """Before step ``iteration``: re-decide the factor when due and repack on a change; return the
        policy to train with. Collective: every rank calls it before every step."""
        if not packing_due(iteration, self.warmup_iters, self.interval_iters):
            return policy
        ffn_ms = self._worst_rank(statistics.median(self.expert_ms)) / self.micro_ops
        self.expert_ms = []
        factor = packing_factor(lambda k: ffn_ms, self._a2a_ms, max_packing_factor(self.base.expert_parallel))
        if factor == self.factor:
            return policy
        groups = self.groups_at(factor)
        clock = PhaseTimer(self.env.device)
        with clock.region("exchange"):
            policy = repack(model, optimizer, policy, groups)
        self.exchange_ms += clock.elapsed_ms()["exchange"]
        self.factor, self.repacks = factor, self.repacks + 1
        return policy

    def _a2a_ms(self, factor: int) -> float:
        """The worst rank's time of one micro-op's all-to-all on the layout packed by ``factor``."""
        group = self.groups_at(factor).ep_group
        clock, received = PhaseTimer(self.env.device), torch.empty_like(self.micro_op)
        times = []
        for _ in range(6):
            dist.barrier(group)
            clock.reset()
            with clock.region("a2a"):
                dist.all_to_all_single(received, self.micro_op, group=group)
            times.append(clock.elapsed_ms()["a2a"])
        return self._worst_rank(statistics.median(times[1:]))

    def _worst_rank(self, value: float) -> float:
        """The maximum of ``value`` over all ranks (collective)."""
        worst = torch.tensor(value, dtype=torch.float64, device=self.env.device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        return float(worst)

    def metrics(self) -> dict[str, float]:
        """The record's packing metrics: final factor, number of repacks, the worst rank's total
        exchange time (collective)."""
        return {"packing_factor": self.factor, "repacks": self.repacks,
                "exchange_ms": self._worst_rank(self.exchange_ms)}


def train(cfg, env: Env) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Run warm-up + timed steps; return worst-rank per-iteration samples and single-value metrics.

    A packing Lina policy starts on the configured layout and re-decides its packing factor during
    the run (ExpertPacking). Decisions and exchanges run between two steps, before the barrier
    that opens the next step's timed window, so no timed sample contains them (every iteration
    keeps its sample); the exchanges' time is recorded as ``exchange_ms``. Packing moves experts,
    never the math: the losses are the unpacked layout's (up to float reordering).
    """
    lina = LINA_POLICIES.get(cfg.comm.policy)
    high_priority_ep = bool(lina and lina.priority)  # Lina's all-to-alls on high-priority NCCL streams
    groups = build_groups(layout_of(cfg), env.device.type, env.timeout_s, high_priority_ep=high_priority_ep)
    torch.manual_seed(cfg.train.seed)
    model = MoETransformer(cfg)
    shard_experts(model, groups)
    model.to(env.device)
    timer = PhaseTimer(env.device)
    policy = make_policy(cfg.comm.policy, groups, timer, int(cfg.comm.bucket_mb * 2**20),
                         int(cfg.comm.partition_mb * 2**20))
    policy.attach(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    packing = (ExpertPacking(cfg, env, groups, len(model.moe_layers()), high_priority_ep)
               if lina and lina.pack else None)
    data = MarkovTokens(cfg.model.vocab_size, cfg.train.data_branching, cfg.train.data_zipf, cfg.train.seed)
    autocast = (torch.autocast(env.device.type, dtype=torch.bfloat16) if cfg.train.dtype == "bfloat16"
                else nullcontext())

    local: dict[str, list[float]] = defaultdict(list)
    losses = []
    total = cfg.train.warmup_iters + cfg.train.iters
    for it in tqdm(range(total), desc=f"train_step {cfg.comm.policy}", disable=env.rank != 0,
                   file=sys.stderr, mininterval=1.0):
        if packing:
            policy = packing.before_step(it, model, optimizer, policy)
        x, y = (t.to(env.device) for t in data.batch(cfg.train.batch_size, cfg.model.seq_len, it, env.rank))
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

        # Outside the timed window: global mean loss and routing statistics.
        nll = nll.detach().clone()
        dist.all_reduce(nll)
        losses.append(nll.item() / env.world_size)
        metrics = step_metrics(timer.elapsed_ms(), timer.counters)
        if packing:
            packing.expert_ms.append(metrics["expert_ms"])
        if it >= cfg.train.warmup_iters:
            for name, value in metrics.items():
                local[name].append(value)
            gating = [layer.last_gating for layer in model.moe_layers()]
            local["dropped_fraction"].append(sum(float(g.dropped_fraction) for g in gating) / len(gating))
    samples = gather_worst_rank(local)
    samples["loss"] = losses[cfg.train.warmup_iters:]
    samples["a2a_share"] = [a / s for a, s in zip(samples["a2a_ms"], samples["step_ms"])]
    samples["a2a_share_of_moe"] = [a / m if m else 0.0 for a, m in zip(samples["a2a_ms"], samples["moe_layer_ms"])]
    a2a_bytes = samples.pop("a2a_bytes")
    tokens_per_step = cfg.train.batch_size * cfg.model.seq_len * env.world_size
    step_median = sorted(samples["step_ms"])[len(samples["step_ms"]) // 2]
    extra = {"loss_first": losses[0], "loss_last": losses[-1], "a2a_bytes": max(a2a_bytes),
             "tokens_per_s": tokens_per_step / (step_median / 1e3),
             **(packing.metrics() if packing else {"packing_factor": 1, "repacks": 0, "exchange_ms": 0.0})}
    return samples, extra


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__)
    parser.add_argument("--out", help="record path (default: results/raw/<paper>/<experiment>/<point>.json)")
    args = parser.parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    env = init_distributed(cfg)
    try:
        with naming_failed_ranks(env):
            samples, extra = train(cfg, env)
        if env.rank == 0:
            params = point_params(cfg)
            point = point_name(params)
            record = make_record(paper=cfg.paper, experiment=cfg.experiment, point=point, mode="measured",
                                 backend=env.backend, hardware=cfg.hardware.name, params=params, samples=samples,
                                 config=to_container(cfg), extra_metrics=extra, device=env.device.type)
            path = write_record(record, args.out or record_path(cfg.results_dir, cfg.paper, cfg.experiment, point))
            print(f"wrote {path}: step {record['metrics']['step_ms']['median']:.2f} ms median, "
                  f"a2a share {record['metrics']['a2a_share']['median']:.1%}", file=sys.stderr)
            log_point(record, sweep=cfg.sweep.name, mode=cfg.wandb.mode, project=cfg.wandb.project,
                      entity=cfg.wandb.entity, results_dir=cfg.results_dir,
                      step_columns={k: samples[k] for k in ("step_ms", "a2a_ms", "allreduce_exposed_ms", "loss")})
    finally:
        shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
