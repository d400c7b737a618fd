"""A small decoder-only transformer whose every ``moe_every``-th FFN is an MoE layer (GShard Fig 3).

The model is single-device code: expert parallelism is applied from outside (moe_core.parallel),
so the same module is the single-process reference in tests.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from omegaconf import DictConfig
from torch.overrides import TorchFunctionMode

from .capacity import moe_blocks
from .grid_parallel import GridGroups, grid_linears, shard_grid
from .layer import MoELayer
from .layout import Layout
from .parallel import is_expert_param
from .plan import GradientTensor
from .tensor_parallel import shard_tensor_parallel


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.head_dim = d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # nh: the heads this module computes (all of them, or a tensor-parallel rank's share)
        q, k, v = self.qkv(x).chunk(3, dim=2)  # (B, T, nh * hs) each
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class DenseFFN(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_in = nn.Linear(d_model, d_ff)
        self.w_out = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.w_out(torch.relu(self.w_in(x))), x.new_zeros(())


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, ffn: nn.Module):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ffn = ffn

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.attn(self.ln1(x))
        h, aux = self.ffn(self.ln2(x))
        return x + h, aux  # tokens an MoE layer dropped keep x through this residual


class MoETransformer(nn.Module):
    def __init__(self, cfg: DictConfig):
        """Build from the full config (model, moe, train.seed). Weights depend only on the global RNG state."""
        super().__init__()
        m, moe = cfg.model, cfg.moe
        self.aux_loss_weight = moe.aux_loss_weight
        self.tok_emb = nn.Embedding(m.vocab_size, m.d_model)
        self.pos_emb = nn.Embedding(m.seq_len, m.d_model)
        blocks = []
        moe_indices = set(moe_blocks(m.n_layers, m.moe_every))
        for i in range(m.n_layers):
            if i in moe_indices:
                ffn = MoELayer(
                    d_model=m.d_model,
                    d_ff=m.d_ff,
                    num_experts=moe.num_experts,
                    top_k=moe.top_k,
                    capacity_factor=moe.capacity_factor,
                    min_capacity=moe.min_capacity,
                    group_size=moe.group_size,
                    second_expert_policy=moe.second_expert_policy,
                    dropless=moe.dropless,
                    aux_loss_scale=moe.aux_loss_scale,
                    layer_id=i,
                    seed=cfg.train.seed,
                )
            else:
                ffn = DenseFFN(m.d_model, m.d_ff)
            blocks.append(Block(m.d_model, m.n_heads, ffn))
        self.blocks = nn.ModuleList(blocks)
        self.ln_f = nn.LayerNorm(m.d_model)
        self.head = nn.Linear(m.d_model, m.vocab_size, bias=False)

    def moe_layers(self) -> list[MoELayer]:
        return [b.ffn for b in self.blocks if isinstance(b.ffn, MoELayer)]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """idx, targets: (B, T) token ids. Returns (loss = nll + k * sum of aux losses, nll)."""
        B, T = idx.shape
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(T, device=idx.device))  # (B, T, M)
        aux_total = x.new_zeros(())
        for block in self.blocks:
            x, aux = block(x)
            aux_total = aux_total + aux
        logits = self.head(self.ln_f(x))  # (B, T, V)
        nll = F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(B * T))
        return nll + self.aux_loss_weight * aux_total, nll


class _SkipInitialisers(TorchFunctionMode):
    """Makes every ``torch.nn.init`` function a no-op: parameters keep their (meta) storage untouched."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def shape_only_model(cfg: DictConfig) -> MoETransformer:
    """The model on the meta device, uninitialised: its parameters' names and shapes at any size, no memory.

    The simulator reads gradient sizes from it. Initialisers are skipped because a meta-device
    ``normal_`` lazily imports torch._dynamo, which costs seconds per simulated point.
    """
    with torch.device("meta"), _SkipInitialisers():
        return MoETransformer(cfg)


def backward_ordered_params(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Named parameters in the order backward produces their gradients (reverse definition order)."""
    return list(reversed(list(model.named_parameters())))


def gradient_tensors(cfg: DictConfig, layout: Layout) -> list[GradientTensor]:
    """One rank's gradient tensors under ``layout``, in backward order, from the model's shapes
    (meta device, split over "tp" or the grid as moe_core.tensor_parallel and moe_core.grid_parallel
    split it): dense tensors whole or their tensor-parallel shard, a grid's weights their depth shard,
    expert tensors the rank's share of the expert stack. What a communication plan is decided from
    (moe_core.policies.build_plan), in both executors."""
    share = layout.experts_per_rank / cfg.moe.num_experts
    model = shape_only_model(cfg)
    shard_tensor_parallel(model, 0, layout.tensor_parallel, group=None)
    no_groups = dict.fromkeys(("depth", "row", "col"))
    shard_grid(model, GridGroups(layout.grid, dict.fromkeys(no_groups, 0), no_groups))
    depth_sharded = {id(layer.weight) for layer in grid_linears(model)}
    tensors = []
    for name, p in backward_ordered_params(model):
        if is_expert_param(name):
            tensors.append(GradientTensor(name, round(p.numel() * share), "expert"))
        else:
            tensors.append(GradientTensor(name, p.numel(), "data" if id(p) in depth_sharded else "dense"))
    return tensors
