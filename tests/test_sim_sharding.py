"""Sharded data parallelism (parallel.data_sharding) and gradient accumulation (train.micro_batches)
in the simulated training step, and their refusal by the measured executor."""

import pytest

from experiments.__main__ import main as run_entry_point
from moe_core.config.load import ConfigError, load_config, validate_measured
from moe_core.model.transformer import shape_only_model
from moe_core.parallel.parallelize import is_expert_param
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology

# Four ranks on one node of the A100 testbed, each holding all four experts: data parallel 4.
DP4 = ["hardware_profile=lina-a100-4x4", "parallel.world_size=4", "moe.num_experts=4", "moe.experts_per_rank=4"]
# A dense GPT in bfloat16 on the 4 x 4 testbed's 16 ranks (the experts only keep the layout valid).
DENSE = [
    "hardware_profile=lina-a100-4x4",
    "parallel.world_size=16",
    "moe.num_experts=16",
    "moe.experts_per_rank=1",
    "moe.top_k=1",
    "model.moe_every=0",
    "model.d_model=2048",
    "model.d_ff=8192",
    "model.n_heads=16",
    "model.n_layers=4",
    "train.dtype=bfloat16",
    "comm.policy=overlap",
]


def model_of(overrides):
    cfg = load_config(overrides=overrides, whole_run=False)
    return cfg, StepModel(cfg, build_topology(cfg.hardware))


def simulate(overrides):
    cfg, model = model_of(overrides)
    return cfg, model.run()


def sent_bytes(op) -> float:
    """What each rank sends in a ring collective inside one node: its egress link's load."""
    return float(op.transfer.nbytes.max())


def phase_ops(sim, phase: str) -> list:
    return [op for op in sim.ops if op.phase == phase]


def block_bytes(cfg, block: int, experts: bool) -> int:
    """The parameter bytes of one block, its dense weights or its experts, counted on the model."""
    return sum(
        p.numel() * 2 if cfg.train.dtype == "bfloat16" else p.numel() * 4
        for name, p in shape_only_model(cfg).named_parameters()
        if name.startswith(f"blocks.{block}.") and is_expert_param(name) == experts
    )


def test_full_sharding_gathers_and_scatters_each_block_over_its_replicas():
    """Per block and pass, each rank sends (dp-1)/dp of the block's parameters (all-gather, before
    its forward and again before its backward) and of its gradients (reduce-scatter, once)."""
    cfg, sim = simulate([*DP4, "parallel.data_sharding=full"])
    dp = 4
    for i in range(cfg.model.n_layers):
        for group, experts in (("dense", False), ("expert", True)):
            expected = (dp - 1) / dp * block_bytes(cfg, i, experts)
            if expected == 0:  # a dense block (moe_every=2) has no experts to gather
                assert not [op for op in sim.ops if op.name.startswith(f"L{i}.") and group in op.name]
                continue
            for pass_ in ("fwd", "bwd"):
                (gather,) = [op for op in sim.ops if op.name == f"L{i}.param_gather_{group}.{pass_}"]
                assert gather.phase == "param_all_gather"
                assert sent_bytes(gather) == pytest.approx(expected)
            (scatter,) = [op for op in sim.ops if op.name == f"L{i}.grad_scatter_{group}.bwd"]
            assert scatter.phase == "reduce_scatter"
            assert sent_bytes(scatter) == pytest.approx(expected)
    # the root (embeddings, final norm, head): gathered once, kept through the backward pass
    assert [op.name for op in sim.ops if op.name.startswith("root.")] == [
        "root.param_gather_dense.fwd",
        "root.grad_scatter_dense.bwd",
    ]
    assert not phase_ops(sim, "allreduce")  # the plan's DDP buckets are replaced


def test_full_sharding_prefetches_one_block_and_computes_on_gathered_parameters():
    """A block's forward gather is in flight while the block before it computes; no block computes
    before its gather is done; gathers share one stream, reduce-scatters another."""
    cfg, sim = simulate([*DP4, "parallel.data_sharding=full"])
    start, end = sim.timeline.start_s, sim.timeline.end_s
    index = {op.name: k for k, op in enumerate(sim.ops)}
    for i in range(1, cfg.model.n_layers):
        gather = index[f"L{i}.param_gather_dense.fwd"]
        assert start[gather] < end[index[f"L{i - 1}.norms.fwd"]]  # issued while block i-1 computes
        gathers = [
            index[f"L{i}.param_gather_{g}.fwd"] for g in ("dense", "expert") if f"L{i}.param_gather_{g}.fwd" in index
        ]
        assert start[index[f"L{i}.norms.fwd"]] >= max(end[gathers]) - 1e-12  # computes on gathered weights
    last = cfg.model.n_layers - 1
    assert start[index[f"L{last}.param_gather_dense.bwd"]] < end[index["head.fwd_bwd"]]  # behind the head
    for i in range(last, 0, -1):  # block i-1's backward gather while block i's backward computes
        assert start[index[f"L{i - 1}.param_gather_dense.bwd"]] < end[index[f"L{i}.norms.bwd"]]
    for phase in ("param_all_gather", "reduce_scatter"):
        stream = [k for k, op in enumerate(sim.ops) if op.phase == phase]
        assert all(start[b] >= end[a] - 1e-12 for a, b in zip(stream, stream[1:]))  # one after another
    # the optimizer waits for the last reduce-scatter, which the backward pass leaves exposed
    optimizer = index["optimizer"]
    assert start[optimizer] == pytest.approx(
        max(end[k] for k, op in enumerate(sim.ops) if op.phase == "reduce_scatter")
    )
    m = sim.metrics()
    assert m["allreduce_exposed_ms"] == pytest.approx(1e3 * (start[optimizer] - end[sim.backward_end]))
    assert m["param_gather_exposed_ms"] > 0  # at least the root's, which nothing hides
    assert m["dense_ms"] + m["moe_layer_ms"] + m["allreduce_exposed_ms"] + m["param_gather_exposed_ms"] == (
        pytest.approx(m["step_ms"])
    )


@pytest.mark.parametrize("sharding", ["optimizer", "full"])
def test_sharded_optimizer_updates_one_dp_th_of_the_parameters(sharding):
    """The optimizer's memory-bound work (its time beyond the kernel launches) shrinks by dp."""
    (_, replicated), (_, sharded) = model_of(DP4), model_of([*DP4, f"parallel.data_sharding={sharding}"])
    for model in (replicated, sharded):
        model.kernels = model.kernels.without_launches()
    assert replicated.optimizer_seconds() > 0
    assert sharded.optimizer_seconds() == pytest.approx(replicated.optimizer_seconds() / 4, rel=1e-9)


def test_sharded_optimizer_moves_the_all_reduces_bytes_as_reduce_scatter_and_all_gather():
    """ZeRO-1: the plan's units are reduce-scattered, then all-gathered after the optimizer step;
    together they move exactly the all-reduce's bytes."""
    _, ddp = simulate([*DP4, "comm.bucket_mb=0.25"])
    _, zero1 = simulate([*DP4, "comm.bucket_mb=0.25", "parallel.data_sharding=optimizer"])
    reduced, scattered, gathered = (
        phase_ops(s, p) for s, p in ((ddp, "allreduce"), (zero1, "reduce_scatter"), (zero1, "param_all_gather"))
    )
    assert len(reduced) == len(scattered) == len(gathered) > 1
    assert sum(op.transfer.nbytes.sum() for op in scattered + gathered) == pytest.approx(
        sum(op.transfer.nbytes.sum() for op in reduced)
    )
    optimizer = next(k for k, op in enumerate(zero1.ops) if op.phase == "optimizer")
    first_gather = next(k for k, op in enumerate(zero1.ops) if op.phase == "param_all_gather")
    assert zero1.timeline.start_s[first_gather] >= zero1.timeline.end_s[optimizer] - 1e-12
    m = zero1.metrics()
    assert m["param_gather_exposed_ms"] == pytest.approx(
        1e3 * (zero1.timeline.makespan_s - zero1.timeline.end_s[optimizer])
    )
    assert m["allreduce_alone_ms"] > 0  # the reduce-scatters are the gradient sync


@pytest.mark.parametrize("policy", ["sequential", "overlap"])
def test_gradient_accumulation_repeats_the_passes_and_syncs_once(policy):
    """k micro-batches: k times a micro-batch's compute ops (each priced on its shapes); the plan's
    gradient sync once, after the last pass, on its gradients (DDP's no_sync before it)."""
    base = [*DP4, f"comm.policy={policy}"]
    _, three = simulate([*base, "train.batch_size=6", "train.micro_batches=3"])
    _, whole = simulate([*base, "train.batch_size=6"])
    _, pass_of_two = simulate([*base, "train.batch_size=2"])

    def compute(sim):
        return [op.duration_s for op in sim.ops if op.is_compute and op.phase != "optimizer"]

    assert compute(three) == pytest.approx(3 * compute(pass_of_two))
    reduced = phase_ops(three, "allreduce")
    assert [op.name for op in reduced] == [op.name for op in phase_ops(whole, "allreduce")]
    assert [sent_bytes(op) for op in reduced] == [sent_bytes(op) for op in phase_ops(whole, "allreduce")]
    last_pass = min(k for k, op in enumerate(three.ops) if op.name.startswith("mb2/"))
    assert all(k > last_pass for k, op in enumerate(three.ops) if op.phase == "allreduce")
    # the passes run one after another; the MoE layers' wall time counts each pass's layers
    start, end = three.timeline.start_s, three.timeline.end_s
    index = {op.name: k for k, op in enumerate(three.ops)}
    assert start[index["mb1/embed.fwd"]] >= end[index["mb0/embed.bwd"]] - 1e-12
    spans, once = three.metrics(), pass_of_two.metrics()
    assert spans["moe_layer_fwd_ms"] == pytest.approx(3 * once["moe_layer_fwd_ms"])


def test_full_sharding_gathers_and_scatters_in_every_pass():
    """FSDP2's default under gradient accumulation: every micro-batch gathers and reduce-scatters."""
    _, one = simulate([*DP4, "parallel.data_sharding=full"])
    _, two = simulate([*DP4, "parallel.data_sharding=full", "train.micro_batches=2"])
    for phase in ("param_all_gather", "reduce_scatter"):
        assert len(phase_ops(two, phase)) == 2 * len(phase_ops(one, phase))
        assert sorted(sent_bytes(op) for op in phase_ops(two, phase)) == pytest.approx(
            sorted(2 * [sent_bytes(op) for op in phase_ops(one, phase)])
        )


def test_full_sharding_hides_behind_big_compute_and_not_behind_little():
    """A compute-bound model's fully sharded step costs at most a few % more than DDP's (the gathers
    and reduce-scatters overlap the blocks), and gains at most the optimizer work it shards away;
    with little compute per block the step waits on them."""
    big = [*DENSE, "model.seq_len=2048", "train.batch_size=8"]
    _, ddp = simulate(big)
    _, fsdp = simulate([*big, "parallel.data_sharding=full"])
    optimizer_ms = 1e3 * model_of(big)[1].optimizer_seconds()
    assert ddp.metrics()["step_ms"] - optimizer_ms <= fsdp.metrics()["step_ms"] <= 1.03 * ddp.metrics()["step_ms"]
    assert fsdp.metrics()["exposed_comm_share"] < 0.2
    _, tiny = simulate([*DENSE, "model.seq_len=16", "train.batch_size=1", "parallel.data_sharding=full"])
    m = tiny.metrics()
    assert m["exposed_comm_share"] > 0.8
    assert m["param_gather_exposed_ms"] > 0.5 * m["step_ms"]


def test_defaults_replicate_and_take_one_pass():
    _, default = model_of(DP4)
    _, explicit = model_of([*DP4, "parallel.data_sharding=none", "train.micro_batches=1"])
    a, b = default.run(), explicit.run()
    assert a.metrics() == b.metrics()
    assert a.metrics()["param_gather_exposed_ms"] == 0.0
    assert not phase_ops(a, "reduce_scatter") and not phase_ops(a, "param_all_gather")


@pytest.mark.parametrize(
    ("overrides", "key", "message"),
    [
        (["train.micro_batches=0"], "train.micro_batches", "must be >= 1"),
        (["train.batch_size=8", "train.micro_batches=3"], "train.micro_batches", "must divide train.batch_size=8"),
        # a pass of 2 sequences of 64 tokens cannot hold gate groups of 512 tokens (the batch can)
        (["train.micro_batches=4", "moe.group_size=512"], "moe.group_size", "must divide a micro-batch's tokens"),
        # the batch's ceil(1.1 x 8 x 64 x 2 / 4) = 282 capacity slots per expert split over 2 tensor-parallel
        # ranks, a pass's ceil(1.1 x 2 x 64 x 2 / 4) = 71 do not
        (
            [
                "train.micro_batches=4",
                "moe.capacity_factor=1.1",
                "moe.min_capacity=0",
                "moe.experts_per_rank=2",
                "parallel.tensor_parallel=2",
            ],
            "train.micro_batches",
            "a pass of 2 sequences is invalid: config key 'moe.dispatcher'",
        ),
        (["parallel.data_sharding=zero2"], "parallel.data_sharding", "zero2"),
        (
            ["parallel.data_sharding=full", "parallel.grid.row=2", "moe.num_experts=2"],
            "parallel.data_sharding",
            "parallel.grid",
        ),
    ],
)
def test_bad_values_name_their_key(overrides, key, message):
    with pytest.raises(ConfigError, match=key) as err:
        load_config(overrides=overrides, whole_run=False)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("setting", "key"),
    [("parallel.data_sharding=optimizer", "parallel.data_sharding"), ("train.micro_batches=2", "train.micro_batches")],
)
def test_measured_runs_refuse_what_only_the_simulator_models(setting, key, capsys):
    cfg = load_config(overrides=[setting], whole_run=False)  # a simulated run takes it
    with pytest.raises(ConfigError, match=f"{key}.*simulated only"):
        validate_measured(cfg)
    with pytest.raises(ConfigError, match=f"{key}.*simulated only"):  # the measured sweep's points, at load
        load_config(overrides=[setting])
    assert run_entry_point(["train_step", setting]) == 2  # before any process group
    assert "simulated only" in capsys.readouterr().err
    validate_measured(load_config(whole_run=False))  # the defaults are measured as ever


def test_full_sharding_refuses_plans_that_schedule_their_gradients():
    """Lina's gradient micro-ops and priority have no meaning once FSDP's units replace the plan's;
    its sharded optimizer reduce-scatters them as they are."""
    with pytest.raises(ConfigError, match="parallel.data_sharding.*'lina' yields its gradients"):
        load_config(overrides=["comm.policy=lina", "parallel.data_sharding=full"], whole_run=False)
    _, zero1 = simulate([*DP4, "comm.policy=lina", "parallel.data_sharding=optimizer"])
    scattered = phase_ops(zero1, "reduce_scatter")
    assert scattered and all(op.priority == 1 for op in scattered)


def test_a_grids_prefetch_starts_afresh_in_every_pass():
    """Under a 3D grid that prefetches its weights, a pass's first all-gather waits for the pass
    before it, as the step's first one does."""
    grid = [
        "hardware_profile=lina-a100-4x4",
        "parallel.world_size=8",
        "parallel.grid.depth=2",
        "parallel.grid.row=2",
        "moe.num_experts=2",
    ]
    _, sim = simulate([*grid, "comm.grid_overlap.all_gather=true", "train.micro_batches=2"])
    index = {op.name: k for k, op in enumerate(sim.ops)}
    first = index["mb1/L0.attn.qkv.all_gather_depth.fwd"]
    on_device = [d for d in sim.ops[first].deps if not sim.ops[d].on_host]  # the host's issue order aside
    assert on_device == [index["mb1/L0.norms.fwd"]]  # not the previous pass's last gather
    assert sim.timeline.start_s[first] >= sim.timeline.end_s[index["mb0/embed.bwd"]] - 1e-12
