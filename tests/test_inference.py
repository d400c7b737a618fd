"""Placed expert-parallel inference (moe_core.inference) equals a single-process reference.

Each case spawns ``world`` gloo ranks (file:// rendezvous, no ports). Every rank builds the same
seeded model, swaps its MoE layers for PlacedMoE and runs its own batch under several placements:
hand-made ones (a replicated expert, a device hosting nothing, so receiving zero tokens) and every
Lina policy driven by a real path profile, with the library all-to-all or Aurora's ordered one.
The reference runs the plain dropless model on the ranks' batches concatenated: neither placement
nor transmission order may change the math.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moe_core.config.load import load_config
from moe_core.dispatch import routes_dropless
from moe_core.host.timing import PhaseTimer
from moe_core.model.data import MarkovTokens
from moe_core.model.transformer import MoETransformer
from moe_core.papers.lina.inference import (
    Scheduler,
    attach,
    batch_metrics,
    layer_region,
    top1_choices,
    use_inference_gating,
)
from moe_core.papers.lina.placement import Placement, profile_paths

SMALL = [
    "model.vocab_size=64",
    "model.d_model=32",
    "model.n_layers=4",
    "model.moe_every=1",
    "model.n_heads=2",
    "model.d_ff=48",
    "model.seq_len=16",
    "train.batch_size=2",
    "moe.num_experts=4",
    "train.data_zipf=1.5",
]
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
    model = MoETransformer(cfg, dropless=routes_dropless(cfg)).eval()
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


def _worker(rank, world, init_file, top_k, a2a_policy, profile, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    cfg = _config(world)
    model = _model(cfg, top_k)
    logits = {}
    model.head.register_forward_hook(lambda module, args, out: logits.__setitem__("last", out))
    placed = attach(model, top_k, PhaseTimer(enabled=False), a2a_policy=a2a_policy)
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


@pytest.mark.parametrize("world,top_k,a2a_policy", [(2, 1, "library"), (4, 2, "library"), (4, 1, "aurora-rcs")])
def test_placed_inference_equals_single_process(tmp_path, world, top_k, a2a_policy):
    cfg = _config(world)
    reference = _model(cfg, top_k)
    profile = profile_paths(top1_choices(reference, *_batch(cfg, 100, range(world))), cfg.moe.num_experts)
    mp.spawn(
        _worker,
        args=(world, str(tmp_path / "init"), top_k, a2a_policy, profile, str(tmp_path)),
        nprocs=world,
        join=True,
    )
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]

    per_rank = cfg.train.batch_size
    for step in range(BATCHES):
        logits = {}
        reference.head.register_forward_hook(lambda module, args, out, logits=logits: logits.__setitem__("ref", out))
        with torch.no_grad():
            reference(*_batch(cfg, step, range(world)))
        # expert 0 has rows in every layer, so each of its replicas computes something
        assert all(int((layer.last_gating.expert_index == 0).sum()) >= world for layer in reference.moe_layers())
        for rank, res in enumerate(results):
            expected = logits["ref"][rank * per_rank : (rank + 1) * per_rank]
            for name in [*FIXED[world], *POLICIES]:
                torch.testing.assert_close(
                    res[name]["logits"][step],
                    expected,
                    rtol=1e-5,
                    atol=1e-5,
                    msg=lambda m, name=name, rank=rank, step=step: f"{name}, rank {rank}, batch {step}: {m}",
                )
            # ideal forces a different (balanced) routing: other logits, every device the same rows
            assert not torch.allclose(res["ideal"]["logits"][step], expected)
        reference.head._forward_hooks.clear()
    assert results[0]["ideal"]["imbalance"] == [1.0] * BATCHES * len(reference.moe_layers())
    assert results[0]["lina-no-finetune"]["replanned"] == [False] * BATCHES * len(reference.moe_layers())


@pytest.mark.slow
def test_measured_inference_writes_a_record_per_policy_with_the_same_outputs(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "experiments",
        "inference",
        "parallel.world_size=2",
        "moe.num_experts=4",
        "moe.experts_per_rank=2",
        "model.n_layers=4",
        "model.moe_every=1",
        "train.data_zipf=1.5",
        "inference.train_steps=10",
        "inference.batches=3",
        "inference.profile_batches=2",
        f"results_dir={tmp_path}",
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "WANDB_MODE": "disabled"}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = {
        json.loads(p.read_text())["params"]["policy"]: json.loads(p.read_text())
        for p in (tmp_path / "raw" / "lina" / "inference").glob("*.json")
    }
    assert set(records) == {"ideal", "static", "lina", "lina-no-estimation", "lina-no-finetune"}
    nll = [r["samples"]["nll"] for p, r in records.items() if p != "ideal"]  # per batch, same tokens
    for other in nll[1:]:
        assert other == pytest.approx(nll[0], rel=1e-5)  # placement never changes the math
    for policy in ("lina", "lina-no-estimation", "lina-no-finetune"):
        m = records[policy]["metrics"]
        assert 0 <= m["estimation_accuracy"]["value"] <= 1 and 0 <= m["replan_rate"]["value"] <= 1
        assert m["schedule_decision_ms"]["value"] > 0
    assert records["lina-no-finetune"]["metrics"]["replan_rate"]["value"] == 0
    for record in records.values():
        m, samples = record["metrics"], record["samples"]
        # the whole forward (Fig 16) contains the MoE layers (Fig 17), which contain their all-to-alls (Fig 18);
        # each metric keeps its own worst rank, so only one part at a time is bounded by the whole
        for i, forward in enumerate(samples["forward_ms"]):
            moe = samples["moe_layer_ms"][i]
            assert forward >= moe >= max(samples["dispatch_a2a_ms"][i], samples["a2a_layer0_ms"][i])
        per_layer = [samples[f"a2a_layer{layer}_ms"] for layer in range(4)]  # one per MoE layer, 3 batches each
        assert all(len(s) == 3 and min(s) > 0 for s in per_layer) and "a2a_layer4_ms" not in samples
        assert 0 < m["path_topk_share_k1"]["value"] <= m["path_topk_share_k2"]["value"] <= 1
        assert "popularity_ratio" not in m or m["popularity_ratio"]["value"] >= 1


def test_unknown_inference_policy_exits_2_naming_the_key(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", "inference", "inference.policies=[fifo]", f"results_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "inference.policies" in proc.stderr
    assert not any(tmp_path.rglob("*.json"))


def test_batch_metrics_sum_phases_over_layers_and_keep_each_layers_all_to_all():
    ms = {
        layer_region("gate", 0): 1.0,
        layer_region("dispatch_a2a", 0): 2.0,
        layer_region("combine_a2a", 0): 3.0,
        layer_region("expert", 1): 4.0,
        layer_region("dispatch_a2a", 1): 0.5,
        "forward": 99.0,
    }
    m = batch_metrics(ms, num_layers=2)
    assert m["dispatch_a2a_ms"] == 2.5 and m["combine_a2a_ms"] == 3.0 and m["plan_ms"] == 0.0
    assert m["moe_layer_ms"] == pytest.approx(10.5)
    assert m["a2a_layer0_ms"] == 5.0 and m["a2a_layer1_ms"] == 0.5
    assert set(m) == {
        "gate_ms",
        "plan_ms",
        "dispatch_a2a_ms",
        "expert_ms",
        "combine_a2a_ms",
        "moe_layer_ms",
        "a2a_layer0_ms",
        "a2a_layer1_ms",
    }


def test_scheduler_times_every_decision_and_only_the_checks_that_keep_the_plan():
    choices = np.array([[0, 0, 1, 2], [1, 1, 2, 3]])
    profile = profile_paths(choices, num_experts=4, path_length=1)
    lina = Scheduler("lina", profile, num_devices=2, top_k=1, keep=1)
    lina.decide(0, choices[0], estimate=np.array([2.0, 1, 1, 0]), actual=np.array([2.0, 1, 1, 0]))  # right
    lina.decide(1, choices[1], estimate=np.array([0.0, 0, 1, 3]), actual=np.array([0.0, 2, 1, 1]))  # re-plans
    assert lina.estimate_right == [True, False] and lina.replanned == [False, True]
    assert len(lina.decide_ms) == 2 and len(lina.check_ms) == 1 and min(lina.decide_ms + lina.check_ms) > 0
    static = Scheduler("static", profile, num_devices=2, top_k=1, keep=1)
    static.decide(0, choices[0], np.zeros(4), np.array([2.0, 1, 1, 0]))
    assert static.decide_ms == static.check_ms == []  # a fixed placement decides nothing
    lina.reset_stats()
    assert lina.decide_ms == lina.check_ms == []
