"""Pipeline parallelism as a composition of simulated stages: the 1F1B schedule (Narayanan et al., SC'21).

``parallel.pipeline_parallel`` = pp stages of n_layers / pp blocks each (``parallel.pipeline_split``:
or Megatron's split counting the embedding and the loss as blocks); stage s runs on ranks
[s W/pp, (s+1) W/pp) (Megatron's default rank order puts pipeline parallelism outermost), the first
stage holds the embedding, the last the final norm, LM head and loss. Inside a stage the ranks are
laid out as a whole run's are (expert, tensor and data parallelism over its W/pp ranks).

DESIGN: a stage's forward and backward of one micro-batch (``train.micro_batches`` split the per-rank
batch) is simulated by :class:`~moe_core.sim.step.StepModel` itself, on a config of the stage (its
ranks, its blocks, the micro-batch as its batch, the embedding and head where it holds them): every
op, collective and overlap of a whole step, priced the same way. The stages are then composed by the
schedule's closed form, as Narayanan et al. analyse it, not by a timeline of the stages:

* plain 1F1B: (m + pp - 1) slots of the slowest stage's forward and backward of one micro-batch
  t_fb, each with its point-to-point transfers (the activations to the next stage and their
  gradients back); the pp - 1 extra slots are the bubble, (pp - 1) / m of the ideal time.
* interleaved 1F1B (``parallel.virtual_pipeline`` = v model chunks per stage): the bubble shrinks to
  (pp - 1) / v slots, and each micro-batch crosses v times as many stage boundaries (one of them from
  the last stage back to the first).
* then, once, the gradient synchronisation's exposed part and the optimizer, as the stage's step
  simulation has them after its backward pass (the last micro-batch's backward is what its units
  overlap, as in the simulated step); the slowest stage's tail ends the step.

A boundary's transfer: every rank of the stage sends its micro-batch's activations (micro-batch
tokens x d_model x element bytes; Megatron's scatter-gather of 1/tp is not modelled) to the rank in
the same position of the next stage, all at once, priced as point-to-point transfers on the real
ranks (moe_core.sim.collectives.PointToPoint) and sharing links in the flow model.

Every stage is simulated on the ranks of the first one: the stages' placements must be alike
(the same spread over nodes, the same device speeds), which is checked. Stages run alone in the
simulation, so traffic of two stages sharing a link is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from omegaconf import DictConfig

from moe_core.model.capacity import DTYPE_BYTES
from moe_core.schema.derive import derive_config
from moe_core.schema.sections import ConfigError
from moe_core.schema.validation import pipeline_chunk_blocks
from moe_core.sim.collectives import PointToPoint, simulate_on
from moe_core.sim.engine import Op
from moe_core.sim.step import StepModel
from moe_core.sim.timeline import StepSimulation


def pipeline_time_s(
    stage_forward_backward_s: float, microbatches: int, pp: int, p2p_s: float, virtual: int = 1
) -> float:
    """Time of one iteration of the 1F1B schedule (Narayanan et al.): (microbatches + (pp - 1) / virtual)
    slots of a stage's forward and backward of one micro-batch plus ``virtual`` times its point-to-point
    transfers ``p2p_s``; the (pp - 1) / virtual extra slots are the bubble, a fraction
    (pp - 1) / (virtual x microbatches) of the ideal time. ``virtual`` = 1 is plain 1F1B."""
    if microbatches < 1 or pp < 1 or virtual < 1:
        raise ValueError(
            f"need microbatches, pp and virtual >= 1, got microbatches={microbatches}, pp={pp}, virtual={virtual}"
        )
    return (microbatches + (pp - 1) / virtual) * (stage_forward_backward_s + virtual * p2p_s)


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: its global ranks, its blocks (of all its model chunks) and whether it holds
    the embedding and the head."""

    index: int
    ranks: np.ndarray
    blocks: int
    embedding: bool
    head: bool


def pipeline_stages(cfg: DictConfig) -> list[Stage]:
    """The pp stages of ``cfg``: stage s on ranks [s W/pp, (s+1) W/pp) with model chunks s, s + pp, ...
    (moe_core.schema.validation.pipeline_chunk_blocks), the embedding on the first, the head and loss on the last."""
    pp = cfg.parallel.pipeline_parallel
    per_stage, chunk_blocks = cfg.parallel.world_size // pp, pipeline_chunk_blocks(cfg)
    return [
        Stage(s, np.arange(s * per_stage, (s + 1) * per_stage), sum(chunk_blocks[s::pp]), s == 0, s == pp - 1)
        for s in range(pp)
    ]


def stage_config(cfg: DictConfig, stage: Stage) -> DictConfig:
    """The config of ``stage``'s forward and backward of one micro-batch: its ranks, its blocks, the
    micro-batch as its batch, no pipeline."""
    par, tr = cfg.parallel, cfg.train
    return derive_config(
        cfg,
        [
            f"parallel.world_size={par.world_size // par.pipeline_parallel}",
            "parallel.pipeline_parallel=1",
            "parallel.virtual_pipeline=1",
            "parallel.pipeline_split=blocks",
            f"model.n_layers={stage.blocks}",
            f"train.recompute_layers={min(tr.recompute_layers, stage.blocks)}",  # the first blocks of each stage
            f"train.batch_size={tr.batch_size // tr.micro_batches}",
            "train.micro_batches=1",
        ],
    )


def activation_bytes(cfg: DictConfig) -> float:
    """What one rank sends across a stage boundary per micro-batch and direction: the micro-batch's
    activations (forward) or their gradients (backward), tokens x d_model elements."""
    tokens = cfg.train.batch_size // cfg.train.micro_batches * cfg.model.seq_len
    return tokens * cfg.model.d_model * DTYPE_BYTES[cfg.train.dtype]


def boundary_seconds(cfg: DictConfig, topo, sender: Stage, receiver: Stage) -> float:
    """Every rank of ``sender`` sending :func:`activation_bytes` to the rank in its position of
    ``receiver``, all at once: the time until the last transfer has arrived."""
    links, nbytes = PointToPoint(cfg.hardware, topo), activation_bytes(cfg)
    pairs = zip(sender.ranks.tolist(), receiver.ranks.tolist())
    ops = [Op(f"p2p{src}>{dst}", "p2p", **links.op(src, dst, nbytes)) for src, dst in pairs]
    return simulate_on(cfg.hardware, topo, ops).makespan_s


def _check_alike(stages: list[Stage], topo) -> None:
    """Every stage is placed as the first: the same spread of its ranks over nodes, the same device speeds."""

    def spread(ranks: np.ndarray) -> np.ndarray:
        return topo.node_of[ranks] - topo.node_of[ranks[0]]

    first = stages[0].ranks
    for stage in stages[1:]:
        same_nodes = np.array_equal(spread(stage.ranks), spread(first))
        if not (same_nodes and np.array_equal(topo.device_tflops[stage.ranks], topo.device_tflops[first])):
            raise ConfigError(
                f"config key 'parallel.pipeline_parallel': stage {stage.index} (ranks {stage.ranks[0]}.."
                f"{stage.ranks[-1]}) is placed unlike stage 0 on '{topo.name}' (its spread over nodes or its device "
                "speeds differ), and every stage is simulated on stage 0's placement; choose a pipeline_parallel "
                "whose stages fill nodes alike, on devices of one kind"
            )


class PipelineModel:
    """The step of a pipelined ``cfg`` on ``topo``: its stages simulated, composed by 1F1B."""

    def __init__(self, cfg: DictConfig, topo):
        if cfg.parallel.world_size > topo.n:
            raise ValueError(f"world_size {cfg.parallel.world_size} exceeds the {topo.n} devices of '{topo.name}'")
        self.cfg, self.topo = cfg, topo
        self.stages = pipeline_stages(cfg)
        _check_alike(self.stages, topo)

    def stage_simulations(self) -> list[StepSimulation]:
        """Each stage's simulated forward and backward of one micro-batch, then its gradient sync and
        optimizer step; stages holding the same parts share one simulation."""
        simulated: dict[tuple[int, bool, bool], StepSimulation] = {}
        for stage in self.stages:
            parts = (stage.blocks, stage.embedding, stage.head)
            if parts not in simulated:
                stage_cfg, passes = stage_config(self.cfg, stage), self.cfg.train.micro_batches
                simulated[parts] = StepModel(stage_cfg, self.topo, *parts[1:], step_passes=passes).run()
        return [simulated[stage.blocks, stage.embedding, stage.head] for stage in self.stages]

    def p2p_seconds(self) -> float:
        """A micro-batch's transfers across the slowest stage boundary: activations forward plus
        their gradients back. Interleaved, the last stage also feeds the first (the next chunk)."""
        stages, v = self.stages, self.cfg.parallel.virtual_pipeline
        pairs = list(zip(stages, stages[1:])) + ([(stages[-1], stages[0])] if v > 1 else [])
        return max(
            boundary_seconds(self.cfg, self.topo, a, b) + boundary_seconds(self.cfg, self.topo, b, a) for a, b in pairs
        )

    def metrics(self) -> dict[str, float]:
        """The composed step, in ms: ``step_ms``; ``bubble_ms`` (the schedule's idle slots,
        (pp - 1) / v x t_fb), ``p2p_ms`` (every slot's stage-boundary transfers), ``exposed_comm_ms``
        (the slowest stage's exposed collectives of every micro-batch, the transfers, and the gradient
        sync's exposed part), ``allreduce_exposed_ms`` and ``optimizer_ms`` of the stage with the
        longest tail; ``stage_fwd_bwd_ms`` (t_fb) and ``p2p_micro_batch_ms``; and ``stage_max_<metric>``,
        the largest over the stages of every metric of their simulated steps (one micro-batch each)."""
        m, pp, v = self.cfg.train.micro_batches, self.cfg.parallel.pipeline_parallel, self.cfg.parallel.virtual_pipeline
        sims = self.stage_simulations()
        fwd_bwd = [float(sim.timeline.end_s[sim.backward_end]) for sim in sims]
        tails = [sim.timeline.makespan_s - fb for sim, fb in zip(sims, fwd_bwd)]
        slowest, last = int(np.argmax(fwd_bwd)), int(np.argmax(tails))
        t_fb, p2p = fwd_bwd[slowest], self.p2p_seconds()
        pipeline_s = pipeline_time_s(t_fb, m, pp, p2p, v)
        step_s = pipeline_s + tails[last]
        bubble_s = (pp - 1) / v * t_fb
        p2p_total_s = (m + (pp - 1) / v) * v * p2p
        stage_metrics = [sim.metrics() for sim in sims]
        tail = stage_metrics[last]
        # collectives inside a micro-batch's forward and backward (all-to-alls, tensor-parallel ones)
        in_micro_batch_ms = sims[slowest].waiting_ms(lambda op: op.transfer is not None and op.phase != "allreduce")
        exposed_ms = float(m * in_micro_batch_ms + p2p_total_s * 1e3 + tail["allreduce_exposed_ms"])
        step_ms = step_s * 1e3
        return {
            "step_ms": step_ms,
            "bubble_ms": bubble_s * 1e3,
            "bubble_share": bubble_s * 1e3 / step_ms,
            "p2p_ms": p2p_total_s * 1e3,
            "exposed_comm_ms": exposed_ms,
            "exposed_comm_share": exposed_ms / step_ms,
            "allreduce_exposed_ms": tail["allreduce_exposed_ms"],
            "optimizer_ms": tail["optimizer_ms"],
            "stage_fwd_bwd_ms": t_fb * 1e3,
            "p2p_micro_batch_ms": p2p * 1e3,
            **{f"stage_max_{key}": max(s[key] for s in stage_metrics) for key in stage_metrics[0]},
        }


def simulate_step(cfg: DictConfig, topo) -> dict[str, float]:
    """The simulated training step's metrics: StepModel's when ``cfg`` has one pipeline stage, the
    1F1B composition of its stages (:class:`PipelineModel`) when it has more."""
    if cfg.parallel.pipeline_parallel == 1:
        return StepModel(cfg, topo).run().metrics()
    return PipelineModel(cfg, topo).metrics()
