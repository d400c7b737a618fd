"""Tensor parallelism (dense blocks and experts over "tp") equals the single-process reference, in
every dispatch path of the tokens the "tp" ranks hold in duplicate.

Each case spawns ``world`` gloo ranks once and trains, one after the other, with every dispatch path
(``duplicate``, ``drop-gather``, pipelined chunks). The ranks of a "tp" group train on the same
batch; the reference runs one process on the data replicas' batches concatenated. A rank's expected
gradient is the reference gradient cut as its parameters are cut: the reference model with its
gradients as weights, sharded like the rank's model.
"""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moe_core.comm import all_to_all as comm
from moe_core.config.load import load_config
from moe_core.dispatch import routes_dropless
from moe_core.dispatch.chunks import even_ranges
from moe_core.host.timing import PhaseTimer
from moe_core.model.transformer import MoETransformer
from moe_core.parallel.layout import layout_of
from moe_core.parallel.parallelize import build_groups, parallelize_model
from moe_core.parallel.tensor_parallel import shard_tensor_parallel
from moe_core.schedule.executor import make_policy
from moe_core.schedule.gradients import layout_plan
from tests.test_expert_parallel import (
    SMALL,
    _force_uniform_gate,
    assert_run_equals,
    reference_as_rank,
    run_reference,
    sgd_steps,
)

DISPATCHES = [
    ("duplicate", []),
    ("drop-gather", []),
    ("monta", ["comm.tp_chunks=2"]),  # two pipelined chunks of the 8 slots a rank sends per expert
]
STEPS = 2


def _overrides(world, experts, per_rank, tp):
    return [
        *SMALL,
        f"parallel.world_size={world}",
        f"parallel.tensor_parallel={tp}",
        f"moe.num_experts={experts}",
        f"moe.experts_per_rank={per_rank}",
        "comm.policy=overlap",
    ]


def _worker(rank, world, init_file, overrides, uniform_gate, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    results = {}
    for dispatch, extra in DISPATCHES:
        cfg = load_config(overrides=[*overrides, f"moe.dispatcher={dispatch}", *extra])
        groups = build_groups(layout_of(cfg), "cpu", cfg.parallel.timeout_s)
        torch.manual_seed(cfg.train.seed)
        model = MoETransformer(cfg, dropless=routes_dropless(cfg))
        if uniform_gate:
            _force_uniform_gate(model)
        parallelize_model(model, groups)
        timer = PhaseTimer()
        policy = make_policy(cfg, layout_plan(cfg, groups.layout, 4), groups, timer)
        policy.attach(model)
        losses = sgd_steps(cfg, model, policy, groups.data_rank, STEPS)
        results[dispatch] = {
            "losses": losses,
            "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
            "a2a_bytes": timer.counters.get("dispatch_a2a.bytes", 0.0),
        }
        policy.detach(model)
    results.update(ep_rank=groups.ep_rank, tp_rank=groups.tp_rank)
    torch.save(results, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def _expected_grads(cfg, ref_grads, ep_rank, tp_rank, uniform_gate):
    """The reference gradients cut as rank (ep_rank, tp_rank)'s parameters are cut."""
    model = reference_as_rank(cfg, ref_grads, ep_rank)
    shard_tensor_parallel(model, tp_rank, cfg.parallel.tensor_parallel, group=None)
    return {n: p.detach() for n, p in model.named_parameters()}


# Llama's, Mixtral's and Qwen3's blocks: 4 query heads sharing 2 key/value heads (one per "tp" rank),
# each of 16 features on d_model 32 (Qwen3's wider heads), SwiGLU dense FFN and experts (each rank
# keeps its units of the gate and of the up projection)
LLAMA_BLOCKS = ["model.n_heads=4", "model.n_kv_heads=2", "model.head_dim=16", "model.ffn_activation=swiglu"]


@pytest.mark.parametrize(
    "world,experts,per_rank,uniform_gate,blocks",
    [
        (4, 4, 2, False, LLAMA_BLOCKS),  # tp 2 x ep 2
        (8, 4, 2, False, []),  # tp 2 x ep 2 x dp 2
        (8, 4, 1, True, []),  # tp 2 x ep 4; every token goes to experts 0 and 1: two ranks get none
    ],
)
def test_every_dispatch_equals_reference(tmp_path, world, experts, per_rank, uniform_gate, blocks):
    tp = 2
    overrides = [*_overrides(world, experts, per_rank, tp), *blocks]
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), overrides, uniform_gate, str(tmp_path)), nprocs=world)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    cfg = load_config(overrides=overrides)
    ref_losses, ref_grads = run_reference(cfg, world // tp, steps=STEPS, uniform_gate=uniform_gate)
    for res in results:
        expected = _expected_grads(cfg, ref_grads, res["ep_rank"], res["tp_rank"], uniform_gate)
        for dispatch, _ in DISPATCHES:
            assert_run_equals(res[dispatch], ref_losses, expected, dispatch)
        # duplicates cross the all-to-all tp times; dropping them sends 1/tp
        assert res["duplicate"]["a2a_bytes"] == tp * res["drop-gather"]["a2a_bytes"] > 0
        assert res["monta"]["a2a_bytes"] == res["drop-gather"]["a2a_bytes"]
    for dispatch, _ in DISPATCHES:  # every path trains the same model
        assert results[0][dispatch]["losses"] == pytest.approx(results[0]["duplicate"]["losses"], rel=1e-6)


def _exchange_worker(rank, world, init_file, out_dir):
    """tp_exchange of a buffer replicated over "tp" equals the whole all-to-all, for any chunking."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    ep_group, tp_group = dist.new_group([0, 2]), dist.new_group([1, 3])  # rank r: ep index r // 2
    tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine_ep = ep_group if rank in (0, 2) else tp_group
    mine_tp = tp_groups[rank // 2]
    blocks, rows, width = 2, 12, 3
    torch.manual_seed(rank // 2)  # the two "tp" ranks of a replica hold the same buffer
    x = torch.randn(blocks * rows, width, requires_grad=True)
    whole = torch.empty_like(x)
    dist.all_to_all_single(whole, x.detach(), group=mine_ep)
    outcomes = []
    for chunks in (1, 2, 3, 6):
        y = comm.tp_exchange(x, rows, even_ranges(rows // 2, chunks), mine_ep, mine_tp, PhaseTimer(), "dispatch_a2a")
        (grad,) = torch.autograd.grad(y, x, whole)  # the backward exchanges the gradient the same way
        back = torch.empty_like(x)
        dist.all_to_all_single(back, whole, group=mine_ep)
        outcomes.append((torch.equal(y, whole), torch.equal(grad, back)))
    torch.save(outcomes, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def test_tp_exchange_equals_whole_all_to_all_for_any_chunking(tmp_path):
    mp.spawn(_exchange_worker, args=(4, str(tmp_path / "init"), str(tmp_path)), nprocs=4)
    for rank in range(4):
        assert torch.load(tmp_path / f"rank{rank}.pt") == [(True, True)] * 4


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["parallel.tensor_parallel=3"], "parallel.tensor_parallel"),  # does not divide world 4
        (["parallel.tensor_parallel=2", "model.n_heads=3", "model.d_model=48"], "parallel.tensor_parallel"),
        (["parallel.tensor_parallel=2", "moe.dispatcher=dropless"], "moe.dispatcher"),
        (["parallel.tensor_parallel=2", "comm.policy=lina"], "comm.policy"),
        (["parallel.tensor_parallel=2", "moe.dispatcher=scatter"], "moe.dispatcher"),
        (["parallel.tensor_parallel=2", "comm.tp_chunks=3"], "3 chunks must divide"),
        (["parallel.tensor_parallel=2", "moe.num_experts=4", "moe.experts_per_rank=1"], "parallel.world_size"),
    ],
)
def test_impossible_tensor_parallel_layouts_fail_naming_the_key(overrides, key):
    from moe_core.config.load import ConfigError

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(
            overrides=[*SMALL, "parallel.world_size=4", "moe.num_experts=4", "moe.experts_per_rank=2", *overrides]
        )
