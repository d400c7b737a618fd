"""Pipeline parallelism in the simulator (moe_core.sim.pipeline): stages simulated by StepModel, composed by 1F1B."""

import numpy as np
import pytest

from moe_core.config.load import ConfigError, load_config, pipeline_chunk_blocks
from moe_core.sim.pipeline import (
    PipelineModel,
    activation_bytes,
    boundary_seconds,
    pipeline_stages,
    pipeline_time_s,
    simulate_step,
    stage_config,
)
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology

# 4 nodes x 8 H200, 8 experts top-4 in every block, bfloat16: stages of 16 ranks fill two nodes each
H200 = [
    "hardware_profile=h200-ndr-cluster",
    "hardware.nodes=4",
    "parallel.world_size=32",
    "moe.num_experts=8",
    "moe.top_k=4",
    "model.moe_every=1",
    "model.n_layers=8",
    "model.d_model=512",
    "model.d_ff=2048",
    "model.n_heads=8",
    "model.seq_len=256",
    "model.vocab_size=4096",
    "train.batch_size=8",
    "train.dtype=bfloat16",
]
# every link as good as free: no latency, a million times the bandwidth
FREE_LINKS = [
    "hardware.intra_node_GBps=1e9",
    "hardware.nic_GBps=1e9",
    "hardware.intra_node_latency_us=0",
    "hardware.inter_node_latency_us=0",
    "hardware.all_to_all_curve=''",
]


def config(*overrides: str, whole_run: bool = False):
    return load_config(overrides=[*H200, *overrides], whole_run=whole_run)


def pipelined(pp: int, micro_batches: int, virtual: int = 1, *extra: str):
    return config(
        f"parallel.pipeline_parallel={pp}",
        f"parallel.virtual_pipeline={virtual}",
        f"train.micro_batches={micro_batches}",
        *extra,
    )


def test_one_stage_is_the_step_model_exactly():
    cfg = config("train.micro_batches=1")
    topo = build_topology(cfg.hardware)
    assert simulate_step(cfg, topo) == StepModel(cfg, topo).run().metrics()


def test_a_pipelined_config_is_not_a_step_model():
    cfg = pipelined(2, 4)
    with pytest.raises(ValueError, match="simulate_step"):
        StepModel(cfg, build_topology(cfg.hardware))


def test_stages_split_ranks_and_layers_and_hold_embedding_and_head():
    cfg = pipelined(4, 4)
    stages = pipeline_stages(cfg)
    assert [s.ranks.tolist() for s in stages] == [list(range(8 * s, 8 * s + 8)) for s in range(4)]
    assert [(s.embedding, s.head) for s in stages] == [(True, False), (False, False), (False, False), (False, True)]
    stage = stage_config(cfg, stages[0])
    assert (stage.parallel.world_size, stage.model.n_layers, stage.train.batch_size) == (8, 2, 2)
    assert (stage.parallel.pipeline_parallel, stage.train.micro_batches) == (1, 1)
    topo = build_topology(cfg.hardware)
    for embedding, head in ((True, False), (False, False), (False, True)):
        model = StepModel(stage, topo, embedding, head)
        names = {op.name for op in model.build()[0]}
        assert ("embed.fwd" in names, "embed.bwd" in names, "head.fwd_bwd" in names) == (embedding, embedding, head)
        held = {t.name.split(".")[0] for t in model.plan.tensors}
        assert ("tok_emb" in held, "pos_emb" in held) == (embedding, embedding)
        assert ("head" in held, "ln_f" in held) == (head, head)
        assert {"blocks"} <= held


def test_stage_times_are_their_step_models_and_the_bubble_is_pp_minus_1_over_m():
    """Free links: the step is (m + pp - 1) slots of the slowest stage's simulated forward and
    backward, then its tail; the bubble (pp - 1) / m of the ideal time."""
    pp, m = 4, 8
    cfg = pipelined(pp, m, 1, *FREE_LINKS)
    topo = build_topology(cfg.hardware)
    stage, fwd_bwd, tails = stage_config(cfg, pipeline_stages(cfg)[0]), [], []
    for parts in ((True, False), (False, False), (False, True)):
        sim = StepModel(stage, topo, *parts).run()
        fwd_bwd.append(float(sim.timeline.end_s[sim.backward_end]) * 1e3)
        tails.append(sim.timeline.makespan_s * 1e3 - fwd_bwd[-1])
    metrics = simulate_step(cfg, topo)
    assert metrics["stage_fwd_bwd_ms"] == pytest.approx(max(fwd_bwd))
    assert metrics["p2p_ms"] < 1e-4 * metrics["step_ms"]
    assert metrics["exposed_comm_ms"] < 1e-3 * metrics["step_ms"]  # all-to-alls and gradient sync as free
    assert metrics["bubble_ms"] / (m * max(fwd_bwd)) == pytest.approx((pp - 1) / m)
    assert metrics["step_ms"] == pytest.approx((m + pp - 1) * max(fwd_bwd) + max(tails), rel=1e-4)


def test_megatrons_split_counts_the_embedding_and_the_loss_as_blocks():
    """Qwen3-235B's layout in small: 6 blocks + embedding + loss over 2 stages x 2 chunks of 2: chunk 0
    (stage 0) and chunk 3 (stage 1) hold one block each, so each stage holds 3; the stages are
    simulated with their blocks, and the split is named when it cannot be even."""
    cfg = pipelined(2, 4, 2, "model.n_layers=6", "model.moe_every=1", "parallel.pipeline_split=embedding_and_loss")
    assert pipeline_chunk_blocks(cfg) == [1, 2, 2, 1]
    stages = pipeline_stages(cfg)
    assert [(s.blocks, s.embedding, s.head) for s in stages] == [(3, True, False), (3, False, True)]
    assert stage_config(cfg, stages[1]).model.n_layers == 3
    plain = pipelined(2, 4, 2, "model.n_layers=4", "model.moe_every=1")
    assert [s.blocks for s in pipeline_stages(plain)] == [2, 2] and pipeline_chunk_blocks(plain) == [1, 1, 1, 1]
    split = simulate_step(cfg, build_topology(cfg.hardware))["stage_fwd_bwd_ms"]
    assert split > simulate_step(plain, build_topology(plain.hardware))["stage_fwd_bwd_ms"]  # 3 blocks a stage, not 2
    with pytest.raises(ConfigError, match="with the embedding and the loss counted as blocks"):
        pipelined(2, 4, 2, "model.n_layers=8", "parallel.pipeline_split=embedding_and_loss")


def test_interleaving_divides_the_bubble_and_multiplies_the_transfers():
    pp, m, v = 2, 4, 2
    plain, interleaved = (simulate_step(c, build_topology(c.hardware)) for c in (pipelined(pp, m), pipelined(pp, m, v)))
    assert interleaved["stage_fwd_bwd_ms"] == pytest.approx(plain["stage_fwd_bwd_ms"])  # the stage's blocks alike
    assert interleaved["bubble_ms"] == pytest.approx(plain["bubble_ms"] / v)
    # v boundaries a micro-batch, over m + (pp - 1) / v slots (the last stage feeds the first: same links here)
    ratio = v * (m + (pp - 1) / v) / (m + pp - 1)
    assert interleaved["p2p_ms"] == pytest.approx(plain["p2p_ms"] * ratio)
    assert interleaved["step_ms"] < plain["step_ms"]


def test_p2p_bytes_and_time_by_hand():
    """Stage 0 (node 0) sends to stage 1 (node 1), rank to rank, each over its own NDR NIC."""
    cfg = pipelined(4, 4)
    stages, topo = pipeline_stages(cfg), build_topology(cfg.hardware)
    nbytes = 8 // 4 * 256 * 512 * 2  # sequences of a micro-batch x seq_len x d_model x bfloat16
    assert activation_bytes(cfg) == nbytes
    by_hand = 3e-6 + nbytes / (50e9 * 0.97)  # inter-node latency + bytes at NDR's achieved rate
    assert boundary_seconds(cfg, topo, stages[0], stages[1]) == pytest.approx(by_hand)
    assert PipelineModel(cfg, topo).p2p_seconds() == pytest.approx(2 * by_hand)  # forward and backward
    metrics = simulate_step(cfg, topo)
    assert metrics["p2p_micro_batch_ms"] == pytest.approx(2e3 * by_hand)
    assert metrics["p2p_ms"] == pytest.approx((4 + 3) * 2e3 * by_hand)  # in each of m + pp - 1 slots
    assert metrics["exposed_comm_ms"] > metrics["p2p_ms"]  # and the all-to-alls of every micro-batch


def test_fewer_micro_batches_than_stages_run_with_a_large_bubble():
    metrics = simulate_step(cfg := pipelined(4, 2), build_topology(cfg.hardware))
    assert metrics["bubble_ms"] == pytest.approx(3 / 2 * 2 * metrics["stage_fwd_bwd_ms"])
    assert metrics["bubble_share"] > 0.5


def test_pipeline_time_interleaved_and_plain():
    assert pipeline_time_s(1.0, 8, 4, 0.0) == pytest.approx(11.0)
    assert pipeline_time_s(1.0, 8, 4, 0.0, virtual=3) == pytest.approx(9.0)
    assert pipeline_time_s(1.0, 8, 4, 0.1, virtual=2) == pytest.approx((8 + 1.5) * 1.2)
    with pytest.raises(ValueError, match="virtual"):
        pipeline_time_s(1.0, 8, 4, 0.0, virtual=0)


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["parallel.pipeline_parallel=3"], "parallel.pipeline_parallel"),  # 8 layers (and 32 ranks)
        (["parallel.pipeline_parallel=16", "model.n_layers=16"], "parallel.pipeline_parallel"),  # 2 ranks: 8 experts
        (["parallel.pipeline_parallel=8", "parallel.world_size=20"], "parallel.pipeline_parallel"),  # 20 ranks
        (["parallel.pipeline_parallel=2", "parallel.virtual_pipeline=8"], "parallel.virtual_pipeline"),
        (["parallel.virtual_pipeline=2"], "parallel.virtual_pipeline"),  # no stages to interleave
        (
            ["parallel.pipeline_parallel=2", "parallel.virtual_pipeline=2", "train.micro_batches=1"],
            "train.micro_batches",
        ),
        (["train.micro_batches=3"], "train.micro_batches"),
        (["train.micro_batches=0"], "train.micro_batches"),
        (["parallel.pipeline_parallel=0"], "parallel.pipeline_parallel"),
        (["parallel.pipeline_parallel=4", "model.moe_every=4"], "model.moe_every"),  # stages of 2 blocks
        (["train.micro_batches=8", "moe.group_size=512"], "moe.group_size"),  # a micro-batch holds 256 tokens
    ],
)
def test_bad_pipelines_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        config(*overrides)


def test_stages_placed_unlike_are_refused():
    """3 nodes in 2 stages of 12 ranks: the first fills a node and a half, the second the other way."""
    cfg = config(
        "hardware.nodes=3",
        "parallel.world_size=24",
        "moe.num_experts=4",
        "parallel.pipeline_parallel=2",
        "train.micro_batches=2",
    )
    with pytest.raises(ConfigError, match="placed unlike stage 0"):
        simulate_step(cfg, build_topology(cfg.hardware))


def test_a_measured_run_refuses_pipelines():
    """A run's own config is its measured executor's (and its sweep points'); a simulated config derived
    without the run's checks (a priced entry's, say) may pipeline."""
    overrides = ["parallel.pipeline_parallel=2", "train.micro_batches=2", "moe.experts_per_rank=2"]
    with pytest.raises(ConfigError, match="config key 'parallel.pipeline_parallel': is simulated only"):
        load_config(overrides=overrides)
    assert load_config(overrides=overrides, whole_run=False).parallel.pipeline_parallel == 2


def test_stage_metrics_are_maxima_over_stages():
    cfg = pipelined(2, 4)
    topo = build_topology(cfg.hardware)
    per_stage = [sim.metrics() for sim in PipelineModel(cfg, topo).stage_simulations()]
    metrics = simulate_step(cfg, topo)
    assert metrics["stage_max_step_ms"] == max(s["step_ms"] for s in per_stage)
    assert np.isclose(metrics["stage_max_a2a_ms"], max(s["a2a_ms"] for s in per_stage))
