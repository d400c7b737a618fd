"""GShard top-1/top-2 gating, and top-k beyond 2, with local group dispatching, capacity and random routing.

Follows GShard Algorithm 1 (arXiv 2006.16668v1) and its reference code (lingvo
``Top2GatingOnLogits``), for tokens already split into G groups of S tokens:

* gates g = softmax(logits); top-1 expert e1 and (top-2) second expert e2;
  with top-2 both gates are renormalised, g1 <- g1/(g1+g2), g2 <- g2/(g1+g2); top-1 keeps raw g1.
* top-k for k >= 3 (Mixtral, Qwen3 with ``norm_topk_prob``): the k largest gates (``torch.topk``),
  renormalised to sum to 1. Top-2 keeps GShard's own code above, so its results stay bit-identical.
* Buffer positions: top-1 assignments take slots before any top-2 assignment of the same group
  (lingvo offsets position_in_expert_2 by the top-1 count), and so on for every further choice:
  slots by (choice, token); positions past the capacity C are dropped. A token whose every
  assignment is dropped gets a zero combine vector and passes through the residual connection
  ("overflowed" in the paper).
* Random routing: the 2nd expert is kept only if 2*g2 > U(0,1) (lingvo's threshold 0.5). As in
  lingvo, a rejected assignment takes no slot (the paper's pseudo-code counts it anyway). The rule
  is GShard's for its 2nd expert only: top-1 and top-k for k >= 3 keep every choice (as "always").
* Auxiliary load-balancing loss, per group l_aux = (1/E) sum_e (c_e/S) m_e, where c_e counts tokens
  whose top-1 is e and m_e is the mean gate of e; averaged over groups. ``aux_loss_scale="e2"``
  multiplies by E^2 (lingvo, DeepSpeed, Tutel), so perfectly uniform routing gives 1 instead of 1/E^2
  (c_e/S = m_e = 1/E for every e: (1/E) * E * (1/E^2)). For any k the counts are of the top-1
  choice, as GShard's loss (Mixtral and Qwen3 count all k choices; that form is not implemented).
* Dropless mode (``capacity=None``): every assignment is kept.

The result is a dispatch plan, independent of how tokens are moved (all-to-all or local copy).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class GatingResult:
    expert_index: torch.Tensor  # (G, S, k) long: chosen expert per token and choice
    slot: torch.Tensor  # (G, S, k) long: position in the expert's buffer of that group
    combine_weight: torch.Tensor  # (G, S, k) float: gate weight, 0 where not kept
    kept: torch.Tensor  # (G, S, k) bool: assignment dispatched
    aux_loss: torch.Tensor  # () float
    tokens_per_expert: torch.Tensor  # (E,) long: kept assignments per expert, summed over groups
    dropped_fraction: torch.Tensor  # () float: share of wanted assignments dropped by capacity


def gshard_gating(
    logits: torch.Tensor,
    top_k: int,
    capacity: int | None,
    noise: torch.Tensor | None = None,
    aux_loss_scale: str = "e2",
) -> GatingResult:
    """Route tokens of G groups to experts.

    Args:
        logits: (G, S, E) gate logits.
        top_k: experts per token, >= 1 and at most E.
        capacity: slots per expert and group (C), or None for dropless routing.
        noise: (G, S) U(0,1) draws for random routing of the 2nd expert (top_k 2 only); None keeps
            every 2nd choice.
        aux_loss_scale: "paper" for GShard's (1/E) sum_e (c_e/S) m_e, "e2" for E^2 times that.
    """
    G, S, E = logits.shape
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k must be between 1 and the {E} experts, got {top_k}")
    if noise is not None and top_k != 2:
        raise ValueError(f"random routing (noise) is GShard's rule for the 2nd expert: top_k 2 only, got {top_k}")
    gates = F.softmax(logits.float(), dim=-1)  # (G, S, E)
    g1, e1 = gates.max(dim=-1)  # (G, S)

    counts1 = _per_expert(e1, torch.ones_like(e1), E)  # (G, E): c_e, tokens whose top-1 is e
    mean_gate = gates.mean(dim=1)  # (G, E): m_e
    aux = (counts1 / S * mean_gate).sum(dim=-1).mean() / E
    if aux_loss_scale == "e2":
        aux = aux * E * E
    elif aux_loss_scale != "paper":
        raise ValueError(f"aux_loss_scale must be 'paper' or 'e2', got {aux_loss_scale!r}")

    if top_k == 1:
        experts, weights = e1[..., None], g1[..., None]
        wanted = torch.ones_like(experts, dtype=torch.bool)
    elif top_k == 2:
        g2, e2 = gates.scatter(-1, e1[..., None], -1.0).max(dim=-1)  # (G, S): best expert but e1
        denom = g1 + g2
        g1, g2 = g1 / denom, g2 / denom
        keep2 = torch.ones_like(g2, dtype=torch.bool) if noise is None else 2.0 * g2 > noise
        experts = torch.stack([e1, e2], dim=-1)
        weights = torch.stack([g1, g2], dim=-1)
        wanted = torch.stack([torch.ones_like(keep2), keep2], dim=-1)
    else:
        top, experts = gates.topk(top_k, dim=-1)  # (G, S, k), largest first
        weights = top / top.sum(dim=-1, keepdim=True)
        wanted = torch.ones_like(experts, dtype=torch.bool)
    slots = _slots(experts, wanted, E)  # (G, S, k)

    kept = wanted if capacity is None else wanted & (slots < capacity)
    combine = weights * kept
    tokens_per_expert = _per_expert(experts.reshape(1, -1), kept.reshape(1, -1).long(), E)[0]  # (E,)
    n_wanted = wanted.sum()
    dropped = (n_wanted - kept.sum()).float() / n_wanted.clamp(min=1)
    return GatingResult(experts, slots, combine, kept, aux, tokens_per_expert, dropped)


def _per_expert(experts: torch.Tensor, values: torch.Tensor, num_experts: int) -> torch.Tensor:
    """(G, A) expert ids and values -> (G, E) sums of the values per expert (a histogram for ones)."""
    totals = torch.zeros(experts.shape[0], num_experts, dtype=values.dtype, device=experts.device)
    return totals.scatter_add_(1, experts, values)


def _slots(experts: torch.Tensor, wanted: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Buffer position of every assignment in its expert, by sorting, not by one-hot cumsums.

    ``experts``/``wanted``: (G, S, k). Within a group, the wanted assignments of an expert take slots
    0, 1, 2, ... in the order (choice, token): every top-1 assignment before any top-2 one, tokens in
    order (GShard; lingvo offsets top-2 positions by the top-1 count). Sorting the (G, k*S)
    assignments by (expert, choice, token) puts each expert's in that order; an assignment's slot is
    its sorted position minus the start of its expert's run. Unwanted assignments sort last and get
    slot 0. No (G, S, E) tensor and no host sync: argsort, a histogram and a cumsum.
    """
    G, S, k = experts.shape
    flat = experts.transpose(1, 2).reshape(G, k * S)  # (G, A): choice-major, then token
    valid = wanted.transpose(1, 2).reshape(G, k * S)
    bucket = torch.where(valid, flat, num_experts)  # unwanted: an extra expert E, sorted last
    position = torch.arange(k * S, device=experts.device)
    order = (bucket * (k * S) + position).argsort(dim=1)  # (G, A) by (expert, choice, token)
    counts = _per_expert(bucket, torch.ones_like(bucket), num_experts + 1)  # (G, E + 1)
    starts = counts.cumsum(dim=1) - counts  # (G, E + 1): first sorted position of each expert
    rank = position - starts.gather(1, bucket.gather(1, order))  # (G, A): slot, in sorted order
    slots = torch.empty_like(rank).scatter_(1, order, rank)  # back to (choice, token) order
    slots = torch.where(valid, slots, 0)
    return slots.reshape(G, k, S).transpose(1, 2)  # (G, S, k)
