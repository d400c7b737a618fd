"""Whole experts under tensor parallelism (moe.expert_tensor_parallel=1, Megatron's ETP 1 with
sequence parallelism) against DeepSpeed's split experts (0, the default): who routes which tokens,
over which ranks, with which weights, and what the measured executor refuses."""

import numpy as np
import pytest

from moe_core.config.load import ConfigError, load_config
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology

# 2 nodes x 8 H100, tensor parallelism 2, 8 experts over 8 ranks, top-2, dropless or capacity 1
MIXTRAL_LIKE = [
    "hardware_profile=h100-ndr-cluster",
    "hardware.nodes=2",
    "parallel.world_size=16",
    "parallel.tensor_parallel=2",
    "moe.num_experts=8",
    "moe.experts_per_rank=1",
    "moe.top_k=2",
    "moe.capacity_factor=1.0",
    "moe.min_capacity=0",
    "model.moe_every=1",
    "model.n_layers=2",
    "model.d_model=512",
    "model.d_ff=1024",
    "model.n_heads=8",
    "model.seq_len=256",
    "train.batch_size=4",
    "train.dtype=bfloat16",
]


def model(*overrides: str) -> StepModel:
    cfg = load_config(overrides=[*MIXTRAL_LIKE, *overrides], whole_run=False)
    return StepModel(cfg, build_topology(cfg.hardware))


def test_whole_experts_route_each_ranks_share_over_ranks_of_their_own():
    whole, split = model("moe.expert_tensor_parallel=1"), model()
    # expert parallelism over consecutive ranks (Megatron's order with ETP 1), not strided by "tp"
    assert whole.ep_groups.tolist() == [list(range(8)), list(range(8, 16))]
    assert split.ep_groups.tolist() == [list(range(0, 16, 2)), list(range(1, 16, 2))]
    # each "tp" rank routes its half of the group's 1024 tokens: half the rows, whole hidden units
    (rows_whole, bytes_whole), (rows_split, bytes_split) = whole.moe_sizes(), split.moe_sizes()
    assert rows_whole * 2 == rows_split and bytes_whole * 2 == bytes_split
    assert rows_whole == 1.0 * 2 * 4 * 256 // 2  # capacity 1: top_k x tokens / 2 per rank, all experts
    for pass_ in ("fwd", "bwd"):  # the same expert FLOPs a rank: half the rows at twice the width
        expected = split.kernels.expert_ffn_seconds(pass_, rows_split / 2, 1, 1024)
        assert whole.expert_seconds(rows_whole, pass_) == pytest.approx(expected)
    ops = {op.name for op in whole.build()[0]}
    assert not any("expert_allreduce" in name or "ag0" in name for name in ops)  # nothing to sum or gather


def test_whole_experts_hold_whole_weights_and_reduce_them_over_their_replicas():
    whole, split = model("moe.expert_tensor_parallel=1"), model()
    expert = {t.name: t.numel for t in whole.plan.tensors if t.group == "expert"}
    assert expert and expert == {n: 2 * t for n, t in ((t.name, t.numel) for t in split.plan.tensors) if n in expert}
    # 16 ranks over 8 experts: each expert on 2 ranks (Megatron's expert data parallelism)
    assert whole.gradient_groups("expert").shape == (8, 2)
    np.testing.assert_array_equal(whole.gradient_groups("dense"), split.gradient_groups("dense"))


def test_whole_experts_may_be_dropless_and_are_refused_for_measured_runs():
    assert model("moe.expert_tensor_parallel=1", "moe.dispatcher=dropless").moe_sizes()[0] == 2 * 4 * 256 // 2
    with pytest.raises(ConfigError, match="moe.dispatcher': experts are split over"):
        model("moe.dispatcher=dropless")  # split experts dispatch capacity buffers
    with pytest.raises(
        ConfigError,
        match="config key 'moe.expert_tensor_parallel': whole experts under tensor parallelism are simulated",
    ):
        load_config(overrides=[*MIXTRAL_LIKE, "moe.expert_tensor_parallel=1"])
    with pytest.raises(ConfigError, match="config key 'moe.expert_tensor_parallel'"):
        load_config(overrides=[*MIXTRAL_LIKE, "moe.expert_tensor_parallel=4"], whole_run=False)
