"""Expert-parallel MoE equals a single-process reference; policies and repacking never change the math.

Each case spawns ``world`` gloo ranks (file:// rendezvous, no ports). Every rank trains the same
seeded model on its own batch; the reference runs one process on the concatenated batch with one
routing group per rank, so routing, capacity drops and random-routing draws are identical.
"""

from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moe_core.comm import all_to_all as comm
from moe_core.config.load import load_config
from moe_core.dispatch import routes_dropless
from moe_core.host.timing import PhaseTimer
from moe_core.model.data import MarkovTokens
from moe_core.model.transformer import MoETransformer
from moe_core.papers.lina.packing import repack
from moe_core.papers.lina.policy import LinaPriority
from moe_core.parallel.layout import expert_layout, layout_of
from moe_core.parallel.parallelize import build_groups, is_expert_param, parallelize_model
from moe_core.schedule.executor import make_policy
from moe_core.schedule.gradients import gradient_tensors, layout_plan
from moe_core.schedule.policies import POLICIES, build_plan

# 4 KiB gradient buckets and 1 KiB micro-ops: every policy's units cut the small model up
SMALL = [
    "model.vocab_size=64",
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "model.d_ff=48",
    "model.seq_len=16",
    "train.batch_size=2",
    "moe.min_capacity=1",
    "moe.capacity_factor=1.0",
    f"comm.bucket_mb={4096 / 2**20}",
    f"comm.partition_mb={1024 / 2**20}",
]
ELEMENT_BYTES = 4  # float32 gradients


def _config(world, experts, per_rank, extra=()):
    return load_config(
        overrides=[
            *SMALL,
            f"parallel.world_size={world}",
            f"moe.num_experts={experts}",
            f"moe.experts_per_rank={per_rank}",
            *extra,
        ]
    )


def _batches(cfg, step, ranks):
    data = MarkovTokens(cfg.model.vocab_size, cfg.train.data_branching, cfg.train.data_zipf, cfg.train.seed)
    return [data.batch(cfg.train.batch_size, cfg.model.seq_len, step, r) for r in ranks]


def sgd_steps(cfg, model, policy, data_rank, steps, backward=None):
    """``steps`` SGD steps of ``model`` under ``policy`` on data replica ``data_rank``'s batches; the
    gradients of the last step are left in ``.grad``. Returns the mean loss over the ranks per step.
    ``backward``: a context manager factory wrapped around every forward and backward pass."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        ((x, y),) = _batches(cfg, step, [data_rank])
        with backward() if backward else nullcontext():
            loss, _ = model(x, y)
            loss.backward()
        policy.finish_gradient_sync()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        losses.append(mean_loss.item() / dist.get_world_size())
        if step < steps - 1:
            optimizer.step()
            optimizer.zero_grad()
    return losses


def reference_as_rank(cfg, ref_grads, ep_rank):
    """The model with the reference gradients as its weights, keeping expert-parallel rank
    ``ep_rank``'s experts: shard it as a rank's model is sharded to get that rank's expected gradients."""
    torch.manual_seed(cfg.train.seed)
    model = MoETransformer(cfg, dropless=routes_dropless(cfg))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(ref_grads[name])
    per_rank = cfg.moe.experts_per_rank
    for layer in model.moe_layers():
        layer.experts.keep(ep_rank * per_rank, per_rank)
    return model


def assert_run_equals(got, ref_losses, expected, label):
    """One rank's run (``got``: its losses and gradients) equals the reference: its losses, and every
    gradient the ``expected`` one (the reference's, cut as the rank's parameters are cut)."""
    assert got["losses"] == pytest.approx(ref_losses, rel=1e-5, abs=1e-6), label
    assert got["grads"].keys() == expected.keys()
    for name, grad in got["grads"].items():
        torch.testing.assert_close(
            grad, expected[name], rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{label} {n}: {m}"
        )


def _force_uniform_gate(model):
    """Zero gate weights: every token ties and goes to experts 0 and 1, so other ranks get no tokens."""
    for layer in model.moe_layers():
        layer.gate.weight.data.zero_()


def _worker(rank, world, init_file, runs, steps, uniform_gate, out_dir):
    """Train each of ``runs`` (override lists) in turn on one process group, saving every run's result:
    one start-up of the ranks for many runs (a 4-rank start costs seconds on 2 cores)."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    results = [_train(rank, overrides, steps, uniform_gate) for overrides in runs]
    torch.save(results, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def _train(rank, overrides, steps, uniform_gate) -> dict:
    """``steps`` SGD steps of the config ``overrides`` on this rank: losses, gradients, Lina's launches."""
    cfg = load_config(overrides=overrides)
    groups = build_groups(layout_of(cfg), "cpu", cfg.parallel.timeout_s)
    for group in (groups.ep_group, groups.expert_grad_group, groups.dense_grad_group):
        # a hung peer must end the run within parallel.timeout_s on every communicator
        assert group._get_backend(torch.device("cpu")).options._timeout.total_seconds() == cfg.parallel.timeout_s
    torch.manual_seed(cfg.train.seed)
    model = MoETransformer(cfg, dropless=routes_dropless(cfg))
    if uniform_gate:
        _force_uniform_gate(model)
    parallelize_model(model, groups)
    policy = make_policy(cfg, layout_plan(cfg, groups.layout, ELEMENT_BYTES), groups, PhaseTimer())
    policy.attach(model)
    in_flight_at_exchange, launches = _watch_lina(policy)
    losses = sgd_steps(cfg, model, policy, rank, steps)
    policy.detach(model)
    return {
        "losses": losses,
        "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
        "ep_rank": groups.ep_rank,
        "launches": launches,
        "in_flight_at_exchange": in_flight_at_exchange,
    }


def _watch_lina(policy):
    """Record, for a Lina policy, how many all-reduce units are unfinished whenever an all-to-all
    exchange starts, and every unit launch."""
    in_flight, launches = [], []
    if not isinstance(policy, LinaPriority):
        return in_flight, launches

    def watched(exchange):
        def exchange_after_counting(*args):
            in_flight.append(sum(not u.done() for u in policy.launched))
            return exchange(*args)

        return exchange_after_counting

    launch_next = policy._launch_next

    def watched_launch():
        launches.append(id(policy.queue[0]))
        launch_next()

    comm.exchange, comm._exchange_chunks = watched(comm.exchange), watched(comm._exchange_chunks)
    policy._launch_next = watched_launch
    return in_flight, launches


def spawn(worker, tmp_path, world, *args):
    """Run ``worker(rank, world, init_file, *args, out_dir)`` on ``world`` processes; each rank's saved result."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    mp.spawn(worker, args=(world, str(tmp_path / "init"), *args, str(tmp_path)), nprocs=world, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def run_parallel(tmp_path, world, overrides, steps=1, uniform_gate=False):
    """One run of ``overrides`` on ``world`` ranks: each rank's result."""
    return [runs[0] for runs in spawn(_worker, tmp_path, world, [overrides], steps, uniform_gate)]


def run_parallel_each(tmp_path, world, runs: dict[str, list[str]], steps=1) -> dict[str, list[dict]]:
    """Every run of ``runs`` (name -> overrides) on one start of ``world`` ranks: name -> each rank's result."""
    ranks = spawn(_worker, tmp_path, world, list(runs.values()), steps, False)
    return {name: [rank[i] for rank in ranks] for i, name in enumerate(runs)}


def run_reference(cfg, world, steps=1, uniform_gate=False):
    """One process, all experts local, the ranks' batches concatenated, one routing group per rank."""
    torch.manual_seed(cfg.train.seed)
    model = MoETransformer(cfg, dropless=routes_dropless(cfg))
    if uniform_gate:
        _force_uniform_gate(model)
    for layer in model.moe_layers():
        layer.group_size = cfg.moe.group_size or cfg.train.batch_size * cfg.model.seq_len
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        batches = _batches(cfg, step, range(world))
        x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        loss, _ = model(x, y)
        loss.backward()
        losses.append(loss.item())
        if step < steps - 1:
            optimizer.step()
            optimizer.zero_grad()
    return losses, {n: p.grad for n, p in model.named_parameters()}


def assert_matches_reference(results, ref_losses, ref_grads, experts_per_rank):
    """Every expert-parallel rank's run equals the reference; a rank holds its slice of the stacked experts."""
    for res in results:
        first = res["ep_rank"] * experts_per_rank
        expected = {
            name: grad[first : first + experts_per_rank] if is_expert_param(name) else grad
            for name, grad in ref_grads.items()
        }
        assert_run_equals(res, ref_losses, expected, f"ep rank {res['ep_rank']}")


@pytest.mark.parametrize("world,experts,per_rank", [(1, 2, 2), (2, 2, 1), (2, 4, 2), (4, 4, 1), (4, 8, 2), (4, 4, 2)])
def test_capacity_mode_equals_reference(tmp_path, world, experts, per_rank):
    overrides = [
        *SMALL,
        f"parallel.world_size={world}",
        f"moe.num_experts={experts}",
        f"moe.experts_per_rank={per_rank}",
    ]
    results = run_parallel(tmp_path, world, overrides)
    ref_losses, ref_grads = run_reference(load_config(overrides=overrides), world)
    assert_matches_reference(results, ref_losses, ref_grads, per_rank)


@pytest.mark.parametrize("world,experts,per_rank", [(2, 4, 2), (4, 4, 1)])
def test_dropless_mode_equals_reference(tmp_path, world, experts, per_rank):
    overrides = [
        *SMALL,
        f"parallel.world_size={world}",
        f"moe.num_experts={experts}",
        f"moe.experts_per_rank={per_rank}",
        "moe.dispatcher=dropless",
    ]
    results = run_parallel(tmp_path, world, overrides)
    ref_losses, ref_grads = run_reference(load_config(overrides=overrides), world)
    assert_matches_reference(results, ref_losses, ref_grads, per_rank)


def test_rank_receiving_zero_tokens_works(tmp_path):
    """Dropless, all tokens routed to experts 0 and 1: ranks 2 and 3 receive nothing, yet all is exact."""
    overrides = [
        *SMALL,
        "parallel.world_size=4",
        "moe.num_experts=4",
        "moe.experts_per_rank=1",
        "moe.dispatcher=dropless",
    ]
    results = run_parallel(tmp_path, 4, overrides, uniform_gate=True)
    ref_losses, ref_grads = run_reference(load_config(overrides=overrides), 4, uniform_gate=True)
    assert_matches_reference(results, ref_losses, ref_grads, 1)
    for res in results[2:]:  # idle experts got exactly zero gradient
        assert all(float(g.abs().sum()) == 0.0 for n, g in res["grads"].items() if is_expert_param(n))


POLICY_RUN = [*SMALL, "parallel.world_size=4", "moe.num_experts=4", "moe.experts_per_rank=2"]


@pytest.fixture(scope="module")
def policy_runs(tmp_path_factory) -> dict[str, list[dict]]:
    """Every registered policy's 3 steps, on one start of 4 ranks."""
    runs = {policy: [*POLICY_RUN, f"comm.policy={policy}"] for policy in sorted(POLICIES)}
    return run_parallel_each(tmp_path_factory.mktemp("policies"), 4, runs, steps=3)


@pytest.mark.parametrize("policy", sorted(set(POLICIES) - {"sequential"}))
def test_policies_give_identical_losses(policy_runs, policy):
    """Scheduling never changes the math: every registered policy gives sequential's losses and
    gradients (Lina's micro-ops here are 1 KiB, so every tensor is cut into several)."""
    cfg = load_config(overrides=[*POLICY_RUN, f"comm.policy={policy}"])
    yields = build_plan(cfg, gradient_tensors(cfg, layout_of(cfg)), ELEMENT_BYTES).gradients_yield_to_a2a
    for seq, other in zip(policy_runs["sequential"], policy_runs[policy]):
        assert seq["losses"] == pytest.approx(other["losses"], rel=1e-6)
        if yields:  # Lina's priority: every unit launched once per step; an all-to-all waits behind <= 1
            assert len(other["launches"]) == 3 * len(set(other["launches"])) > 3
            assert max(other["in_flight_at_exchange"]) <= 1
        for name in seq["grads"]:
            torch.testing.assert_close(seq["grads"][name], other["grads"][name], rtol=1e-5, atol=1e-7)


def _repack_worker(rank, world, init_file, overrides, factors, out_dir):
    """One AdamW step per entry of ``factors``, the packing factor of that step: the model is
    repacked (moe_core.papers.lina.packing.repack, as ExpertPacking does) whenever it changes. Saves
    the losses and, before every step, the layout and every parameter with its optimizer state."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    cfg = load_config(overrides=overrides)
    base = layout_of(cfg)
    groups = {
        k: build_groups(
            expert_layout(base.world_size, base.num_experts, base.experts_per_rank * k),
            "cpu",
            cfg.parallel.timeout_s,
            high_priority_ep=True,
        )  # no effect on gloo
        for k in sorted(set(factors))
    }
    torch.manual_seed(cfg.train.seed)
    model = MoETransformer(cfg, dropless=routes_dropless(cfg))
    parallelize_model(model, groups[factors[0]])
    policy = make_policy(
        cfg, layout_plan(cfg, groups[factors[0]].layout, ELEMENT_BYTES), groups[factors[0]], PhaseTimer()
    )
    policy.attach(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    losses, layouts, states = [], [], []
    for step, factor in enumerate(factors):
        if groups[factor] is not policy.groups:
            old, policy = policy, repack(cfg, model, optimizer, policy, groups[factor], ELEMENT_BYTES)
            assert not old.hooks and not old.gradient_units  # detached
        layouts.append(
            (
                dist.get_world_size(policy.groups.ep_group),
                dist.get_world_size(policy.groups.expert_grad_group),
                policy.groups.ep_rank,
            )
        )
        states.append(
            {
                name: {"param": p.detach().clone(), **{k: v.clone() for k, v in optimizer.state[p].items()}}
                for name, p in model.named_parameters()
            }
        )
        ((x, y),) = _batches(cfg, step, [rank])
        loss, _ = model(x, y)
        loss.backward()
        policy.finish_gradient_sync()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        losses.append(mean_loss.item() / world)
    torch.save({"losses": losses, "layouts": layouts, "states": states}, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def _all_experts(results, step, name, key):
    """The whole expert stack (E, ...) of parameter ``name``'s ``key`` before ``step``: the slices
    of the first "ep" row, ranks 0 .. ep - 1 in expert order."""
    ep = results[0]["layouts"][step][0]
    return torch.cat([results[r]["states"][step][name][key] for r in range(ep)])


def test_repacking_experts_mid_run_keeps_losses_parameters_and_optimizer_state(tmp_path):
    """Lina's expert packing inside a run: 2 steps on 4 experts over 4 ranks, repack to 2 experts
    per rank (expert-parallel 4 -> 2, data-parallel 1 -> 2), 2 steps, back to 1 per rank, 2 steps.
    Every rank then holds the experts of its new place with their AdamW state, and the run matches
    one that never repacks."""
    overrides = [*SMALL, "parallel.world_size=4", "moe.num_experts=4", "moe.experts_per_rank=1", "comm.policy=lina"]
    factors = [1, 1, 2, 2, 1, 1]
    repacked = spawn(_repack_worker, tmp_path / "repacked", 4, overrides, factors)
    unpacked = spawn(_repack_worker, tmp_path / "unpacked", 4, overrides, [1] * len(factors))
    assert [res["layouts"][2] for res in repacked] == [(2, 2, 0), (2, 2, 1), (2, 2, 0), (2, 2, 1)]
    assert [layout[:2] for layout in repacked[0]["layouts"]] == [(4, 1), (4, 1), (2, 2), (2, 2), (4, 1), (4, 1)]
    for res in repacked:
        assert res["losses"] == pytest.approx(unpacked[0]["losses"], rel=1e-5)
        for step, state in enumerate(res["states"]):
            for name, tensors in state.items():
                assert tensors.keys() == unpacked[0]["states"][step][name].keys()
                for key, value in tensors.items():
                    if is_expert_param(name) and key != "step":  # this rank's slice of the stack
                        epr = 4 // res["layouts"][step][0]  # experts / expert-parallel size
                        first = res["layouts"][step][2] * epr
                        expected = _all_experts(unpacked, step, name, key)[first : first + epr]
                    else:
                        expected = unpacked[0]["states"][step][name][key]
                    # Up to the first exchange both runs did the same arithmetic, and it copies: exact.
                    # Later, float reordering; Adam turns the noise of ~zero gradients (attention key
                    # biases) into updates of up to lr, hence a tolerance on the tensor's scale.
                    tol = (
                        dict(rtol=0, atol=0) if step <= 2 else dict(rtol=1e-4, atol=1e-3 * float(expected.abs().max()))
                    )
                    torch.testing.assert_close(
                        value,
                        expected,
                        **tol,
                        msg=lambda m, step=step, name=name, key=key: f"step {step} {name} {key}: {m}",
                    )


def _nccl_priority_worker(rank, world, init_file, out_dir):
    """Build the groups on NCCL with high_priority_ep and save each group's stream priority."""
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"file://{init_file}", rank=rank, world_size=world, device_id=torch.device("cuda", rank)
    )
    groups = build_groups(expert_layout(world, world, 1), "cuda", 60.0, high_priority_ep=True)
    high_priority = {
        name: group._get_backend(torch.device("cuda")).options.is_high_priority_stream
        for name, group in (
            ("ep", groups.ep_group),
            ("dp", groups.expert_grad_group),
            ("dense", groups.dense_grad_group),
        )
    }
    torch.save(high_priority, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_nccl_available(), reason="torch is built without NCCL")
@pytest.mark.skipif(not torch.cuda.is_available(), reason="NCCL process groups need a GPU")
def test_nccl_all_to_all_groups_get_high_priority_streams(tmp_path):
    """Lina's priority on NCCL: the "ep" groups (token all-to-alls) run on high-priority CUDA streams,
    the gradient all-reduce groups do not."""
    world = min(2, torch.cuda.device_count())
    for res in spawn(_nccl_priority_worker, tmp_path, world):
        assert res == {"ep": True, "dp": False, "dense": False}
