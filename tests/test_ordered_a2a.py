"""The ordered all-to-all equals dist.all_to_all_single, forward and backward, for every schedule kind;
the ``aurora`` policy trains exactly like ``sequential``.

Multi-process gloo (file:// rendezvous, no ports); every check runs inside the ranks and a failing
rank fails ``mp.spawn``.
"""

from datetime import timedelta
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_expert_parallel import SMALL, run_parallel_each

from moe_core.comm import all_to_all as comm
from moe_core.comm.ordered_a2a import gather_traffic_matrix, ordered_all_to_all_single
from moe_core.comm.transmission import ORDERS, make_schedule
from moe_core.host.timing import PhaseTimer
from moe_core.schedule.executor import executor_class
from moe_core.schedule.policies import POLICIES, PlanInputs


def _traffic(world: int) -> list[np.ndarray]:
    """(world, world) rows i -> j: uneven and dense (flows split over rounds), then with a zero-size
    pair and (world >= 3) a rank that sends nothing to others and one that receives nothing."""
    dense = np.random.default_rng(world).integers(1, 20, (world, world))
    sparse = dense.copy()
    sparse[0, world - 1] = 0
    if world >= 3:
        sparse[world - 1, : world - 1] = 0
        sparse[[0, 2], 1] = 0
    return [dense, sparse]


def _check_exchange(counts: np.ndarray, group, tag: int) -> None:
    """Every schedule kind moves the same rows and gradients as all_to_all_single on ``group``."""
    rank = dist.get_rank(group)
    in_splits, out_splits = counts[rank].tolist(), counts[:, rank].tolist()
    rows = sum(in_splits)
    # row value encodes (src, dst, index) so a misplaced row cannot go unnoticed
    dst_of_row = np.repeat(np.arange(len(in_splits)), in_splits)
    base = torch.tensor(rank * 1000 + dst_of_row * 100 + np.arange(rows), dtype=torch.float64)
    x_ref = torch.stack([base, -base, base + 0.5], dim=1).requires_grad_()  # (rows, 3)
    weight = torch.randn(sum(out_splits), 3, generator=torch.Generator().manual_seed(tag + rank), dtype=torch.float64)
    timer = PhaseTimer(enabled=False)

    assert (gather_traffic_matrix(x_ref, in_splits, group) == counts).all()
    ref = comm.all_to_all(x_ref, out_splits, in_splits, group, timer, "a2a")
    (ref * weight).sum().backward()
    for kind in sorted(ORDERS):
        x = x_ref.detach().clone().requires_grad_()
        schedule = make_schedule(kind, counts, seed=tag)
        out = comm.all_to_all(x, out_splits, in_splits, group, timer, "a2a", schedule=schedule)
        assert torch.equal(out, ref), kind
        (out * weight).sum().backward()
        assert torch.equal(x.grad, x_ref.grad), kind
    for policy in ("aurora", "aurora-sjf", "aurora-rcs"):  # the policies plan from the gathered matrix
        plan = POLICIES[policy].decide(PlanInputs([], 4, 1, 1.0))  # its exchange: the all-to-all in its order
        aurora = executor_class(POLICIES[policy])(plan, SimpleNamespace(ep_group=group), timer)
        assert torch.equal(aurora.all_to_all(x_ref.detach(), out_splits, in_splits, "a2a"), ref), policy


def _worker(rank: int, world: int, init_file: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    torch.set_num_threads(1)
    for tag, counts in enumerate(_traffic(world)):
        _check_exchange(counts, None, tag)

    # equal splits (capacity mode): no traffic matrix to gather
    x = torch.arange(4 * world, dtype=torch.float32).view(2 * world, 2) + 100 * rank
    expected, out = torch.empty_like(x), torch.empty_like(x)
    dist.all_to_all_single(expected, x)
    matrix = gather_traffic_matrix(x, None, None)
    assert (matrix == 2).all()
    ordered_all_to_all_single(out, x, None, None, make_schedule("aurora", matrix), None)
    assert torch.equal(out, expected)

    # a schedule that does not move the splits is refused on every rank before anything is sent
    with pytest.raises(ValueError, match="schedule sends"):
        ordered_all_to_all_single(torch.empty(world), torch.ones(world), None, None, [], None)

    if world >= 3:  # a subgroup whose group ranks are not the global ranks
        sub = dist.new_group(list(range(1, world)))
        if rank >= 1:
            _check_exchange(_traffic(world - 1)[0], sub, tag=2)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ordered_all_to_all_equals_all_to_all_single(tmp_path, world):
    mp.spawn(_worker, args=(world, str(tmp_path / "init")), nprocs=world, join=True)


def test_aurora_policy_trains_like_sequential(tmp_path):
    """Dropless routing gives uneven traffic matrices; the order never changes the math (bitwise).
    (The other orders move the same rows, checked exchange by exchange above.)"""
    base = [*SMALL, "parallel.world_size=4", "moe.num_experts=4", "moe.experts_per_rank=1", "moe.dispatcher=dropless"]
    runs = run_parallel_each(
        tmp_path, 4, {policy: [*base, f"comm.policy={policy}"] for policy in ("sequential", "aurora")}
    )
    for seq, aurora in zip(runs["sequential"], runs["aurora"]):
        assert aurora["losses"] == seq["losses"]
        for name in seq["grads"]:
            torch.testing.assert_close(
                aurora["grads"][name], seq["grads"][name], rtol=0, atol=0, msg=lambda m, name=name: f"{name}: {m}"
            )
