"""Lina's pure decisions: micro-op partitioning, the packing rule and when it is applied."""

import pandas as pd
import pytest

import analysis.papers  # noqa: F401  (registers the reproducers)
from analysis.registry import REPRODUCERS
from moe_core.config.load import derive_config, load_config
from moe_core.dispatch.chunks import a2a_micro_ops, chunk_count
from moe_core.papers.lina.decisions import packing_due, packing_factor
from moe_core.parallel.layout import layout_of
from moe_core.schedule.gradients import gradient_tensors
from moe_core.schedule.plan import gradient_micro_ops


def test_gradient_micro_ops_cut_each_tensor_into_equal_chunks_never_fused():
    numels = [10, 3, 0, 8]
    ops = gradient_micro_ops(numels, element_bytes=4, micro_op_bytes=16)  # at most 4 elements per op
    for i, n in enumerate(numels):  # every element of every tensor exactly once, in order
        mine = [(a, b) for t, a, b in ops if t == i]
        assert [x for a, b in mine for x in range(a, b)] == list(range(n))
        assert all((b - a) * 4 <= 16 for a, b in mine)
        lengths = [b - a for a, b in mine]
        assert len(set(lengths[:-1])) <= 1 and (not lengths or lengths[-1] <= lengths[0])
    assert [t for t, _, _ in ops] == sorted(t for t, _, _ in ops)  # tensor by tensor, no fusion
    assert gradient_micro_ops([100], 4, 30 * 2**20) == [(0, 0, 100)]  # small tensors stay whole


def test_a2a_micro_ops_split_the_token_dimension():
    ops = a2a_micro_ops(10, row_bytes=100, micro_op_bytes=300)  # 1000 bytes: 4 near-equal micro-ops
    assert len(ops) == 4 and ops[0][0] == 0 and ops[-1][1] == 10
    assert all(a < b and (b - a) * 100 <= 300 for a, b in ops) and all(x[1] == y[0] for x, y in zip(ops, ops[1:]))
    assert a2a_micro_ops(3, row_bytes=10**9, micro_op_bytes=1) == [(0, 1), (1, 2), (2, 3)]  # at most a row each
    assert a2a_micro_ops(10, row_bytes=1, micro_op_bytes=10**6) == [(0, 10)]


def test_packing_doubles_until_the_ffn_outweighs_the_all_to_all():
    # a2a time halves with every doubling, FFN time is constant: 8 > 12/2 -> packed twice is enough
    assert packing_factor(lambda k: 8.0, lambda k: 24.0 / k, max_factor=16) == 4
    assert packing_factor(lambda k: 100.0, lambda k: 1.0, max_factor=16) == 1  # FFN already dominates
    assert packing_factor(lambda k: 0.0, lambda k: 1.0, max_factor=8) == 8  # never: pack everything


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: chunk_count(10, 0), "micro-op size"),
        (lambda: gradient_micro_ops([-1], 4, 16), "negative"),
        (lambda: packing_factor(lambda k: 1, lambda k: 1, 0), "max packing factor"),
        (lambda: packing_due(5, 3, 0), "packing interval"),
    ],
)
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_packing_is_decided_after_the_warm_up_then_every_interval():
    assert [i for i in range(20) if packing_due(i, warmup_iters=10, interval_iters=4)] == [10, 14, 18]
    assert [i for i in range(9) if packing_due(i, warmup_iters=0, interval_iters=4)] == [4, 8]  # a measured step first


def test_fig13_compares_the_unpacked_layout():
    """Lina's Fig 13 times the same backward all-to-all with and without its scheduling; policy lina
    packs experts onto fewer ranks, which shrinks the exchange itself, so the reproducer reads
    lina-pipeline (every Lina feature but packing)."""
    rows = [
        dict(
            paper="lina",
            experiment="sim_train_step",
            point=policy,
            mode="simulated",
            backend="sim",
            hardware="lina-a100-4x4",
            world_size=8,
            num_experts=8,
            policy=policy,
            partition_mb=30.0,
            metric="a2a_bwd_ms",
            value=value,
        )
        for policy, value in (("overlap", 24.0), ("lina-pipeline", 10.0), ("lina", 0.2))
    ]
    records = pd.DataFrame(rows)
    speedup, setting = REPRODUCERS["lina_fig13_bwd_a2a_speedup_8e"](records, records.iloc[0:0])
    assert speedup == 2.4 and "lina-pipeline" in setting


@pytest.mark.parametrize(("experts", "table1"), [(4, 233e6), (16, 838e6)])
def test_the_simulated_model_has_table1s_parameter_count(experts, table1):
    """Lina's 24-layer Transformer-XL (Table 1: 233M parameters at 4 experts, 838M at 16): our
    attention lacks Transformer-XL's relative-position projection (d_model^2 per layer), so we count
    up to 3% fewer, never more."""
    base = load_config(["configs/default.yaml"])
    cfg = derive_config(base, [*base.lina.overrides, f"moe.num_experts={experts}", f"parallel.world_size={experts}"])
    layout = layout_of(cfg)
    total = sum(t.numel * (layout.expert_parallel if t.group == "expert" else 1) for t in gradient_tensors(cfg, layout))
    assert 0.97 * table1 <= total <= table1
