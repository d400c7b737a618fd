"""The MoE layer: gate -> dispatch all-to-all -> experts -> combine all-to-all -> weighted sum.

The layer knows nothing about process groups: ``comm`` (a moe_core.schedule.executor.CommPolicy, set by
``parallel.parallelize_model`` + the training entry point) moves tokens between ranks; with
``comm=None`` all experts are local and the same math runs in one process (the reference that
expert-parallel runs are tested against).

Two dispatch modes:

* capacity (GShard): every rank sends an (E, G, C, M) buffer; the all-to-all has equal splits. The
  tokens go into their slots and back by a row scatter and gather, or (``permute="einsum"``) as
  GShard's Algorithm 2 and DeepSpeed-MoE write it, by GEMMs against one-hot (S, E*C) matrices.
* dropless: tokens sorted by expert, uneven ``all_to_all_single`` splits agreed by a first
  all-to-all of per-expert counts (NOTE: a host sync, as in Megatron's and MegaBlocks' dropless paths).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from moe_core.host.timing import PhaseTimer
from moe_core.model.capacity import capacity
from moe_core.model.experts import Experts
from moe_core.model.gating import GatingResult, gshard_gating


class MoELayer(nn.Module):
    def __init__(
        self,
        *,
        d_model: int,
        d_ff: int,
        num_experts: int,
        top_k: int,
        capacity_factor: float,
        min_capacity: int,
        group_size: int,
        second_expert_policy: str,
        dropless: bool,
        aux_loss_scale: str,
        activation: str = "relu",
        gate_host_sync: bool = False,
        permute: str = "index",
        layer_id: int,
        seed: int,
    ):
        super().__init__()
        self.num_experts, self.top_k, self.group_size = num_experts, top_k, group_size
        self.capacity_factor, self.min_capacity, self.dropless = capacity_factor, min_capacity, dropless
        self.random_routing = second_expert_policy == "random"
        self.aux_loss_scale, self.layer_id, self.seed = aux_loss_scale, layer_id, seed
        self.gate = nn.Linear(d_model, num_experts, bias=False)
        self.experts = Experts(num_experts, d_model, d_ff, activation)
        self.comm = None  # CommPolicy under expert parallelism
        self.timer = PhaseTimer(enabled=False)
        self.rank = 0  # global rank: numbers this rank's groups for random routing
        self.step = 0  # forward count in training mode: draws fresh routing noise every step
        self.last_gating: GatingResult | None = None
        # DeepSpeed-MoE's gate copied its expert counts to the host every forward (until 2024-08);
        # moe.gate_host_sync runs the same read here, so measured and simulated steps share the sync
        self.gate_host_sync = gate_host_sync
        self.host_expert_counts: list[int] | None = None
        self.permute = permute  # "index" or "einsum" (moe.permute): how the capacity path fills its slots

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, M) -> ((B, T, M), aux_loss). Tokens dropped by capacity come back as zeros."""
        B, T, M = x.shape
        tokens = x.reshape(B * T, M)  # (N, M)
        S = self.group_size or B * T
        G = tokens.shape[0] // S
        timer = self.timer

        tokens_g = timer.mark_backward(tokens, "gate", "in")
        with timer.region("gate.fwd"):
            logits = self.gate(tokens_g).view(G, S, self.num_experts)  # (G, S, E)
            noise = self._routing_noise(G, S, x.device) if self.top_k == 2 and self.random_routing else None
            C = (
                None
                if self.dropless
                else capacity(S, self.num_experts, self.top_k, self.capacity_factor, self.min_capacity)
            )
            plan = gshard_gating(logits, self.top_k, C, noise, self.aux_loss_scale)
            if self.gate_host_sync:  # NOTE: host sync, on purpose (moe.gate_host_sync)
                self.host_expert_counts = plan.tokens_per_expert.tolist()
        combine_weight = timer.mark_backward(plan.combine_weight, "gate", "out")
        self.last_gating = plan
        if self.training:
            self.step += 1

        if self.dropless:
            y = self._dropless(tokens, plan, combine_weight)
        else:
            y = self._capacity(tokens, plan, combine_weight, G, S, C)
        return y.view(B, T, M).to(x.dtype), plan.aux_loss

    # -- capacity mode ---------------------------------------------------------------------------
    def _capacity(self, tokens, plan: GatingResult, combine_weight, G: int, S: int, C: int) -> torch.Tensor:
        if self.permute == "einsum":
            return self._capacity_einsum(tokens, plan, combine_weight, G, S, C)
        E, M = self.num_experts, tokens.shape[-1]
        with self.timer.region("permute.fwd"):
            group = torch.arange(G, device=tokens.device).view(G, 1, 1)
            flat_slot = (group * E + plan.expert_index) * C + plan.slot.clamp(max=C - 1)  # (G, S, k)
            token_id = torch.arange(G * S, device=tokens.device).view(G, S, 1).expand_as(flat_slot)
            # Dropped assignments are copied to a spare last row, cut off afterwards: no boolean
            # indexing, whose data-dependent size would make the host wait for the device.
            rows = G * E * C
            target = torch.where(plan.kept, flat_slot, rows).reshape(-1)  # (G*S*k,)
            buf = tokens.new_zeros(rows + 1, M).index_copy(0, target, gather_rows(tokens, token_id))[:rows]
            buf = buf.view(G, E, C, M).transpose(0, 1).reshape(E * G * C, M)  # expert-major: (E*G*C, M)

        out = self._exchange_and_compute_equal(buf, G * C)  # (E*G*C, M)
        with self.timer.region("unpermute.fwd"):
            out = out.view(E, G, C, M).transpose(0, 1).reshape(G * E * C, M)  # back to group-major
            gathered = gather_rows(out, flat_slot).view(G * S, self.top_k, M)  # (N, k, M)
        with self.timer.region("combine.fwd"):
            return (combine_weight.reshape(G * S, self.top_k, 1).to(gathered.dtype) * gathered).sum(dim=1)

    def _capacity_einsum(self, tokens, plan: GatingResult, combine_weight, G: int, S: int, C: int) -> torch.Tensor:
        """The capacity path as GShard's Algorithm 2 (and DeepSpeed-MoE's MOELayer) computes it: each
        group's (S, M) tokens into the (E*C, M) slots by a GEMM with the one-hot dispatch mask, the
        expert outputs back by a GEMM with the (S, E*C) combine weights. The same sums as the index
        path, at 2 S E C M FLOPs a group each way: quadratic in the group size S."""
        E, M = self.num_experts, tokens.shape[-1]
        slot = plan.expert_index * C + plan.slot.clamp(max=C - 1)  # (G, S, k): the slot within the group
        with self.timer.region("permute.fwd"):
            mask = slot_matrix(slot, plan.kept.to(tokens.dtype), E * C)
            buf = torch.einsum("gsx,gsm->gxm", mask, tokens.view(G, S, M))
            buf = buf.view(G, E, C, M).transpose(0, 1).reshape(E * G * C, M)  # expert-major: (E*G*C, M)

        out = self._exchange_and_compute_equal(buf, G * C)  # (E*G*C, M)
        with self.timer.region("combine.fwd"):
            weights = slot_matrix(slot, combine_weight.view(G, S, -1), E * C).to(out.dtype)
            out = out.view(E, G, C, M).transpose(0, 1).reshape(G, E * C, M)  # back to group-major
            return torch.einsum("gsx,gxm->gsm", weights, out).reshape(G * S, M)

    def _exchange_and_compute_equal(self, buf: torch.Tensor, rows_per_expert: int) -> torch.Tensor:
        """buf (E*R, M) in expert order -> expert outputs in the same order; R rows per expert.

        The policy runs dispatch all-to-all -> experts -> combine all-to-all (Lina pipelines them).
        """
        if self.comm is None:
            return self._compute_received(buf, rows_per_expert)
        return self.comm.exchange_compute_exchange(
            buf, rows_per_expert, self._compute_received, tuple(self.experts.parameters())
        )

    def _compute_received(self, buf: torch.Tensor, rows_per_expert: int) -> torch.Tensor:
        """Rows received from every expert-parallel rank, (ep_src * e_local * R, M), through this
        rank's experts; the outputs go back in the same layout."""
        M, e_local = buf.shape[-1], self.experts.num_local
        ep = self.num_experts // e_local
        x = buf.view(ep, e_local, rows_per_expert, M).transpose(0, 1).reshape(e_local, ep * rows_per_expert, M)
        x = self.timer.mark_backward(x, "expert", "in")
        with self.timer.region("expert.fwd"):
            y = self.experts(x)  # (e_local, ep*R, M)
        y = self.timer.mark_backward(y, "expert", "out")
        return y.view(e_local, ep, rows_per_expert, M).transpose(0, 1).reshape(ep * e_local * rows_per_expert, M)

    # -- dropless mode ---------------------------------------------------------------------------
    def _dropless(self, tokens, plan: GatingResult, combine_weight) -> torch.Tensor:
        N, M = tokens.shape
        with self.timer.region("permute.fwd"):
            kept = plan.kept.reshape(N, self.top_k)
            token_id = torch.arange(N, device=tokens.device).unsqueeze(1).expand(N, self.top_k)[kept]  # (P,)
            expert = plan.expert_index.reshape(N, self.top_k)[kept]  # (P,)
            weight = combine_weight.reshape(N, self.top_k)[kept]  # (P,)
            order = torch.argsort(expert, stable=True)
            token_id, expert, weight = token_id[order], expert[order], weight[order]
            counts = torch.bincount(expert, minlength=self.num_experts)  # (E,)
            routed = gather_rows(tokens, token_id)  # (P, M) sorted by expert
        out = self._exchange_and_compute_ragged(routed, counts)  # (P, M)
        with self.timer.region("combine.fwd"):
            weighted = weight.unsqueeze(1).to(out.dtype) * out  # (P, M)
        with self.timer.region("unpermute.fwd"):
            return tokens.new_zeros(N, M).index_add(0, token_id, weighted)

    def _exchange_and_compute_ragged(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x (P, M) sorted by global expert with counts (E,) -> expert outputs in the same order."""
        e_local = self.experts.num_local
        ep = self.num_experts // e_local
        if self.comm is None:
            return self._compute_ragged(x, counts.tolist())
        with torch.no_grad():
            recv_counts = self.comm.all_to_all(counts, None, None, "dispatch_a2a").view(ep, e_local)  # (src, e)
        send_splits = counts.view(ep, e_local).sum(dim=1).tolist()  # NOTE: host sync
        recv = recv_counts.tolist()
        recv_splits = [sum(row) for row in recv]
        x = self.comm.all_to_all(x, recv_splits, send_splits, "dispatch_a2a")  # rows by (src, e)
        to_expert_major = _block_transpose_index(recv, x.device)
        per_expert = [sum(recv[s][e] for s in range(ep)) for e in range(e_local)]
        y = self._compute_ragged(gather_rows(x, to_expert_major), per_expert)
        y = gather_rows(y, torch.argsort(to_expert_major))
        return self.comm.all_to_all(y, send_splits, recv_splits, "combine_a2a")

    def _compute_ragged(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        x = self.timer.mark_backward(x, "expert", "in")
        with self.timer.region("expert.fwd"):
            y = self.experts.forward_ragged(x, counts)
        return self.timer.mark_backward(y, "expert", "out")

    def _routing_noise(self, G: int, S: int, device) -> torch.Tensor:
        """U(0,1) per token for random routing, drawn per (seed, step, layer, global group).

        Seeding each group by its global index makes routing independent of the layout: the same
        token gets the same draw on any world size, which the equivalence tests rely on.
        """
        noise = torch.empty(G, S)
        for g in range(G):
            global_group = self.rank * G + g
            seed = hash((self.seed, self.step, self.layer_id, global_group)) % (2**63)
            noise[g] = torch.rand(S, generator=torch.Generator().manual_seed(seed))
        return noise.to(device)


def _block_transpose_index(counts: list[list[int]], device) -> torch.Tensor:
    """Row permutation from (src, expert)-major blocks to (expert, src)-major blocks.

    ``counts[s][e]`` rows arrived from rank s for local expert e, stored block after block.
    """
    starts, offset = {}, 0
    for s, row in enumerate(counts):
        for e, n in enumerate(row):
            starts[s, e] = offset
            offset += n
    pieces = [
        torch.arange(starts[s, e], starts[s, e] + counts[s][e])
        for e in range(len(counts[0]))
        for s in range(len(counts))
    ]
    return torch.cat(pieces).to(device) if pieces else torch.empty(0, dtype=torch.long, device=device)


def slot_matrix(slot: torch.Tensor, values: torch.Tensor, slots: int) -> torch.Tensor:
    """(G, S, slots) zeros but ``values`` (G, S, k) at each token's ``slot`` (G, S, k): GShard's one-hot
    dispatch mask (values: 1 where kept, so a dropped choice's clamped slot stays 0) or combine
    weights. A token's k choices are distinct experts, so its slots never collide."""
    G, S, _ = slot.shape
    return values.new_zeros(G, S, slots).scatter(2, slot, values)


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` (any shape, flattened) of ``x``: ``x[index]`` with a fast backward.

    Advanced indexing's backward accumulates with a sort-based CUDA kernel that runs repeated indices
    one after another; a top-k dispatch repeats every token k times and a capacity gather repeats the
    spare slot of every dropped assignment, so on an H200 that kernel took 31% of a training step's
    device time (results/reference/2026-12-04-h200). ``index_select``'s backward is ``index_add_``
    (atomic adds), the gather Megatron-Core's token permutation uses. Forward values are identical.
    """
    return x.index_select(0, index.reshape(-1))
