"""Expert FFNs: the batched and grouped GEMM paths against a plain per-expert computation."""

import torch

from moe_core.model.experts import Experts


def test_ragged_experts_equal_per_expert_ffns_including_empty_experts():
    torch.manual_seed(0)
    experts = Experts(4, d_model=8, d_ff=16)
    counts = [3, 0, 5, 2]
    x = torch.randn(sum(counts), 8, requires_grad=True)
    y = experts.forward_ragged(x, counts)
    reference = torch.cat(
        [torch.relu(chunk @ experts.w_in[e]) @ experts.w_out[e] for e, chunk in enumerate(torch.split(x, counts))]
    )
    torch.testing.assert_close(y, reference)
    grad = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, experts.w_in, experts.w_out), grad)
    want = torch.autograd.grad(reference, (x, experts.w_in, experts.w_out), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert float(got[1][1].abs().sum()) == 0.0  # the empty expert gets an exact zero gradient


def test_equal_split_experts_are_one_batched_gemm_pair():
    torch.manual_seed(0)
    experts = Experts(3, d_model=8, d_ff=16)
    x = torch.randn(3, 5, 8)
    reference = torch.stack([torch.relu(x[e] @ experts.w_in[e]) @ experts.w_out[e] for e in range(3)])
    torch.testing.assert_close(experts(x), reference)
