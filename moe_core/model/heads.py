"""Attention heads: how many key/value heads and how many features per head a model's config
asks for, its zeros meaning the defaults. Torch-free, so config checks (moe_core.schema.run_checks),
the simulator's kernels and the model (moe_core.model.transformer) read one definition."""

from __future__ import annotations

from omegaconf import DictConfig


def kv_heads(model: DictConfig) -> int:
    """Key/value heads: ``model.n_kv_heads``, or n_heads (multi-head attention) when it is 0."""
    return model.n_kv_heads or model.n_heads


def head_dim(model: DictConfig) -> int:
    """Features per attention head: ``model.head_dim``, or d_model / n_heads when it is 0."""
    return model.head_dim or model.d_model // model.n_heads
