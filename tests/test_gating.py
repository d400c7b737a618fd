"""GShard gating against hand-computed cases (reference/papers.md, GShard Algorithm 1)."""

import math

import pytest
import torch

from moe_core.model.capacity import capacity
from moe_core.model.gating import gshard_gating
from moe_core.model.layer import MoELayer

# 4 tokens, 3 experts; logits = log(p) so that softmax returns p exactly.
P = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.7, 0.2, 0.1], [0.6, 0.1, 0.3]])
LOGITS = P.log().unsqueeze(0)  # (G=1, S=4, E=3)


def test_top2_slots_capacity_and_weights():
    r = gshard_gating(LOGITS, top_k=2, capacity=2, noise=None, aux_loss_scale="paper")
    assert r.expert_index[0].tolist() == [[0, 1], [1, 2], [0, 1], [0, 2]]
    # top-1 slots first (expert 0 gets tokens 0, 2, 3), then top-2 slots offset by the top-1 counts
    assert r.slot[0].tolist() == [[0, 1], [0, 0], [1, 2], [2, 1]]
    assert r.kept[0].tolist() == [[True, True], [True, True], [True, False], [False, True]]
    expected = torch.tensor([[0.5 / 0.8, 0.3 / 0.8], [0.6 / 0.9, 0.3 / 0.9], [0.7 / 0.9, 0.0], [0.0, 0.3 / 0.9]])
    torch.testing.assert_close(r.combine_weight[0], expected)
    assert r.tokens_per_expert.tolist() == [2, 2, 2]
    assert r.dropped_fraction.item() == pytest.approx(2 / 8)


def test_aux_loss_paper_and_e2_scale():
    # c_e/S = [3/4, 1/4, 0]; m_e = [0.475, 0.3, 0.225]; l_aux = (1/E) sum_e c_e/S * m_e
    paper = (0.75 * 0.475 + 0.25 * 0.3) / 3
    r = gshard_gating(LOGITS, top_k=2, capacity=None, aux_loss_scale="paper")
    assert r.aux_loss.item() == pytest.approx(paper, rel=1e-6)
    r = gshard_gating(LOGITS, top_k=2, capacity=None, aux_loss_scale="e2")
    assert r.aux_loss.item() == pytest.approx(paper * 9, rel=1e-6)


def test_uniform_routing_aux_loss_is_one_with_e2_scale():
    E, S = 8, 64
    logits = torch.full((1, S, E), -10.0)
    logits[0, torch.arange(S), torch.arange(S) % E] = 10.0  # each expert is top-1 for S/E tokens
    r = gshard_gating(logits, top_k=1, capacity=None, aux_loss_scale="e2")
    assert r.aux_loss.item() == pytest.approx(1.0, abs=1e-3)


def test_top1_keeps_raw_gate_and_drops_overflow():
    r = gshard_gating(LOGITS, top_k=1, capacity=2)
    assert r.expert_index[0, :, 0].tolist() == [0, 1, 0, 0]
    torch.testing.assert_close(r.combine_weight[0, :, 0], torch.tensor([0.5, 0.6, 0.7, 0.0]))
    assert r.dropped_fraction.item() == pytest.approx(1 / 4)


def test_dropless_keeps_everything():
    r = gshard_gating(LOGITS, top_k=2, capacity=None)
    assert bool(r.kept.all()) and r.dropped_fraction.item() == 0.0


def test_random_routing_keeps_second_expert_with_probability_2g2():
    S = 20000
    p = torch.tensor([0.7, 0.15, 0.1, 0.05])  # normalised g2 = 0.15 / 0.85 -> kept with prob 2*g2 = 0.353
    logits = p.log().expand(1, S, 4).contiguous()
    noise = torch.rand(1, S, generator=torch.Generator().manual_seed(0))
    r = gshard_gating(logits, top_k=2, capacity=None, noise=noise)
    kept_rate = r.kept[0, :, 1].float().mean().item()
    assert kept_rate == pytest.approx(2 * 0.15 / 0.85, abs=0.01)
    # rejected second choices take no buffer slot and carry no weight
    assert (r.combine_weight[0, :, 1][~r.kept[0, :, 1]] == 0).all()
    r_again = gshard_gating(logits, top_k=2, capacity=None, noise=noise)
    assert torch.equal(r.kept, r_again.kept)


def test_gradients_flow_to_logits_through_combine_weights_and_aux_loss():
    logits = LOGITS.clone().requires_grad_(True)
    r = gshard_gating(logits, top_k=2, capacity=2)
    (r.combine_weight.sum() + r.aux_loss).backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "S,E,k,cf,expected", [(8, 4, 2, 1.0, 4), (8, 4, 2, 1.25, 5), (10, 4, 1, 1.0, 3), (4, 16, 2, 1.0, 4)]
)
def test_capacity_rounding_rule(S, E, k, cf, expected):
    assert (
        capacity(S, E, k, cf, min_capacity=4 if S == 4 else 1)
        == expected
        == max(4 if S == 4 else 1, math.ceil(cf * k * S / E))
    )


@pytest.mark.parametrize("top_k", [0, 4])
def test_bad_top_k_raises(top_k):
    with pytest.raises(ValueError, match="top_k"):
        gshard_gating(LOGITS, top_k=top_k, capacity=None)  # 3 experts


def test_random_routing_is_top2_only():
    with pytest.raises(ValueError, match="top_k 2 only"):
        gshard_gating(LOGITS, top_k=3, capacity=None, noise=torch.rand(1, 4))


def _top_k_reference(logits, k, capacity_slots):
    """Softmax, the k largest gates renormalised, then each expert's slots filled in (choice, token)
    order, one assignment at a time, dropping those past the capacity: loops, no sorting."""
    G, S, E = logits.shape
    top, experts = torch.softmax(logits, dim=-1).topk(k, dim=-1)
    weights = top / top.sum(dim=-1, keepdim=True)
    kept = torch.zeros(G, S, k, dtype=torch.bool)
    for g in range(G):
        taken = [0] * E
        for choice in range(k):
            for t in range(S):
                e = int(experts[g, t, choice])
                kept[g, t, choice] = capacity_slots is None or taken[e] < capacity_slots
                taken[e] += 1
    return experts, weights, kept


@pytest.mark.parametrize("k", [3, 4, 8])
@pytest.mark.parametrize("capacity_slots", [None, 3, 12])
def test_top_k_beyond_two_against_a_plain_reference(k, capacity_slots):
    G, S, E = 2, 40, 10
    logits = torch.randn(G, S, E, generator=torch.Generator().manual_seed(k))
    r = gshard_gating(logits, k, capacity=capacity_slots)
    experts, weights, kept = _top_k_reference(logits, k, capacity_slots)
    assert torch.equal(r.expert_index, experts)
    assert torch.equal(r.kept, kept)
    assert torch.allclose(r.combine_weight, weights * kept)
    assert torch.allclose(weights.sum(dim=-1), torch.ones(G, S))  # renormalised over the k choices
    assert torch.equal(r.slot, _one_hot_slots(r.expert_index, torch.ones_like(r.kept), E))  # every choice wanted
    assert int(r.tokens_per_expert.sum()) == int(kept.sum())
    assert float(r.dropped_fraction) == pytest.approx(1 - float(kept.float().mean()))


def test_dropless_top8_keeps_every_assignment():
    logits = torch.randn(3, 64, 16, generator=torch.Generator().manual_seed(0))
    r = gshard_gating(logits, top_k=8, capacity=None)
    assert bool(r.kept.all()) and float(r.dropped_fraction) == 0.0
    assert int(r.tokens_per_expert.sum()) == 3 * 64 * 8
    assert bool((r.expert_index.sort(dim=-1).values.diff(dim=-1) > 0).all())  # 8 distinct experts per token


def _one_hot_slots(experts, wanted, num_experts):
    """The readable reference of the slot rule: one-hot masks and cumulative sums over tokens (GShard's
    pseudo-code, lingvo's Top2GatingOnLogits), (G, S, E) tensors per choice."""
    slots, taken = [], 0
    for choice in range(experts.shape[-1]):
        mask = torch.nn.functional.one_hot(experts[..., choice], num_experts) * wanted[..., choice, None]  # (G, S, E)
        slots.append(((mask.cumsum(dim=1) - 1 + taken) * mask).sum(dim=-1))
        taken = taken + mask.sum(dim=1, keepdim=True)  # (G, 1, E): slots the earlier choices took
    return torch.stack(slots, dim=-1)  # (G, S, k)


@pytest.mark.parametrize("top_k,random_routing", [(1, False), (2, False), (2, True)])
def test_sorted_slots_equal_the_one_hot_rule(top_k, random_routing):
    generator = torch.Generator().manual_seed(top_k)
    G, S, E = 3, 200, 7
    logits = torch.randn(G, S, E, generator=generator)
    logits[:, :10] = 0.0  # ties: every expert equally likely
    noise = torch.rand(G, S, generator=generator) if random_routing else None
    dropless = gshard_gating(logits, top_k, capacity=None, noise=noise)
    assert torch.equal(dropless.slot, _one_hot_slots(dropless.expert_index, dropless.kept, E))
    for capacity_slots in (1, 20, 60):
        r = gshard_gating(logits, top_k, capacity=capacity_slots, noise=noise)
        assert torch.equal(r.slot, dropless.slot)
        assert torch.equal(r.kept, dropless.kept & (dropless.slot < capacity_slots))


def test_sorted_slots_at_a_size_one_hot_masks_could_not_afford():
    """S x E = 2^26 (one-hot int64 masks and their cumsums would take GBs): every expert's kept
    assignments fill slots 0..n-1, top-1 before top-2, tokens in order."""
    S, E, C = 2**16, 2**10, 80
    logits = torch.randn(1, S, E, generator=torch.Generator().manual_seed(0))
    r = gshard_gating(logits, top_k=2, capacity=C)
    expert, slot, kept = r.expert_index[0], r.slot[0], r.kept[0]  # (S, 2)
    key = expert * (2 * S) + torch.arange(2).view(1, 2) * S + torch.arange(S).view(S, 1)  # (expert, choice, token)
    for e in (0, 1, E // 2, E - 1):
        mine = expert == e
        in_order = slot[mine][key[mine].argsort()]
        assert torch.equal(in_order, torch.arange(int(mine.sum())))  # slots 0.. in (choice, token) order
        assert torch.equal(kept[mine], slot[mine] < C)
    assert int(r.tokens_per_expert.sum()) == int(kept.sum()) and int(r.tokens_per_expert.max()) <= C


@pytest.mark.parametrize("dropless", [False, True])
def test_a_top4_moe_layer_is_the_weighted_sum_of_its_experts(dropless):
    """Capacity mode (room for every assignment) and dropless mode give each token the renormalised
    weighted sum of its 4 experts' outputs."""
    torch.manual_seed(0)
    E, M = 6, 8
    layer = MoELayer(
        d_model=M,
        d_ff=16,
        num_experts=E,
        top_k=4,
        capacity_factor=float(E),  # C = 4 * S: every assignment fits
        min_capacity=0,
        group_size=0,
        second_expert_policy="random",  # GShard's top-2 rule: every choice is kept at top_k 4
        dropless=dropless,
        aux_loss_scale="e2",
        layer_id=0,
        seed=0,
    )
    x = torch.randn(2, 5, M)
    with torch.no_grad():
        y, _ = layer(x)
        tokens = x.reshape(-1, M)
        top, experts = torch.softmax(layer.gate(tokens), dim=-1).topk(4, dim=-1)
        w_in, w_out = layer.experts.w_in, layer.experts.w_out
        expected = torch.stack(
            [
                sum(
                    top[t, c] / top[t].sum() * (torch.relu(tokens[t] @ w_in[e]) @ w_out[e])
                    for c, e in enumerate(experts[t])
                )
                for t in range(tokens.shape[0])
            ]
        )
    assert bool(layer.last_gating.kept.all())
    assert torch.allclose(y.reshape(-1, M), expected, atol=1e-5)


@pytest.mark.parametrize("top_k, group_size", [(1, 0), (2, 0), (2, 6)])
def test_the_einsum_permutation_gives_the_index_path_s_outputs_and_gradients(top_k, group_size):
    """GShard's einsum dispatch and combine (moe.permute=einsum, DeepSpeed-MoE's MOELayer) compute the
    same sums as the row scatter and gather, dropped tokens included (a capacity of 2 slots drops
    most of 12 tokens' choices), over one group or several."""

    def layer(permute: str) -> MoELayer:
        torch.manual_seed(0)
        return MoELayer(
            d_model=8,
            d_ff=16,
            num_experts=4,
            top_k=top_k,
            capacity_factor=0.5,
            min_capacity=2,
            group_size=group_size,
            second_expert_policy="always",
            dropless=False,
            aux_loss_scale="e2",
            permute=permute,
            layer_id=0,
            seed=0,
        )

    x = torch.randn(2, 6, 8)
    results = {}
    for permute in ("index", "einsum"):
        moe, xi = layer(permute), x.clone().requires_grad_(True)
        y, aux = moe(xi)
        (y.square().sum() + aux).backward()
        results[permute] = (y, xi.grad, moe.gate.weight.grad, moe.experts.w_in.grad, moe.last_gating.kept)
    index, einsum = results["index"], results["einsum"]
    assert not bool(index[-1].all()), "the capacity must drop some choices for the test to mean anything"
    for a, b in zip(index, einsum):
        assert torch.allclose(a, b, atol=1e-5), (a, b)
