"""An inference forward pass as a DAG of operations: the simulated executor of placed MoE inference.

Forward only, on one compute stream, block after block as the measured inference runs them
(experiments/inference.py): the embedding, per block its norms and attention and then the dense FFN
or an MoE layer, and the head with its loss. An MoE layer is gate -> copy -> dispatch all-to-all ->
the experts -> combine all-to-all -> copy, with top-1 routing and no capacity (every token is
computed). What a layer exchanges and computes is the caller's: a placement (which devices hold
which expert, how tokens are dealt to replicas) decided per layer and batch gives the (sources,
devices, experts) rows of the exchange (``routed``). The all-to-alls are uneven, priced from their
traffic matrices on the topology; each device computes its experts one after another, one GEMM pair
per expert on its rows (as the measured executor does), and the exchange back waits for the slowest
device. Ops are priced by the training step's compute model (moe_core.sim.step, compute.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from omegaconf import DictConfig

from ..capacity import moe_blocks
from .collectives import collective_op, simulate_on
from .engine import Op, Timeline, as_deps
from .step import StepModel

INFERENCE_PHASES = ("gate", "dispatch_a2a", "expert", "combine_a2a")


@dataclass
class ForwardSimulation:
    ops: list[Op]
    timeline: Timeline

    def metrics(self) -> dict[str, float]:
        """The measured inference's per-batch metrics, in ms: ``forward_ms`` (the whole pass),
        ``<phase>_ms`` summed over the MoE layers, ``moe_layer_ms`` (their sum: Lina's MoE-layer
        time) and ``a2a_layer<i>_ms``, both all-to-alls of the i-th MoE layer; and ``a2a_ms`` with
        ``a2a_share``, the all-to-alls' time and share of the pass."""
        ms = (self.timeline.end_s - self.timeline.start_s) * 1e3
        out = {"forward_ms": self.timeline.makespan_s * 1e3}
        out |= {f"{p}_ms": float(sum(d for op, d in zip(self.ops, ms) if op.phase == p)) for p in INFERENCE_PHASES}
        out["moe_layer_ms"] = sum(out[f"{p}_ms"] for p in INFERENCE_PHASES)
        out["a2a_ms"] = out["dispatch_a2a_ms"] + out["combine_a2a_ms"]
        out["a2a_share"] = out["a2a_ms"] / out["forward_ms"]  # of the inference pass (Lina Table 1)
        layers = sorted(
            {op.name.split(".")[0] for op in self.ops if op.phase.endswith("a2a")}, key=lambda s: int(s[1:])
        )
        for i, layer in enumerate(layers):
            out[f"a2a_layer{i}_ms"] = float(
                sum(d for op, d in zip(self.ops, ms) if op.phase.endswith("a2a") and op.name.startswith(f"{layer}."))
            )
        return out


class ForwardModel(StepModel):
    """The forward pass of ``cfg``'s model on ``topo`` (tokens per device: train.batch_size x
    model.seq_len), its MoE layers under given placements. ``cfg`` is the inference setting: the
    layout's expert-parallel group is every device, ``moe.top_k`` 1 and ``moe.dropless`` set."""

    def __init__(self, cfg: DictConfig, topo):
        if not cfg.moe.dropless or cfg.moe.top_k != 1:
            raise ValueError(
                "a simulated inference pass routes top-1 without capacity: set moe.top_k=1 moe.dropless=true"
            )
        super().__init__(cfg, topo)
        self.group = np.arange(self.layout.world_size)

    def run(self, routed: list[np.ndarray]) -> ForwardSimulation:
        """Simulate one batch; ``routed[i]`` (S, D, E): rows source s sends to device d for expert e in
        the i-th MoE layer (moe_core/papers/lina/placement.py: ``replica_token_counts``)."""
        ops = self.build_forward(routed)
        return ForwardSimulation(ops, simulate_on(self.cfg.hardware, self.topo, ops))

    def build_forward(self, routed: list[np.ndarray]) -> list[Op]:
        m = self.cfg.model
        moe_layers = moe_blocks(m.n_layers, m.moe_every)
        if len(routed) != len(moe_layers):
            raise ValueError(f"the model has {len(moe_layers)} MoE layers, got the routing of {len(routed)}")
        ops: list[Op] = []

        def add(name: str, phase: str, after, **kw) -> int:
            ops.append(Op(name, phase, as_deps(after), **kw))
            return len(ops) - 1

        row_bytes = m.d_model * self.elem
        last = add("embed.fwd", "dense", None, duration_s=self._embedding_seconds("fwd"))
        exchanges = iter(routed)
        for i in range(m.n_layers):
            last = add(f"L{i}.norms.fwd", "dense", last, duration_s=self._norms_seconds("fwd"))
            last = add(f"L{i}.attn.fwd", "dense", last, duration_s=self._attention_seconds("fwd"))
            if i not in moe_layers:
                last = add(f"L{i}.ffn.fwd", "dense", last, duration_s=self._ffn_seconds("fwd"))
                continue
            rows = next(exchanges)
            traffic = rows.sum(axis=2) * row_bytes  # (S, D) bytes
            copy_s = max(self._copy_seconds(float(b)) for b in traffic.sum(axis=1))
            last = add(f"L{i}.gate.fwd", "gate", last, duration_s=self._gate_seconds("fwd"))
            last = add(f"L{i}.copy_before.fwd", "copy", last, duration_s=copy_s)
            last = add(f"L{i}.dispatch.fwd", "dispatch_a2a", last, **self._exchange(traffic))
            experts_s = max(self._device_experts_seconds(rows[:, d, :].sum(axis=0)) for d in range(rows.shape[1]))
            last = add(f"L{i}.expert.fwd", "expert", last, duration_s=experts_s)
            last = add(f"L{i}.combine.fwd", "combine_a2a", last, **self._exchange(traffic.T))
            last = add(f"L{i}.copy_after.fwd", "copy", last, duration_s=copy_s)
        add("head.fwd", "dense", last, duration_s=self._head_seconds(passes=("fwd",)))
        return ops

    def _exchange(self, traffic: np.ndarray) -> dict:
        """The op costs of an uneven all-to-all of ``traffic`` bytes (source, destination)."""
        return collective_op(self.cfg.hardware, self.topo, "all_to_all", self.topo.all_to_all(self.group, traffic))

    def _device_experts_seconds(self, rows_per_expert: np.ndarray) -> float:
        """One device's experts, one after another: a GEMM pair per expert with rows."""
        return sum(self.expert_ffn_seconds("fwd", r, 1, self.cfg.model.d_ff) for r in rows_per_expert if r > 0)
