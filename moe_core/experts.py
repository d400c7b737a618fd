"""FFN experts, FFN_e(x) = wo_e . ReLU(wi_e . x) (GShard), stored as stacked weights for batched GEMMs."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Experts(nn.Module):
    """A stack of ``num_experts`` FFN experts (all of them, or a rank's slice after :meth:`keep`)."""

    def __init__(self, num_experts: int, d_model: int, d_ff: int):
        super().__init__()
        self.w_in = nn.Parameter(
            nn.init.normal_(torch.empty(num_experts, d_model, d_ff), std=d_model**-0.5)
        )  # (E, M, H)
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
        parallelism (w_in's columns, w_out's rows); the partial outputs are summed over "tp"."""
        self.w_in = nn.Parameter(self.w_in.detach()[:, :, first : first + count].clone())
        self.w_out = nn.Parameter(self.w_out.detach()[:, first : first + count].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Equal token counts per expert (capacity mode): (e, n, M) -> (e, n, M), one batched GEMM pair."""
        return torch.bmm(torch.relu(torch.bmm(x, self.w_in)), self.w_out)

    def forward_ragged(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Tokens sorted by expert with ``counts[e]`` rows each (dropless mode): (n, M) -> (n, M).

        One grouped GEMM pair (``torch.nn.functional.grouped_mm``) where torch offers it for this
        device and dtype (CPU; bf16 on CUDA), else a per-expert loop. Either way an expert with zero
        rows still takes part in autograd (its gradient is zero), so gradient buckets stay complete.
        """
        w_in, w_out = self.w_in.to(x.dtype), self.w_out.to(x.dtype)
        if hasattr(F, "grouped_mm") and (x.device.type == "cpu" or x.dtype == torch.bfloat16):
            offs = torch.tensor(counts, device=x.device).cumsum(0).to(torch.int32)
            return F.grouped_mm(torch.relu(F.grouped_mm(x, w_in, offs=offs)), w_out, offs=offs)
        outs = [torch.relu(chunk @ w_in[e]) @ w_out[e] for e, chunk in enumerate(torch.split(x, counts, dim=0))]
        return torch.cat(outs, dim=0)
