"""The hierarchical (2D) all-to-all equals dist.all_to_all_single bitwise, for groups spanning 2 and 4
nodes, strided groups, and one member per node; its group construction refuses groups it cannot split.

Multi-process gloo (file:// rendezvous, no ports); every check runs inside the ranks and a failing
rank fails ``mp.spawn``. One spawn per world size: each spawn costs seconds.
"""

from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moe_core.comm import all_to_all as comm
from moe_core.comm.hierarchical_a2a import hierarchical_all_to_all_single, hierarchical_groups, node_grid
from moe_core.config.load import load_config
from moe_core.dispatch import routes_dropless
from moe_core.host.timing import PhaseTimer
from moe_core.model.transformer import MoETransformer
from moe_core.parallel.layout import layout_of
from moe_core.parallel.parallelize import build_groups, parallelize_model
from moe_core.schedule.executor import make_policy
from moe_core.schedule.gradients import layout_plan
from tests.test_expert_parallel import SMALL, _batches, assert_matches_reference, run_reference

TIMEOUT = timedelta(seconds=60)
ROWS, FEATURES = 3, 2  # rows per (src, dst) block, trailing feature dim


def test_node_grid():
    """Group index i = (node i // m, local i % m), strided groups included; unequal nodes are refused."""
    assert node_grid([6, 0, 4, 2], devices_per_node=4) == [[0, 2], [4, 6]]
    assert node_grid([1, 3, 5, 7], devices_per_node=2) == [[1], [3], [5], [7]]
    assert node_grid(range(8), devices_per_node=2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert node_grid([4, 5, 6, 7], devices_per_node=4) == [[4, 5, 6, 7]]
    with pytest.raises(ValueError, match=r"group \[0, 1, 2\]"):
        node_grid([0, 1, 2], devices_per_node=2)


def _check_exchange(group_ranks, devices_per_node: int) -> None:
    """Both exchanges over the calling rank's group of ``group_ranks`` give the same bits."""
    rank = dist.get_rank()
    flat_groups = [dist.new_group([int(r) for r in ranks], timeout=TIMEOUT) for ranks in group_ranks]
    (mine,) = [i for i, ranks in enumerate(group_ranks) if rank in ranks]
    flat = flat_groups[mine]
    groups = hierarchical_groups(group_ranks, devices_per_node, TIMEOUT)
    assert groups is not None
    src, size = dist.get_rank(flat), dist.get_world_size(flat)
    assert (groups.size, groups.node_index * groups.members_per_node + groups.local_index) == (size, src)

    # value encodes (src, dst, row, feature), so a misplaced row or block cannot go unnoticed
    dst = torch.arange(size).repeat_interleave(ROWS)
    row = torch.arange(ROWS).repeat(size)
    x = (src * 10000 + dst * 100 + row * 10).float()[:, None] + torch.arange(FEATURES)  # (size * ROWS, FEATURES)
    expected, out = torch.empty_like(x), torch.full_like(x, float("nan"))
    dist.all_to_all_single(expected, x, group=flat)
    hierarchical_all_to_all_single(out, x, groups)
    assert torch.equal(out, expected), (group_ranks, devices_per_node, rank)


def _worker(rank: int, world: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=TIMEOUT)
    torch.set_num_threads(1)
    if world == 4:
        assert hierarchical_groups([[0, 1], [2, 3]], 2, TIMEOUT) is None  # each group on one node
        with pytest.raises(ValueError, match=r"group \[0, 1, 2\]"):
            hierarchical_groups([[0, 1, 2], [3]], 2, TIMEOUT)
        with pytest.raises(ValueError, match="exactly once"):
            hierarchical_groups([[0, 1], [1, 2]], 2, TIMEOUT)
        _check_exchange([[0, 1, 2, 3]], devices_per_node=2)  # 2 nodes x 2 members
    else:
        _check_exchange([[0, 2, 4, 6], [1, 3, 5, 7]], devices_per_node=4)  # strided: 2 nodes x 2, two groups at once
        # one member per node; numpy rows as Layout.groups returns them (the "dp" groups of dp=2 x ep=4)
        _check_exchange(np.arange(8).reshape(2, 4).T, devices_per_node=4)
        _check_exchange([list(range(8))], devices_per_node=2)  # 4 nodes x 2 members
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [4, 8])
def test_hierarchical_all_to_all_equals_all_to_all_single(tmp_path, world):
    mp.spawn(_worker, args=(world, str(tmp_path / "init")), nprocs=world, join=True)


def _training_worker(rank, world, init_file, overrides, out_dir):
    """Train with moe.dispatcher=hierarchical; count the two-phase exchanges that ran."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    cfg = load_config(overrides=overrides)
    groups = build_groups(
        layout_of(cfg), "cpu", cfg.parallel.timeout_s, hierarchical_devices_per_node=cfg.hardware.devices_per_node
    )
    calls = []
    two_phase = comm.hierarchical_all_to_all_single
    comm.hierarchical_all_to_all_single = lambda *args: calls.append(1) or two_phase(*args)
    torch.manual_seed(cfg.train.seed)
    model = MoETransformer(cfg, dropless=routes_dropless(cfg))
    parallelize_model(model, groups)
    policy = make_policy(cfg, layout_plan(cfg, groups.layout, 4), groups, PhaseTimer())
    policy.attach(model)
    ((x, y),) = _batches(cfg, 0, [groups.data_rank])
    loss, _ = model(x, y)
    loss.backward()
    policy.finish_gradient_sync()
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    torch.save(
        {
            "losses": [mean_loss.item() / world],
            "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
            "ep_rank": groups.ep_rank,
            "calls": len(calls),
        },
        f"{out_dir}/rank{rank}.pt",
    )
    dist.destroy_process_group()


def test_training_with_the_hierarchical_all_to_all_equals_reference(tmp_path):
    """4 ranks as 2 nodes x 2: the MoE layers exchange in two phases and train the reference model."""
    overrides = [
        *SMALL,
        "parallel.world_size=4",
        "moe.num_experts=4",
        "moe.experts_per_rank=1",
        "hardware.devices_per_node=2",
        "moe.dispatcher=hierarchical",
    ]
    mp.spawn(_training_worker, args=(4, str(tmp_path / "init"), overrides, str(tmp_path)), nprocs=4)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(4)]
    # one MoE layer: dispatch and combine, forward and backward
    assert [res["calls"] for res in results] == [4] * 4
    ref_losses, ref_grads = run_reference(load_config(overrides=overrides), 4)
    assert_matches_reference(results, ref_losses, ref_grads, 1)
