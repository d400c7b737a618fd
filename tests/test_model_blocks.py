"""Llama's and Mixtral's block variants against formulas written out here: grouped-query attention
(K/V heads shared by groups of query heads) and SwiGLU FFNs, dense and expert, whole and split
as tensor parallelism splits them; and the parameter count of a public model's shapes."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from moe_core.config.load import load_config
from moe_core.dispatch import routes_dropless
from moe_core.model.experts import Experts
from moe_core.model.layer import MoELayer
from moe_core.model.transformer import CausalSelfAttention, DenseFFN, MoETransformer, shape_only_model
from moe_core.parallel.tensor_parallel import shard_tensor_parallel
from moe_core.schema.sections import ConfigError
from moe_core.sim.compute import ComputeModel
from moe_core.sim.kernels import StepKernels
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology


def _attention_by_hand(x, qkv_weight, qkv_bias, proj, n_heads, n_kv_heads, hd):
    """Causal softmax attention of heads of ``hd`` features, every query head h reading key/value
    head h // (n_heads / n_kv_heads)."""
    B, T, _ = x.shape
    qkv = x @ qkv_weight.T + qkv_bias
    q_width, kv_width = n_heads * hd, n_kv_heads * hd
    q = qkv[..., :q_width].view(B, T, n_heads, hd)
    k = qkv[..., q_width : q_width + kv_width].view(B, T, n_kv_heads, hd)
    v = qkv[..., q_width + kv_width :].view(B, T, n_kv_heads, hd)
    group = n_heads // n_kv_heads
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    heads = []
    for h in range(n_heads):
        scores = q[:, :, h] @ k[:, :, h // group].transpose(1, 2) / hd**0.5
        heads.append(scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v[:, :, h // group])
    return proj(torch.cat(heads, dim=-1))


@pytest.mark.parametrize(("n_kv_heads", "hd"), [(1, 8), (2, 8), (4, 8), (2, 16)])
def test_grouped_query_attention_equals_the_formula(n_kv_heads, hd):
    """4 query heads on d_model 32: of d_model / n_heads = 8 features (GPT, Llama) or 16 (Qwen3's wider heads)."""
    torch.manual_seed(0)
    attn = CausalSelfAttention(d_model=32, n_heads=4, n_kv_heads=n_kv_heads, head_dim=hd).double()
    assert attn.qkv.out_features == (4 + 2 * n_kv_heads) * hd and attn.proj.in_features == 4 * hd
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    expected = _attention_by_hand(x, attn.qkv.weight, attn.qkv.bias, attn.proj, 4, n_kv_heads, hd)
    torch.testing.assert_close(attn(x), expected, rtol=1e-12, atol=1e-12)


def test_swiglu_ffn_equals_the_formula():
    torch.manual_seed(0)
    ffn = DenseFFN(d_model=8, d_ff=6, activation="swiglu").double()
    x = torch.randn(3, 8, dtype=torch.float64)
    w, b = ffn.w_in.weight, ffn.w_in.bias
    gate, up = x @ w[:6].T + b[:6], x @ w[6:].T + b[6:]
    expected = ffn.w_out(gate * torch.sigmoid(gate) * up)
    torch.testing.assert_close(ffn(x)[0], expected, rtol=1e-12, atol=1e-12)


def test_swiglu_experts_batched_ragged_and_split_agree_with_the_formula():
    torch.manual_seed(0)
    experts = Experts(num_experts=3, d_model=8, d_ff=8, activation="swiglu")  # float32: grouped_mm
    x = torch.randn(3, 4, 8)  # 4 rows per expert
    w_in, w_out = experts.w_in, experts.w_out
    expected = torch.stack([(F.silu(x[e] @ w_in[e, :, :8]) * (x[e] @ w_in[e, :, 8:])) @ w_out[e] for e in range(3)])
    torch.testing.assert_close(experts(x), expected, rtol=1e-5, atol=1e-6)
    ragged = experts.forward_ragged(x.reshape(12, 8), [4, 4, 4]).view(3, 4, 8)
    torch.testing.assert_close(ragged, expected, rtol=1e-5, atol=1e-6)
    halves = []  # expert tensor parallelism over 2 ranks: each keeps 4 units of gate and of up
    for first in (0, 4):
        part = Experts(num_experts=3, d_model=8, d_ff=8, activation="swiglu")
        part.load_state_dict(experts.state_dict())
        part.keep_hidden(first, 4)
        assert part.w_in.shape == (3, 8, 8) and part.w_out.shape == (3, 4, 8)
        halves.append(part(x))
    torch.testing.assert_close(halves[0] + halves[1], expected, rtol=1e-5, atol=1e-6)


def test_tensor_parallel_shards_keep_each_ranks_heads_and_units():
    """Rank i of 2 keeps query heads 2i, 2i+1 and key/value head i, and units [3i, 3i+3) of gate and up."""
    dims = ["model.d_model=32", "model.n_heads=4", "model.n_kv_heads=2", "model.d_ff=6", "model.moe_every=0"]
    cfg = load_config(overrides=[*dims, "model.ffn_activation=swiglu", "model.n_layers=1"], whole_run=False)
    whole = MoETransformer(cfg, dropless=routes_dropless(cfg))
    qkv, w_in = whole.blocks[0].attn.qkv.weight, whole.blocks[0].ffn.w_in.weight
    for rank in (0, 1):
        part = copy.deepcopy(whole)
        shard_tensor_parallel(part, rank, 2, group=None)
        q, k, v = (
            range(16 * rank, 16 * rank + 16),
            range(32 + 8 * rank, 40 + 8 * rank),
            range(48 + 8 * rank, 56 + 8 * rank),
        )
        assert torch.equal(part.blocks[0].attn.qkv.weight, qkv[[*q, *k, *v]])
        gate, up = range(3 * rank, 3 * rank + 3), range(6 + 3 * rank, 9 + 3 * rank)
        assert torch.equal(part.blocks[0].ffn.w_in.weight, w_in[[*gate, *up]])
        assert part.blocks[0].ffn.w_out.weight.shape == (32, 3)


def test_llama3_8b_shapes_give_its_published_parameter_count():
    """Meta's Llama 3 8B: 8,030,261,248 parameters (32 layers, d 4096, 32 query and 8 key/value heads,
    SwiGLU of 14336, vocabulary 128256, untied head). Its weight matrices are ours; our model adds
    biases, LayerNorm shifts and learned positions, which are left out here."""
    dims = ["model.d_model=4096", "model.n_layers=32", "model.n_heads=32", "model.n_kv_heads=8"]
    dims += ["model.d_ff=14336", "model.ffn_activation=swiglu", "model.vocab_size=128256", "model.moe_every=0"]
    model = shape_only_model(load_config(overrides=[*dims, "model.seq_len=8192"], whole_run=False))
    weights = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "pos_emb" not in n)
    rms_norm_scales = (2 * 32 + 1) * 4096
    assert weights + rms_norm_scales == 8_030_261_248


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["model.n_kv_heads=3"], "model.n_kv_heads"),
        (["model.ffn_activation=gelu"], "model.ffn_activation"),
        (["model.n_kv_heads=2", "parallel.tensor_parallel=4", "model.n_heads=4"], "parallel.tensor_parallel"),
        (["model.ffn_activation=swiglu", "parallel.grid.row=2", "moe.num_experts=2"], "model.ffn_activation"),
    ],
)
def test_bad_block_settings_name_their_key(overrides, key):
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        load_config(overrides=overrides, whole_run=False)


def test_the_simulated_step_prices_the_gemms_of_llama_blocks(monkeypatch):
    """The step simulator's compute ops with every GEMM priced at its FLOPs and nothing else priced:
    their sum is the step's FLOPs, forward 2 x tokens x (Q, K and V of the key/value heads, output,
    gate + up + down of SwiGLU, head) plus the attention core, backward twice the forward (the
    formula of Narayanan et al. SC'21, with GQA's, Qwen3's head and SwiGLU's widths)."""
    monkeypatch.setattr(ComputeModel, "gemm", lambda self, m, n, k, count=1: 2 * m * n * k * count)
    for free in ("memory_bound", "copy", "optimizer"):
        monkeypatch.setattr(ComputeModel, free, lambda self, *args, **kwargs: 0.0)
    monkeypatch.setattr(StepKernels, "priced", lambda self, seconds, phase: seconds)
    dims = ["model.d_model=512", "model.n_heads=8", "model.n_kv_heads=2", "model.d_ff=1024", "model.n_layers=2"]
    dims += ["model.ffn_activation=swiglu", "model.moe_every=0", "model.vocab_size=1000", "model.seq_len=128"]
    dims += ["model.head_dim=128"]  # Qwen3's heads: 8 x 128 = 1024 query features on d_model 512
    cfg = load_config(overrides=[*dims, "hardware_profile=dgx-a100-80gb-hdr", "train.batch_size=4"], whole_run=False)
    ops, _ = StepModel(cfg, build_topology(cfg.hardware)).build()
    tokens, M, q, kv, H, V, S = 4 * 128, 512, 8 * 128, 2 * 128, 1024, 1000, 128
    per_layer = 2 * tokens * (M * (q + 2 * kv) + q * M + 3 * M * H) + 2 * 2 * tokens * S * q
    assert sum(op.duration_s for op in ops) == pytest.approx(3 * (2 * per_layer + 2 * tokens * M * V), rel=1e-12)


# GShard's einsum permutation (moe.permute=einsum) on 2 groups of 32 tokens, 4 experts of capacity 20
# (ceil(1.25 x 2 x 32 / 4)), d_model 64: per MoE layer forward the dispatch (E C x S) @ (S x M) and the
# combine (S x E C) @ (E C x M), backward the combine's two gradients and the dispatch's one.
EINSUM = dict(groups=2, group=32, slots=4 * 20, d_model=64)
EINSUM_GEMM_FLOPS = 5 * 2 * EINSUM["groups"] * EINSUM["group"] * EINSUM["slots"] * EINSUM["d_model"]


def test_the_einsum_permutation_runs_five_slot_gemms_a_layer():
    """Measured: torch's FLOP counter over one MoE layer's forward and backward; the einsum path runs
    the index path's GEMMs plus exactly the five slot GEMMs."""
    flops = {}
    for permute in ("index", "einsum"):
        torch.manual_seed(0)
        layer = MoELayer(
            d_model=EINSUM["d_model"],
            d_ff=128,
            num_experts=4,
            top_k=2,
            capacity_factor=1.25,
            min_capacity=4,
            group_size=EINSUM["group"],
            second_expert_policy="always",
            dropless=False,
            aux_loss_scale="e2",
            permute=permute,
            layer_id=0,
            seed=0,
        )
        x = torch.randn(2, EINSUM["group"], EINSUM["d_model"], requires_grad=True)
        with FlopCounterMode(display=False) as counter:
            y, aux = layer(x)
            (y.sum() + aux).backward()
        flops[permute] = counter.get_total_flops()
    assert flops["einsum"] - flops["index"] == EINSUM_GEMM_FLOPS


def test_the_simulated_step_prices_the_einsum_permutation_s_gemms(monkeypatch):
    """Simulated: with every GEMM priced at its FLOPs and nothing else priced, a step under
    moe.permute=einsum costs the index step plus the five slot GEMMs in each MoE layer, the counts
    the measured layer runs (above)."""
    monkeypatch.setattr(ComputeModel, "gemm", lambda self, m, n, k, count=1: 2 * m * n * k * count)
    for free in ("memory_bound", "copy", "optimizer"):
        monkeypatch.setattr(ComputeModel, free, lambda self, *args, **kwargs: 0.0)
    monkeypatch.setattr(StepKernels, "priced", lambda self, seconds, phase: seconds)
    dims = [f"model.d_model={EINSUM['d_model']}", "model.n_heads=4", "model.d_ff=128", "model.n_layers=2"]
    dims += ["model.moe_every=1", "model.seq_len=32", "train.batch_size=2", "moe.num_experts=4", "moe.top_k=2"]
    dims += [f"moe.group_size={EINSUM['group']}", "moe.capacity_factor=1.25", "moe.dispatcher=capacity"]
    total = {}
    for permute in ("index", "einsum"):
        overrides = [*dims, "hardware_profile=dgx-a100-80gb-hdr", f"moe.permute={permute}"]
        cfg = load_config(overrides=overrides, whole_run=False)
        ops, _ = StepModel(cfg, build_topology(cfg.hardware)).build()
        total[permute] = sum(op.duration_s for op in ops if op.phase in ("copy", "dense", "gate", "expert"))
    assert total["einsum"] - total["index"] == pytest.approx(2 * EINSUM_GEMM_FLOPS, rel=1e-12)  # 2 MoE layers


def test_the_einsum_permutation_is_refused_with_a_dropless_dispatcher():
    with pytest.raises(ConfigError, match="config key 'moe.permute'.*moe.dispatcher=dropless"):
        load_config(overrides=["moe.permute=einsum", "moe.dispatcher=dropless"], whole_run=False)
