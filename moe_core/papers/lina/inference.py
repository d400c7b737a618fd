"""Expert-parallel MoE inference under a per-layer expert placement (Lina's dynamic resource scheduling).

:func:`attach` swaps every MoE layer of a trained MoETransformer for a :class:`PlacedMoE`, which
reuses the layer's gate and experts and runs, per layer and batch:

1. gate: GShard gating without capacity (top-1 in Lina's inference), tokens' rows = (token, choice);
2. plan: one all-gather of [estimated tokens per expert, actual tokens per expert] from every rank
   (Lina lets these ride on the first all-to-all), then the policy's placement (``placement.py``,
   the same decision functions a simulator calls), identical on every rank because the inputs are;
3. dispatch: uneven ``all_to_all_single``; a replicated expert's rows are dealt round-robin over its
   replicas, and every rank derives all split sizes from the gathered counts;
4. expert: each rank computes the experts the placement gave it, one after another (as in Lina);
5. combine: the reverse all-to-all, then the gate-weighted sum per token.

Every rank keeps the weights of all experts (a replica is a copy of the same weights): Lina swaps
them in from host DRAM pipelined with compute; on CPU host memory is the device memory, so that
swap costs nothing here, and on GPU this executor does not model it. Placement never changes the
math: the output equals the single-process dropless MoELayer (tests/test_inference.py).

A :class:`Scheduler` holds one policy's state across batches: the token paths of the current batch,
the previous batch's popularity (for the no-estimation ablation) and the decision statistics,
including the host time of every decision (Lina §5.2's per-phase time and phase-2 check).

Every phase of every layer is its own timer region (``layer_region``); :func:`batch_metrics` turns a
batch's timer totals into per-phase, whole-MoE-layer and per-layer all-to-all times.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from moe_core.comm.all_to_all import exchange
from moe_core.comm.transmission import Schedule, make_schedule
from moe_core.host.timing import PhaseTimer
from moe_core.model.gating import gshard_gating
from moe_core.model.layer import MoELayer, _block_transpose_index  # same (source, expert) -> (expert, source) reorder
from moe_core.papers.lina.config import INFERENCE_POLICIES
from moe_core.papers.lina.placement import (
    PathProfile,
    Placement,
    devices_per_expert,
    expected_tokens,
    load_imbalance,
    needs_replan,
    phase1_placement,
    plan_layer,
    replica_token_counts,
    route_rows,
    static_placement,
)
from moe_core.schedule.policies import policy_spec

SCHEDULER_POLICIES = (*INFERENCE_POLICIES, "ideal")
INFERENCE_PHASES = ("gate", "plan", "dispatch_a2a", "expert", "combine_a2a")
A2A_PHASES = ("dispatch_a2a", "combine_a2a")


def layer_region(phase: str, layer: int) -> str:
    """The timer region of ``phase`` in MoE layer ``layer`` (``"dispatch_a2a.layer3"``)."""
    return f"{phase}.layer{layer}"


def batch_metrics(ms: dict[str, float], num_layers: int) -> dict[str, float]:
    """One rank's metrics of one inference batch from its timer's totals (``layer_region`` names).

    ``<phase>_ms`` summed over the MoE layers; ``moe_layer_ms``, all phases of all MoE layers;
    ``a2a_layer<i>_ms``, both all-to-alls of MoE layer i (Lina Fig 18's per-layer all-to-all time).
    """
    out = {f"{p}_ms": sum(ms.get(layer_region(p, i), 0.0) for i in range(num_layers)) for p in INFERENCE_PHASES}
    out["moe_layer_ms"] = sum(out[f"{p}_ms"] for p in INFERENCE_PHASES)
    for i in range(num_layers):
        out[f"a2a_layer{i}_ms"] = sum(ms.get(layer_region(p, i), 0.0) for p in A2A_PHASES)
    return out


class Scheduler:
    """One inference policy's decisions and their statistics over a run.

    * ``static``: the training layout (placement.static_placement).
    * ``lina``: phase 1 from the path estimate, phase 2 re-plans when the top-2k sets differ.
    * ``lina-no-estimation``: phase 1 from the previous batch's actual popularity of the layer
      (the first batch uses the profiled marginal), then phase 2.
    * ``lina-no-finetune``: phase 1 from the path estimate only.
    * ``ideal``: the gate is forced to perfect balance and experts are spread evenly (phase 1 on
      uniform popularity), the reference Lina's Fig 16 normalises to. It changes the math.
    """

    def __init__(self, policy: str, profile: PathProfile, num_devices: int, top_k: int, keep: int | None):
        if policy not in SCHEDULER_POLICIES:
            raise ValueError(f"policy must be one of {SCHEDULER_POLICIES}, got {policy!r}")
        self.policy, self.profile, self.num_devices, self.top_k, self.keep = policy, profile, num_devices, top_k, keep
        E = profile.num_experts
        self.balanced_gate = policy == "ideal"
        self.estimates = policy in ("lina", "lina-no-finetune")  # phase 1 from the tokens' paths
        self.fixed = None  # a placement used for every layer and batch
        if policy == "static":
            self.fixed = static_placement(E, num_devices)
        elif policy == "ideal":
            self.fixed = phase1_placement(devices_per_expert(np.ones(E), num_devices), num_devices)
        self.previous = [profile.marginal(i) for i in range(len(profile.counts))]
        self.paths: list[np.ndarray] = []  # this batch's local top-1 experts of the layers so far
        self.reset_stats()

    def reset_stats(self) -> None:
        self.estimate_right: list[bool] = []  # per (batch, layer) check
        self.replanned: list[bool] = []
        self.checked_layers: list[int] = []
        self.imbalance: list[float] = []  # per (batch, layer): largest device's rows / mean
        self.decide_ms: list[float] = []  # per (batch, layer) decision: plan_layer's host time
        self.check_ms: list[float] = []  # per decision whose estimate was right: the phase-2 check's time

    def begin_batch(self) -> None:
        self.paths = []

    def local_estimate(self, layer: int, tokens: int) -> np.ndarray:
        """(E,) this rank's expected tokens per expert of ``layer`` from its tokens' paths (zeros if unused)."""
        if not self.estimates:
            return np.zeros(self.profile.num_experts)
        recent = self.paths[max(0, layer - self.profile.path_length) :]  # the layers a path holds
        prior = np.stack(recent) if recent else np.zeros((0, tokens), dtype=np.int64)
        return expected_tokens(self.profile, layer, prior, self.keep)

    def decide(self, layer: int, top1: np.ndarray, estimate: np.ndarray, actual: np.ndarray) -> Placement:
        """The placement of ``layer`` from the gathered estimate and actual counts; records the path."""
        self.paths.append(top1)
        if self.fixed is not None:
            return self.fixed
        if self.policy == "lina-no-estimation":
            estimate, self.previous[layer] = self.previous[layer], actual
        start = time.perf_counter()
        placement, replanned = plan_layer(
            estimate, actual, self.num_devices, self.top_k, finetune=self.policy != "lina-no-finetune"
        )
        checked = time.perf_counter()
        right = not needs_replan(estimate, actual, self.top_k)  # phase 2's check (plan_layer ran it too)
        self.decide_ms.append(1e3 * (checked - start))
        if right:
            self.check_ms.append(1e3 * (time.perf_counter() - checked))
        self.estimate_right.append(right)
        self.replanned.append(replanned)
        self.checked_layers.append(layer)
        return placement


class PlacedMoE(nn.Module):
    """An MoE layer for inference whose experts live where ``scheduler`` places them."""

    def __init__(
        self, layer: MoELayer, index: int, top_k: int, timer: PhaseTimer, group=None, a2a_policy: str = "library"
    ):
        super().__init__()
        self.gate, self.experts = layer.gate, layer.experts
        self.index, self.top_k, self.timer, self.group = index, top_k, timer, group
        self.num_experts = layer.num_experts
        self.scheduler: Scheduler | None = None  # set by the caller before each forward
        self.schedule_kind = None if a2a_policy == "library" else policy_spec(a2a_policy).a2a_order
        self.exchanges = 0  # seeds aurora-rcs' random order; equal on all ranks (lockstep calls)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, M) -> ((B, T, M), zero aux loss)."""
        B, T, M = x.shape
        tokens = x.reshape(B * T, M)  # (N, M)
        N, E, k, sched, timer = B * T, self.num_experts, self.top_k, self.scheduler, self.timer
        rank, world = dist.get_rank(self.group), dist.get_world_size(self.group)

        with timer.region(layer_region("gate", self.index)):
            plan = gshard_gating(self.gate(tokens).view(1, N, E), k, capacity=None)
            experts = plan.expert_index.view(N, k)
            weights = plan.combine_weight.view(N * k)  # rows: token t, choice c at t * k + c
            if sched.balanced_gate:
                experts = balanced_experts(N, k, E, rank, tokens.device)
            ids = experts.reshape(-1).cpu().numpy()  # NOTE: host sync; the plan is made on the host

        with timer.region(layer_region("plan", self.index)):
            local = np.concatenate([sched.local_estimate(self.index, N), np.bincount(ids, minlength=E)])
            gathered = [torch.empty(2 * E, dtype=torch.float64, device=tokens.device) for _ in range(world)]
            dist.all_gather(gathered, torch.from_numpy(local).to(tokens.device), group=self.group)
            gathered = torch.stack(gathered).cpu().numpy()  # (S, 2E); NOTE: host sync
            counts = gathered[:, E:].astype(np.int64)  # (S, E) rows per source and expert
            placement = sched.decide(self.index, ids[::k].copy(), gathered[:, :E].sum(axis=0), counts.sum(axis=0))
            routed = replica_token_counts(counts, placement)  # (S, D, E)
            sched.imbalance.append(load_imbalance(routed))
            dest = route_rows(ids, placement, counts[:rank].sum(axis=0))
            order = torch.from_numpy(np.argsort(dest * E + ids, kind="stable")).to(tokens.device)  # by (device, expert)
            traffic = routed.sum(axis=2)  # (S, D) rows from each source to each device
            send_splits, recv_splits = traffic[rank].tolist(), traffic[:, rank].tolist()

        with timer.region(layer_region("dispatch_a2a", self.index)):
            token_of_row = order // k
            rows = tokens[token_of_row]  # (P, M) sorted by destination device, then expert
            recv = exchange(rows, recv_splits, send_splits, self.group, self._schedule(traffic))

        with timer.region(layer_region("expert", self.index)):
            out = self._compute(recv, routed[:, rank, :])

        with timer.region(layer_region("combine_a2a", self.index)):
            back = exchange(out, send_splits, recv_splits, self.group, self._schedule(traffic.T))

        y = tokens.new_zeros(N, M).index_add(0, token_of_row, weights[order].unsqueeze(1).to(back.dtype) * back)
        return y.view(B, T, M), x.new_zeros(())

    def _schedule(self, traffic: np.ndarray) -> Schedule | None:
        """None (``all_to_all_single``), or Aurora's order planned from ``traffic`` ((S, D) rows; every
        rank has it from the plan, so unlike training no matrix is gathered)."""
        if self.schedule_kind is None:
            return None
        self.exchanges += 1
        return make_schedule(self.schedule_kind, traffic, seed=self.exchanges - 1)

    def _compute(self, recv: torch.Tensor, counts: np.ndarray) -> torch.Tensor:
        """Rows arrived in (source, expert) blocks with ``counts[s, e]`` rows -> expert outputs, same order."""
        to_expert_major = _block_transpose_index(counts.tolist(), recv.device)
        y = self.experts.forward_ragged(recv[to_expert_major], counts.sum(axis=0).tolist())
        return y[torch.argsort(to_expert_major)]


def balanced_experts(tokens: int, top_k: int, num_experts: int, rank: int, device) -> torch.Tensor:
    """(tokens, top_k) experts of Lina's "Ideal": global row g = (rank * tokens + t) * top_k + c
    goes to expert g mod E, so every expert (and, spread evenly, every device) gets the same rows."""
    rows = torch.arange(tokens * top_k, device=device) + rank * tokens * top_k
    return (rows % num_experts).view(tokens, top_k)


def use_inference_gating(model: nn.Module, top_k: int) -> None:
    """Route like inference in the single-process model: ``top_k`` experts, dropless, no random routing."""
    for layer in model.moe_layers():
        layer.top_k, layer.dropless, layer.random_routing = top_k, True, False


@torch.no_grad()
def top1_choices(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> np.ndarray:
    """(MoE layers, tokens) top-1 expert of every token in every MoE layer: the profile's input."""
    model(idx, targets)
    return np.stack([layer.last_gating.expert_index[..., 0].reshape(-1).cpu().numpy() for layer in model.moe_layers()])


def attach(model: nn.Module, top_k: int, timer: PhaseTimer, group=None, a2a_policy: str = "library") -> list[PlacedMoE]:
    """Replace every MoE layer of ``model`` by a PlacedMoE (sharing its weights); returns them in order."""
    placed = []
    for block in model.blocks:
        if isinstance(block.ffn, MoELayer):
            block.ffn = PlacedMoE(block.ffn, len(placed), top_k, timer, group, a2a_policy)
            placed.append(block.ffn)
    return placed
