"""3D tensor parallelism on the 4D grid (moe_core.parallel.grid_parallel) equals the single-process reference,
with and without each overlap, and issues exactly the planned collectives on the planned groups.

Each case spawns the grid's gloo ranks once and trains two SGD steps per overlap setting. The ranks
of a (row, col) block train on the same batch; the reference runs one process on the data
replicas' (data x depth) batches concatenated. A rank's expected gradient is the reference gradient
cut as its parameters are cut (its experts, its depth shard of its block). The MoE layer keeps
expert parallelism over the data replicas, so every case also checks the composition.
"""

from collections import Counter
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moe_core.config.load import load_config
from moe_core.dispatch import routes_dropless
from moe_core.host.timing import PhaseTimer
from moe_core.model.capacity import moe_blocks
from moe_core.model.transformer import MoETransformer
from moe_core.parallel.grid import GridOverlaps, block_collectives
from moe_core.parallel.grid_parallel import GridGroups, shard_grid
from moe_core.parallel.layout import layout_of
from moe_core.parallel.parallelize import build_groups, parallelize_model
from moe_core.schedule.executor import make_policy
from moe_core.schedule.gradients import layout_plan
from tests.test_expert_parallel import SMALL, assert_run_equals, reference_as_rank, run_reference, sgd_steps

OVERLAPS = {
    "none": [],
    "all_reduce": ["comm.grid_overlap.all_reduce=true"],
    "reduce_scatter": ["comm.grid_overlap.reduce_scatter=true"],
    "all_gather": ["comm.grid_overlap.all_gather=true"],
    "all+cache": [
        "comm.grid_overlap.all_reduce=true",
        "comm.grid_overlap.reduce_scatter=true",
        "comm.grid_overlap.all_gather=true",
        "comm.grid_overlap.cached_layers=1",
    ],
}
STEPS = 2
EXPERTS = 2


def _overrides(data, depth, row, col, policy="sequential"):
    replicas = data * depth
    return [
        *SMALL,
        f"parallel.world_size={data * depth * row * col}",
        f"parallel.grid.depth={depth}",
        f"parallel.grid.row={row}",
        f"parallel.grid.col={col}",
        f"moe.num_experts={EXPERTS}",
        f"moe.experts_per_rank={EXPERTS // min(EXPERTS, replicas)}",
        f"comm.policy={policy}",
    ]


class _Recorder:
    """Records (kind, group ranks, elements) of every grid collective issued while ``on``."""

    KINDS = {"all_reduce": "all_reduce", "all_gather_single": "all_gather", "reduce_scatter_single": "reduce_scatter"}

    def __init__(self):
        self.on, self.steps = False, []  # steps: the calls of every forward and backward pass
        for fn, kind in self.KINDS.items():
            setattr(dist, fn, self._wrap(getattr(dist, fn), kind))

    @contextmanager
    def recording(self):
        self.on = True
        self.steps.append([])
        yield
        self.on = False

    def _wrap(self, fn, kind):
        def recorded(*args, **kwargs):
            if self.on:
                group = kwargs.get("group")
                ranks = tuple(dist.get_process_group_ranks(group)) if group is not None else None
                buffer = args[0] if kind == "all_reduce" else args[0 if kind == "all_gather" else 1]
                self.steps[-1].append((kind, ranks, buffer.numel()))
            return fn(*args, **kwargs)

        return recorded


def _worker(rank, world, init_file, overrides, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    recorder = _Recorder()
    results = {}
    for name, extra in OVERLAPS.items():
        cfg = load_config(overrides=[*overrides, *extra])
        groups = build_groups(layout_of(cfg), "cpu", cfg.parallel.timeout_s)
        torch.manual_seed(cfg.train.seed)
        model = MoETransformer(cfg, dropless=routes_dropless(cfg))
        parallelize_model(model, groups)
        policy = make_policy(cfg, layout_plan(cfg, groups.layout, 4), groups, PhaseTimer())
        policy.attach(model)
        recorder.steps = []
        losses = sgd_steps(cfg, model, policy, groups.data_rank, STEPS, backward=recorder.recording)
        results[name] = {
            "losses": losses,
            "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
            "issued": recorder.steps,
        }
        policy.detach(model)
    grid = groups.grid
    results.update(ep_rank=groups.ep_rank, index=grid.index if grid else {})
    torch.save(results, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def _expected_grads(cfg, ref_grads, ep_rank, index):
    """The reference gradients cut as the rank at grid ``index`` (expert-parallel rank ``ep_rank``) cuts them."""
    model = reference_as_rank(cfg, ref_grads, ep_rank)
    if index:
        shard_grid(model, GridGroups(layout_of(cfg).grid, index, dict.fromkeys(index)))
    return {n: p.detach() for n, p in model.named_parameters()}


def _planned(cfg, rank, cached_layers):
    """The grid collectives moe_core.parallel.grid plans for one forward + backward on ``rank``."""
    layout, m = layout_of(cfg), cfg.model
    tokens = cfg.train.batch_size * m.seq_len
    planned = []
    for i in range(m.n_layers):
        dense = i not in moe_blocks(m.n_layers, m.moe_every)
        cached = GridOverlaps(cached_layers=cached_layers).caches(i)
        for c in block_collectives(layout.grid, m.d_model, m.d_ff, dense, tokens, cached=cached):
            (ranks,) = [tuple(int(r) for r in g) for g in layout.groups(c.axis) if rank in g]
            planned.append((c.kind, ranks, c.elements))
    return Counter(planned)


@pytest.mark.parametrize(
    "data,depth,row,col,policy",
    [
        # every axis in at least two layouts beside other axes (alone it adds no path of its own)
        (1, 1, 2, 2, "sequential"),
        (1, 2, 1, 2, "sequential"),
        (2, 1, 2, 1, "sequential"),
        (1, 2, 2, 2, "sequential"),
        (2, 2, 1, 1, "overlap"),  # gradient units launched from hooks, beside the overlapped reduce-scatters
    ],
)
def test_grid_equals_reference_with_every_overlap(tmp_path, data, depth, row, col, policy):
    """Grids as (data, depth, row, col)."""
    overrides = _overrides(data, depth, row, col, policy)
    world = data * depth * row * col
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), overrides, str(tmp_path)), nprocs=world)
    cfg = load_config(overrides=overrides)
    ref_losses, ref_grads = run_reference(cfg, data * depth, steps=STEPS)
    for rank in range(world):
        res = torch.load(tmp_path / f"rank{rank}.pt")
        expected = _expected_grads(cfg, ref_grads, res["ep_rank"], res["index"])
        for name, extra in OVERLAPS.items():
            got = res[name]
            assert_run_equals(got, ref_losses, expected, name)
            cached = load_config(overrides=[*overrides, *extra]).comm.grid_overlap.cached_layers
            planned = _planned(cfg, rank, cached)
            grid_groups = {ranks for _, ranks, _ in planned}
            for issued in got["issued"]:  # gradient units the "overlap" policy launches are on other groups
                assert Counter(c for c in issued if c[1] in grid_groups) == planned, name


def test_impossible_grids_fail_naming_the_key():
    from moe_core.schema.sections import ConfigError

    with pytest.raises(ConfigError, match="parallel.grid"):
        load_config(overrides=[*SMALL, "parallel.world_size=4", "parallel.grid.row=3"])
    with pytest.raises(ConfigError, match="parallel.grid"):  # 2 heads cannot split over 4 rows
        load_config(overrides=[*SMALL, "parallel.world_size=4", "parallel.grid.row=4", "moe.experts_per_rank=4"])
    with pytest.raises(ConfigError, match="parallel.tensor_parallel"):
        load_config(overrides=[*SMALL, "parallel.world_size=4", "parallel.grid.row=2", "parallel.tensor_parallel=2"])
