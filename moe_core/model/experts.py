"""FFN experts, FFN_e(x) = wo_e . act(wi_e . x), stored as stacked weights for batched GEMMs: GShard's
ReLU, or SwiGLU (Llama's, Mixtral's experts) with the gate and up projections side by side in wi_e."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from moe_core.model.activation import in_width


def ffn_activation(h: torch.Tensor, activation: str) -> torch.Tensor:
    """The FFN nonlinearity on the input projection's output (..., in_width * H) -> (..., H):
    ReLU, or SwiGLU's silu(gate) * up (Shazeer 2020) with gate and up the two halves of the last dim."""
    if activation == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up
    return torch.relu(h)


class Experts(nn.Module):
    """A stack of ``num_experts`` FFN experts (all of them, or a rank's slice after :meth:`keep`)."""

    def __init__(self, num_experts: int, d_model: int, d_ff: int, activation: str = "relu"):
        super().__init__()
        self.activation = activation
        width = in_width(activation) * d_ff
        self.w_in = nn.Parameter(
            nn.init.normal_(torch.empty(num_experts, d_model, width), std=d_model**-0.5)
        )  # (E, M, H) or, SwiGLU, (E, M, 2H): [gate | up]
        self.w_out = nn.Parameter(nn.init.normal_(torch.empty(num_experts, d_ff, d_model), std=d_ff**-0.5))  # (E, H, M)

    @property
    def num_local(self) -> int:
        return self.w_in.shape[0]

    def keep(self, first: int, count: int) -> None:
        """Keep experts [first, first + count): a rank's share under expert parallelism.

        Weights are created for all experts with the same seed on every rank and then sliced, so an
        expert-parallel model starts identical to the single-process one.
        """
        self.w_in = nn.Parameter(self.w_in.detach()[first : first + count].clone())
        self.w_out = nn.Parameter(self.w_out.detach()[first : first + count].clone())

    def keep_hidden(self, first: int, count: int) -> None:
        """Keep hidden units [first, first + count) of every expert: a rank's share under tensor
        parallelism (w_in's columns, of the gate and of the up half under SwiGLU; w_out's rows); the
        partial outputs are summed over "tp"."""
        E, M, width = self.w_in.shape
        halves = self.w_in.detach().view(E, M, in_width(self.activation), width // in_width(self.activation))
        self.w_in = nn.Parameter(halves[..., first : first + count].reshape(E, M, -1).clone())
        self.w_out = nn.Parameter(self.w_out.detach()[:, first : first + count].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Equal token counts per expert (capacity mode): (e, n, M) -> (e, n, M), one batched GEMM pair."""
        return torch.bmm(ffn_activation(torch.bmm(x, self.w_in), self.activation), self.w_out)

    def forward_ragged(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Tokens sorted by expert with ``counts[e]`` rows each (dropless mode): (n, M) -> (n, M).

        One grouped GEMM pair (``torch.nn.functional.grouped_mm``) where torch offers it for this
        device and dtype (CPU; bf16 on CUDA), else a per-expert loop. Either way an expert with zero
        rows still takes part in autograd (its gradient is zero), so gradient buckets stay complete.
        """
        w_in, w_out = self.w_in.to(x.dtype), self.w_out.to(x.dtype)
        if hasattr(F, "grouped_mm") and (x.device.type == "cpu" or x.dtype == torch.bfloat16):
            offs = torch.tensor(counts, device=x.device).cumsum(0).to(torch.int32)
            hidden = ffn_activation(F.grouped_mm(x, w_in, offs=offs), self.activation)
            return F.grouped_mm(hidden, w_out, offs=offs)
        chunks = enumerate(torch.split(x, counts, dim=0))
        outs = [ffn_activation(chunk @ w_in[e], self.activation) @ w_out[e] for e, chunk in chunks]
        return torch.cat(outs, dim=0)
