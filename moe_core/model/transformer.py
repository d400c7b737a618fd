"""A small decoder-only transformer whose every ``moe_every``-th FFN is an MoE layer (GShard Fig 3).

The model is single-device code: expert parallelism is applied from outside (moe_core.parallel.parallelize),
so the same module is the single-process reference in tests.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from omegaconf import DictConfig
from torch.overrides import TorchFunctionMode

from moe_core.model.activation import in_width
from moe_core.model.capacity import moe_blocks
from moe_core.model.experts import ffn_activation
from moe_core.model.heads import head_dim, kv_heads
from moe_core.model.layer import MoELayer


class CausalSelfAttention(nn.Module):
    """Causal self-attention with ``n_kv_heads`` key/value heads shared by groups of the ``n_heads``
    query heads (grouped-query attention, Ainslie et al. 2023; ``n_kv_heads == n_heads`` is
    multi-head attention), Q, K and V from one fused projection, ``head_dim`` features per head
    (d_model / n_heads in GPT and Llama, larger in Qwen3)."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.kv_groups = n_heads // n_kv_heads  # query heads per key/value head
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * head_dim)
        self.proj = nn.Linear(n_heads * head_dim, d_model)

    def qkv_widths(self) -> list[int]:
        """The fused projection's output blocks: Q, K, V features (what tensor parallelism splits each of)."""
        kv = self.qkv.out_features // (self.kv_groups + 2)
        return [self.kv_groups * kv, kv, kv]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        qkv = self.qkv(x)  # all heads, or a tensor-parallel rank's share of the Q and of the K/V heads
        kv = qkv.shape[-1] // (self.kv_groups + 2)
        q, k, v = qkv.split([self.kv_groups * kv, kv, kv], dim=2)  # (B, T, heads * hs) each
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_groups > 1)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class DenseFFN(nn.Module):
    def __init__(self, d_model: int, d_ff: int, activation: str = "relu"):
        super().__init__()
        self.activation = activation
        self.w_in = nn.Linear(d_model, in_width(activation) * d_ff)
        self.w_out = nn.Linear(d_ff, d_model)

    def in_blocks(self) -> list[int]:
        """``w_in``'s output blocks (SwiGLU: gate and up), each split alike by tensor parallelism."""
        return [self.w_out.in_features] * in_width(self.activation)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.w_out(ffn_activation(self.w_in(x), self.activation)), x.new_zeros(())


class Block(nn.Module):
    def __init__(self, d_model: int, attn: CausalSelfAttention, ffn: nn.Module):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = attn
        self.ffn = ffn

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.attn(self.ln1(x))
        h, aux = self.ffn(self.ln2(x))
        return x + h, aux  # tokens an MoE layer dropped keep x through this residual


class MoETransformer(nn.Module):
    def __init__(self, cfg: DictConfig, *, dropless: bool):
        """Build from the full config (model, moe, train.seed). Weights depend only on the global RNG state.

        ``dropless``: its MoE layers route without capacity (uneven all-to-all splits, nothing
        dropped), the decision of the step's token dispatcher (moe_core.dispatch.routes_dropless)."""
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
                    dropless=dropless,
                    gate_host_sync=moe.gate_host_sync,
                    permute=moe.permute,
                    activation=m.ffn_activation,
                    aux_loss_scale=moe.aux_loss_scale,
                    layer_id=i,
                    seed=cfg.train.seed,
                )
            else:
                ffn = DenseFFN(m.d_model, m.d_ff, m.ffn_activation)
            attn = CausalSelfAttention(m.d_model, m.n_heads, kv_heads(m), head_dim(m))
            blocks.append(Block(m.d_model, attn, ffn))
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
        return MoETransformer(cfg, dropless=False)  # the same parameters either way


def backward_ordered_params(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Named parameters in the order backward produces their gradients (reverse definition order)."""
    return list(reversed(list(model.named_parameters())))
