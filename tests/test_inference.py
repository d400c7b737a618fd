"""Placed expert-parallel inference (moe_core.inference) equals a single-process reference.

Each case spawns ``world`` gloo ranks (file:// rendezvous, no ports). Every rank builds the same
seeded model, swaps its MoE layers for PlacedMoE and runs its own batch under several placements:
hand-made ones (a replicated expert, a device hosting nothing, so receiving zero tokens) and every
Lina policy driven by a real path profile. The reference runs the plain dropless model on the
ranks' batches concatenated: placement must never change the math.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moe_core.config import load_config
from moe_core.data import MarkovTokens
from moe_core.inference import Scheduler, attach, top1_choices, use_inference_gating
from moe_core.model import MoETransformer
from moe_core.placement import Placement, profile_paths
from moe_core.timing import PhaseTimer

SMALL = ["model.vocab_size=64", "model.d_model=32", "model.n_layers=4", "model.moe_every=1", "model.n_heads=2",
         "model.d_ff=48", "model.seq_len=16", "train.batch_size=2", "moe.num_experts=4", "train.data_zipf=1.5"]
BATCHES = 2  # the no-estimation ablation uses the previous batch from the second one on

# Hand-made placements per world size: replicated experts, and a device that hosts no expert and so
# receives zero tokens (device 1 of world 2's second case, device 3 of world 4).
FIXED = {
    2: {"all-replicated": ((0, 1), (0, 1), (0, 1), (0, 1)), "device-1-idle": ((0,), (0,), (0,), (0,))},
    4: {"replica-and-idle": ((0, 1), (2,), (2,), (0, 1, 2))},
}
POLICIES = ["static", "lina", "lina-no-estimation", "lina-no-finetune"]


def _config(world):
    return load_config(overrides=[*SMALL, f"parallel.world_size={world}", f"moe.experts_per_rank={4 // world}"])


def _model(cfg, top_k):
    torch.manual_seed(cfg.train.seed)
    model = MoETransformer(cfg).eval()
    use_inference_gating(model, top_k)
    return model


def _batch(cfg, step, ranks):
    data = MarkovTokens(cfg.model.vocab_size, cfg.train.data_branching, cfg.train.data_zipf, cfg.train.seed)
    batches = [data.batch(cfg.train.batch_size, cfg.model.seq_len, step, r) for r in ranks]
    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])


class FixedScheduler(Scheduler):
    """The static policy with a hand-made placement instead of the training layout."""

    def __init__(self, replicas, profile, world, top_k):
        super().__init__("static", profile, world, top_k, keep=top_k)
        self.fixed = Placement(replicas, world)


def _worker(rank, world, init_file, top_k, profile, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    cfg = _config(world)
    model = _model(cfg, top_k)
    logits = {}
    model.head.register_forward_hook(lambda module, args, out: logits.__setitem__("last", out))
    placed = attach(model, top_k, PhaseTimer(enabled=False))
    schedulers = {name: FixedScheduler(r, profile, world, top_k) for name, r in FIXED[world].items()}
    schedulers |= {p: Scheduler(p, profile, world, top_k, keep=top_k) for p in [*POLICIES, "ideal"]}
    results = {}
    for name, sched in schedulers.items():
        for layer in placed:
            layer.scheduler = sched
        outs = []
        for step in range(BATCHES):
            sched.begin_batch()
            with torch.no_grad():
                model(*_batch(cfg, step, [rank]))
            outs.append(logits["last"])
        results[name] = {"logits": outs, "imbalance": sched.imbalance, "replanned": sched.replanned}
    torch.save(results, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("world,top_k", [(2, 1), (4, 2)])
def test_placed_inference_equals_single_process(tmp_path, world, top_k):
    cfg = _config(world)
    reference = _model(cfg, top_k)
    profile = profile_paths(top1_choices(reference, *_batch(cfg, 100, range(world))), cfg.moe.num_experts)
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), top_k, profile, str(tmp_path)), nprocs=world, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]

    per_rank = cfg.train.batch_size
    for step in range(BATCHES):
        logits = {}
        reference.head.register_forward_hook(lambda module, args, out: logits.__setitem__("ref", out))
        with torch.no_grad():
            reference(*_batch(cfg, step, range(world)))
        # expert 0 has rows in every layer, so each of its replicas computes something
        assert all(int((layer.last_gating.expert_index == 0).sum()) >= world for layer in reference.moe_layers())
        for rank, res in enumerate(results):
            expected = logits["ref"][rank * per_rank:(rank + 1) * per_rank]
            for name in [*FIXED[world], *POLICIES]:
                torch.testing.assert_close(res[name]["logits"][step], expected, rtol=1e-5, atol=1e-5,
                                           msg=lambda m: f"{name}, rank {rank}, batch {step}: {m}")
            # ideal forces a different (balanced) routing: other logits, every device the same rows
            assert not torch.allclose(res["ideal"]["logits"][step], expected)
        reference.head._forward_hooks.clear()
    assert results[0]["ideal"]["imbalance"] == [1.0] * BATCHES * len(reference.moe_layers())
    assert results[0]["lina-no-finetune"]["replanned"] == [False] * BATCHES * len(reference.moe_layers())


@pytest.mark.slow
def test_measured_inference_writes_a_record_per_policy_with_the_same_outputs(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
           "experiments.inference", "parallel.world_size=2", "moe.num_experts=4", "moe.experts_per_rank=2",
           "model.n_layers=4", "model.moe_every=1", "train.data_zipf=1.5", "inference.train_steps=10",
           "inference.batches=3", "inference.profile_batches=2", f"results_dir={tmp_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "WANDB_MODE": "disabled"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = {json.loads(p.read_text())["params"]["policy"]: json.loads(p.read_text())
               for p in (tmp_path / "raw" / "lina" / "inference").glob("*.json")}
    assert set(records) == {"ideal", "static", "lina", "lina-no-estimation", "lina-no-finetune"}
    nll = [r["samples"]["nll"] for p, r in records.items() if p != "ideal"]  # per batch, same tokens
    for other in nll[1:]:
        assert other == pytest.approx(nll[0], rel=1e-5)  # placement never changes the math
    for policy in ("lina", "lina-no-estimation", "lina-no-finetune"):
        m = records[policy]["metrics"]
        assert 0 <= m["estimation_accuracy"]["value"] <= 1 and 0 <= m["replan_rate"]["value"] <= 1
    assert records["lina-no-finetune"]["metrics"]["replan_rate"]["value"] == 0


def test_unknown_inference_policy_exits_2_naming_the_key(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "experiments.inference", "inference.policies=[fifo]",
                           f"results_dir={tmp_path}"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "inference.policies" in proc.stderr
    assert not any(tmp_path.rglob("*.json"))
