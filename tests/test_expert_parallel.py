"""Expert-parallel MoE equals a single-process reference; policies never change the math.

Each case spawns ``world`` gloo ranks (file:// rendezvous, no ports). Every rank trains the same
seeded model on its own batch; the reference runs one process on the concatenated batch with one
routing group per rank, so routing, capacity drops and random-routing draws are identical.
"""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moe_core import comm
from moe_core.config import load_config
from moe_core.data import MarkovTokens
from moe_core.model import MoETransformer
from moe_core.parallel import build_groups, is_expert_param, shard_experts
from moe_core.policies import Lina, make_policy
from moe_core.timing import PhaseTimer
from moe_core.config import layout_of

SMALL = ["model.vocab_size=64", "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.d_ff=48",
         "model.seq_len=16", "train.batch_size=2", "moe.min_capacity=1", "moe.capacity_factor=1.0"]


def _config(world, experts, per_rank, extra=()):
    return load_config(overrides=[*SMALL, f"parallel.world_size={world}", f"moe.num_experts={experts}",
                                  f"moe.experts_per_rank={per_rank}", *extra])


def _batches(cfg, step, ranks):
    data = MarkovTokens(cfg.model.vocab_size, cfg.train.data_branching, cfg.train.data_zipf, cfg.train.seed)
    return [data.batch(cfg.train.batch_size, cfg.model.seq_len, step, r) for r in ranks]


def _force_uniform_gate(model):
    """Zero gate weights: every token ties and goes to experts 0 and 1, so other ranks get no tokens."""
    for layer in model.moe_layers():
        layer.gate.weight.data.zero_()


def _worker(rank, world, init_file, overrides, steps, uniform_gate, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    cfg = load_config(overrides=overrides)
    groups = build_groups(layout_of(cfg), "cpu", cfg.parallel.timeout_s)
    for group in (groups.ep_group, groups.expert_grad_group, groups.dense_grad_group):
        # a hung peer must end the run within parallel.timeout_s on every communicator
        assert group._get_backend(torch.device("cpu")).options._timeout.total_seconds() == cfg.parallel.timeout_s
    torch.manual_seed(cfg.train.seed)
    model = MoETransformer(cfg)
    if uniform_gate:
        _force_uniform_gate(model)
    shard_experts(model, groups)
    policy = make_policy(cfg.comm.policy, groups, PhaseTimer(), bucket_bytes=4096, partition_bytes=1024)
    policy.attach(model)
    in_flight_at_exchange, launches = _watch_lina(policy)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        (x, y), = _batches(cfg, step, [rank])
        loss, _ = model(x, y)
        loss.backward()
        policy.finish_gradient_sync()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        losses.append(mean_loss.item() / world)
        if step < steps - 1:
            optimizer.step()
            optimizer.zero_grad()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    torch.save({"losses": losses, "grads": grads, "ep_rank": groups.ep_rank, "launches": launches,
                "in_flight_at_exchange": in_flight_at_exchange}, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def _watch_lina(policy):
    """Record, for a Lina policy, how many all-reduce units are unfinished whenever an all-to-all
    exchange starts, and every unit launch."""
    in_flight, launches = [], []
    if not isinstance(policy, Lina):
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

    comm._exchange, comm._exchange_chunks = watched(comm._exchange), watched(comm._exchange_chunks)
    policy._launch_next = watched_launch
    return in_flight, launches


def run_parallel(tmp_path, world, overrides, steps=1, uniform_gate=False):
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), overrides, steps, uniform_gate, str(tmp_path)),
             nprocs=world, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def run_reference(cfg, world, steps=1, uniform_gate=False):
    """One process, all experts local, the ranks' batches concatenated, one routing group per rank."""
    torch.manual_seed(cfg.train.seed)
    model = MoETransformer(cfg)
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
    for res in results:
        assert res["losses"] == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
        for name, grad in res["grads"].items():
            expected = ref_grads[name]
            if is_expert_param(name):  # this rank's slice of the stacked experts
                first = res["ep_rank"] * experts_per_rank
                expected = expected[first:first + experts_per_rank]
            torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("world,experts,per_rank", [(1, 2, 2), (2, 2, 1), (2, 4, 2), (4, 4, 1), (4, 8, 2),
                                                    (4, 4, 2)])
def test_capacity_mode_equals_reference(tmp_path, world, experts, per_rank):
    overrides = [*SMALL, f"parallel.world_size={world}", f"moe.num_experts={experts}",
                 f"moe.experts_per_rank={per_rank}"]
    results = run_parallel(tmp_path, world, overrides)
    ref_losses, ref_grads = run_reference(load_config(overrides=overrides), world)
    assert_matches_reference(results, ref_losses, ref_grads, per_rank)


@pytest.mark.parametrize("world,experts,per_rank", [(2, 4, 2), (4, 4, 1)])
def test_dropless_mode_equals_reference(tmp_path, world, experts, per_rank):
    overrides = [*SMALL, f"parallel.world_size={world}", f"moe.num_experts={experts}",
                 f"moe.experts_per_rank={per_rank}", "moe.dropless=true"]
    results = run_parallel(tmp_path, world, overrides)
    ref_losses, ref_grads = run_reference(load_config(overrides=overrides), world)
    assert_matches_reference(results, ref_losses, ref_grads, per_rank)


def test_rank_receiving_zero_tokens_works(tmp_path):
    """Dropless, all tokens routed to experts 0 and 1: ranks 2 and 3 receive nothing, yet all is exact."""
    overrides = [*SMALL, "parallel.world_size=4", "moe.num_experts=4", "moe.experts_per_rank=1",
                 "moe.dropless=true"]
    results = run_parallel(tmp_path, 4, overrides, uniform_gate=True)
    ref_losses, ref_grads = run_reference(load_config(overrides=overrides), 4, uniform_gate=True)
    assert_matches_reference(results, ref_losses, ref_grads, 1)
    for res in results[2:]:  # idle experts got exactly zero gradient
        assert all(float(g.abs().sum()) == 0.0 for n, g in res["grads"].items() if is_expert_param(n))


POLICY_RUN = [*SMALL, "parallel.world_size=4", "moe.num_experts=4", "moe.experts_per_rank=2"]


@pytest.fixture(scope="module")
def sequential_run(tmp_path_factory):
    return run_parallel(tmp_path_factory.mktemp("sequential"), 4, [*POLICY_RUN, "comm.policy=sequential"], steps=3)


@pytest.mark.parametrize("policy", ["overlap", "lina-priority", "lina-partition", "lina-pipeline"])
def test_policies_give_identical_losses(tmp_path, sequential_run, policy):
    """Scheduling never changes the math: every policy gives sequential's losses and gradients
    (Lina's micro-ops here are 1 KiB, so every tensor is cut into several)."""
    runs = {"sequential": sequential_run, policy: run_parallel(tmp_path, 4, [*POLICY_RUN, f"comm.policy={policy}"], steps=3)}
    for seq, other in zip(runs["sequential"], runs[policy]):
        assert seq["losses"] == pytest.approx(other["losses"], rel=1e-6)
        if policy.startswith("lina"):  # every unit launched once per step; an all-to-all waits behind <= 1
            assert len(other["launches"]) == 3 * len(set(other["launches"])) > 3
            assert max(other["in_flight_at_exchange"]) <= 1
        for name in seq["grads"]:
            torch.testing.assert_close(seq["grads"][name], other["grads"][name], rtol=1e-5, atol=1e-7)
