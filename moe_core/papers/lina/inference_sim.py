"""Lina's inference at the paper's scale, simulated: every policy's placements on synthetic routing
(routing.py), each batch priced by the simulator's forward pass (moe_core.sim.forward).

The decisions are the measured executor's: one :class:`Scheduler` per policy (inference.py), the
same phase-1/phase-2 functions and the same dealing of tokens to replicas (placement.py). A device
holds ``tokens_per_device`` tokens of the batch; the estimate the measured ranks all-gather is the
sum of their local estimates, which is the estimate over all the batch's tokens, so one scheduler
sees the whole batch. The ``ideal`` policy's gate is forced to perfect balance, as measured. What
depends on the batch alone (the rows per source and expert, the path estimate) is the same for
every policy: :class:`GatedBatch` computes it once per batch.
"""

from __future__ import annotations

from collections import defaultdict
from functools import cached_property

import numpy as np

from moe_core.papers.lina.inference import Scheduler
from moe_core.papers.lina.placement import PathProfile, expected_tokens, load_imbalance, replica_token_counts
from moe_core.papers.lina.routing import SyntheticRouting
from moe_core.sim.forward import ForwardModel


def source_counts(choices: np.ndarray, devices: int, num_experts: int) -> np.ndarray:
    """(S, E) rows each source device sends to each expert; device s holds the s-th equal slice of tokens."""
    per_device = choices.reshape(devices, -1)
    return np.stack([np.bincount(row, minlength=num_experts) for row in per_device])


def balanced_counts(tokens_per_device: int, devices: int, num_experts: int) -> np.ndarray:
    """(S, E) rows of Lina's Ideal: every source sends every expert the same share (the remainder dealt
    to the lowest experts)."""
    base, extra = divmod(tokens_per_device, num_experts)
    return np.tile(base + (np.arange(num_experts) < extra), (devices, 1))


class GatedBatch:
    """One batch's top-1 choices (layers, tokens) on ``devices`` devices, and what every policy derives
    from them alike, each computed once however many schedulers place the batch (at the paper's
    scale each is a pass over millions of tokens): per MoE layer the rows each source sends each
    expert and the estimate from the tokens' paths, and the balanced gate's rows."""

    def __init__(self, choices: np.ndarray, devices: int, profile: PathProfile):
        self.choices, self.devices, self.profile = choices, devices, profile
        self._estimates: dict[tuple[int, int | None], np.ndarray] = {}

    @cached_property
    def counts(self) -> list[np.ndarray]:
        """Per MoE layer, the (S, E) rows each source sends each expert."""
        return [source_counts(ids, self.devices, self.profile.num_experts) for ids in self.choices]

    @cached_property
    def balanced(self) -> tuple[np.ndarray, np.ndarray]:
        """The balanced gate's (S, E) rows and every row's expert, the same in every layer."""
        num_experts = self.profile.num_experts
        counts = balanced_counts(self.choices.shape[1] // self.devices, self.devices, num_experts)
        return counts, np.repeat(np.arange(num_experts), counts.sum(axis=0))

    def estimate(self, layer: int, keep: int | None) -> np.ndarray:
        """(E,) expected tokens per expert of ``layer`` from the paths of all the batch's tokens: what
        ``Scheduler.local_estimate`` gives a scheduler that has placed the layers before."""
        if (layer, keep) not in self._estimates:
            prior = self.choices[max(0, layer - self.profile.path_length) : layer]
            self._estimates[layer, keep] = expected_tokens(self.profile, layer, prior, keep)
        return self._estimates[layer, keep]


def placed_batch(scheduler: Scheduler, batch: GatedBatch) -> tuple[list[np.ndarray], float]:
    """One batch under ``scheduler`` (of the batch's profile): per MoE layer the (S, D, E) rows of its
    exchange, and the mean over layers of the largest device's rows over the mean device's."""
    scheduler.begin_batch()
    routed, imbalance = [], []
    for layer, ids in enumerate(batch.choices):
        if scheduler.balanced_gate:
            counts, ids = batch.balanced
        else:
            counts = batch.counts[layer]
        if scheduler.estimates:
            estimate = batch.estimate(layer, scheduler.keep)
        else:
            estimate = scheduler.local_estimate(layer, len(ids))
        placement = scheduler.decide(layer, ids, estimate, counts.sum(axis=0))
        routed.append(replica_token_counts(counts, placement))
        imbalance.append(load_imbalance(routed[-1]))
    return routed, float(np.mean(imbalance))


def same_exchanges(routed: list[np.ndarray], other: list[np.ndarray]) -> bool:
    """Whether two passes exchange the same (S, D, E) rows in every MoE layer."""
    return all(np.array_equal(rows, other_rows) for rows, other_rows in zip(routed, other, strict=True))


def simulate_policies(
    models: list[ForwardModel],
    routing: SyntheticRouting,
    profile: PathProfile,
    policies: list[str],
    batches: int,
    first_batch: int,
    keep: int,
) -> tuple[list[dict[str, dict[str, list[float]]]], dict[str, Scheduler]]:
    """Per model, per policy, the per-batch metrics of ``batches`` batches (``ForwardSimulation.metrics``
    plus ``load_imbalance``), and the schedulers (their decision statistics). Every policy sees the
    same batches, numbered from ``first_batch`` (after the profiled ones). The models differ only in
    what prices a pass (the hardware, say): their devices and tokens per device are the same, so
    are the batches and decisions, and every model prices each policy's placements. A pass is a
    function of its exchanges' rows: a policy whose rows repeat its previous batch's (``ideal``'s
    balanced gate on its fixed placement, every batch) reuses that batch's metrics."""
    devices = models[0].layout.world_size
    per_device = {(m.layout.world_size, m.cfg.train.batch_size * m.cfg.model.seq_len) for m in models}
    if len(per_device) != 1:
        raise ValueError(f"the models must share their devices and tokens per device, got {sorted(per_device)}")
    tokens = devices * per_device.pop()[1]
    schedulers = {p: Scheduler(p, profile, devices, top_k=1, keep=keep) for p in policies}
    samples: list[dict[str, dict[str, list[float]]]] = [{p: defaultdict(list) for p in policies} for _ in models]
    previous: dict[str, tuple[list[np.ndarray], list[dict[str, float]]]] = {}  # policy -> last rows, their metrics
    for b in range(batches):
        batch = GatedBatch(routing.batch(tokens, first_batch + b), devices, profile)
        for policy, scheduler in schedulers.items():
            routed, imbalance = placed_batch(scheduler, batch)
            last_routed, metrics = previous.get(policy, (None, None))
            if last_routed is None or not same_exchanges(routed, last_routed):
                metrics = [model.run(routed).metrics() for model in models]
            previous[policy] = routed, metrics
            for model_metrics, model_samples in zip(metrics, samples):
                for name, value in model_metrics.items():
                    model_samples[policy][name].append(value)
                model_samples[policy]["load_imbalance"].append(imbalance)
    return [{p: dict(s) for p, s in model_samples.items()} for model_samples in samples], schedulers
