"""The step-level external validation: its entries load, map to the suite's config and are priced."""

import copy

import numpy as np
import pytest
import yaml

from experiments import external_steps as es
from moe_core.config.load import load_config
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology

SMALL = {  # a small dense GPT on one H100 node, 2-byte precision
    "id": "small",
    "what": "a hand-checkable entry",
    "source": "this test",
    "kind": "dense",
    "hardware": {"gpu": "H100", "nodes": 1, "gpus_per_node": 1},
    "model": {
        "n_layers": 2,
        "d_model": 256,
        "n_heads": 4,
        "d_ff": 1024,
        "ffn_type": "gelu",
        "vocab_size": 1024,
        "seq_len": 128,
    },
    "parallel": {"tp": 1},
    "batch": {"micro_batch": 4, "global_batch": 4},
    "precision": "bf16",
    "recompute": "none",
    "metric": "tokens_per_s_per_gpu",
    "published": 100000.0,
    "profile": "h100-ndr-cluster",
    "stack": "llm-foundry / Composer",
}


def entry(**changes):
    e = copy.deepcopy(SMALL)
    for key, value in changes.items():
        section, _, name = key.partition(".")
        if name:
            e[section][name] = value
        else:
            e[key] = value
    return e


def test_every_entry_is_priced_or_excluded_with_a_reason():
    entries = es.load_entries()
    priced = [e for e in entries if "excluded" not in e]
    assert priced and len(entries) > len(priced)
    for e in entries:
        assert "excluded" in e or e["profile"] and e["metric"] in es.METRICS
    assert es.record_points(None) == [e["id"] for e in priced]


def test_published_step_follows_the_metric_definition():
    e = entry(**{"hardware.gpus_per_node": 8, "batch.global_batch": 48, "model.seq_len": 2048, "published": 10643})
    assert es.published_step_s(e) == pytest.approx(48 * 2048 / (10643 * 8))
    assert es.metric_of_step(e, es.published_step_s(e) / 2) == pytest.approx(2 * 10643)
    assert es.published_step_s(entry(metric="step_s", published=1.5)) == 1.5


def test_one_gpu_step_is_the_compute_models_sum():
    """One GPU: no communication, so the step is its compute ops' time: their sum with launches in
    series, and with the host issuing ahead no less than either the device's work or the host's launches."""
    cfg = es.entry_config(SMALL)
    model = StepModel(cfg, build_topology(cfg.hardware))
    ops, _ = model.build()
    assert all(op.transfer is None for op in ops)
    serial = sum(op.duration_s for op in ops)
    work = sum(op.duration_s for op in model._without_launches())
    result = es.simulate_entry(SMALL)
    assert max(work, serial - work) <= result["predicted_step_s"] * (1 + 1e-9) and result["predicted_step_s"] < serial
    assert result["step_error"] == pytest.approx(result["predicted_step_s"] / es.published_step_s(SMALL) - 1)
    free = load_config(overrides=[*es.entry_overrides(SMALL), "hardware.kernel_launch_us=0"], whole_run=False)
    launch_free = StepModel(free, build_topology(free.hardware))  # nothing to issue: the ops one after another
    assert launch_free.run().timeline.makespan_s == pytest.approx(sum(op.duration_s for op in launch_free.build()[0]))


def test_llama_blocks_map_to_grouped_query_attention_and_swiglu():
    cfg = es.entry_config(entry(**{"model.ffn_type": "swiglu", "model.n_kv_heads": 2}))
    assert (cfg.model.ffn_activation, cfg.model.n_kv_heads) == ("swiglu", 2)
    assert es.entry_config(SMALL).model.ffn_activation == "relu"  # GELU: the same two GEMMs


def test_megatrons_flops_are_narayanan_et_al_s_formula_for_a_gpt():
    """SC'21 appendix, without recomputation: 72 B s l h^2 (1 + s / 6h + V / 12 l h) for a GPT with d_ff = 4h."""
    e = entry(metric="model_tflops_per_gpu", flops_formula="megatron-lm", **{"model.d_ff": 1024})
    B, s, layers, h, V = 4, 128, 2, 256, 1024
    assert es.megatron_flops(e) == pytest.approx(72 * B * s * layers * h**2 * (1 + s / (6 * h) + V / (12 * layers * h)))
    # top-2 SwiGLU experts of d_ff: the MLP term x 2 x 3/2; 2 of 4 key/value heads: K and V halved
    moe = entry(kind="moe", **{"model.ffn_type": "swiglu", "model.top_k": 2, "model.n_kv_heads": 2})
    per_layer = (1 + 2 / 4 + s / h) + 4 * 2 * 1.5 + V / (2 * layers * h)
    assert es.megatron_flops(moe) == pytest.approx(12 * B * s * layers * h**2 * per_layer)
    assert es.published_step_s(e) == pytest.approx(es.megatron_flops(e) / (100000.0 * 1e12))


def test_an_moe_entry_maps_to_megatrons_routing_and_layout():
    moe = {"num_experts": 4, "top_k": 2, "capacity_factor": "dropless", "moe_layer_pattern": "every layer"}
    e = entry(kind="moe", **{f"model.{k}": v for k, v in moe.items()})
    e["hardware"]["gpus_per_node"], e["parallel"] = 8, {"tp": 2, "ep": 4, "etp": 1}
    e["batch"]["global_batch"] = 16
    cfg = es.entry_config(e)
    assert (cfg.moe.num_experts, cfg.moe.experts_per_rank, cfg.moe.top_k, cfg.model.moe_every) == (4, 1, 2, 1)
    assert (
        cfg.moe.dispatcher == "dropless"
        and cfg.moe.second_expert_policy == "always"
        and cfg.moe.expert_tensor_parallel == 1
    )
    assert es.simulate_entry(e)["predicted_step_s"] > 0
    e["model"]["shared_experts"] = 1
    with pytest.raises(ValueError, match="no shared expert"):
        es._checked(e, "entry")


def test_tensor_parallel_adds_megatrons_per_layer_all_reduces():
    """TP=2: one all-reduce of the layer's activations after attention and after the FFN, forward and backward."""
    e = entry(**{"hardware.gpus_per_node": 2, "parallel.tp": 2})
    cfg = es.entry_config(e)
    topo = build_topology(cfg.hardware)
    ops, _ = StepModel(cfg, topo).build()
    tp_ops = [op for op in ops if op.phase == "tp_allreduce"]
    assert len(tp_ops) == 4 * SMALL["model"]["n_layers"]
    activation_bytes = SMALL["batch"]["global_batch"] * 128 * 256 * 2  # tokens x d_model x bf16
    ring = topo.ring(np.arange(2), activation_bytes, "all_reduce")
    # Each of the 2 ranks sends the whole buffer once (two halves), up to the NVSwitch and down to its peer.
    assert np.sum(ring.nbytes) == pytest.approx(2 * 2 * activation_bytes)
    for op in tp_ops:
        assert np.sum(op.transfer.nbytes) == pytest.approx(np.sum(ring.nbytes))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"published": -1}, "published must be a positive number"),
        ({"stack": None}, r"missing \['stack'\]"),
        ({"precision": "fp8"}, "precision 'fp8' is not priced"),
        ({"profile": "no-such-gpu"}, "unknown profile 'no-such-gpu'"),
        ({"model.d_ff": None}, "model.d_ff"),
        ({"metric": "mfu"}, "metric 'mfu' is not priced"),
        ({"batch.global_batch": 3, "hardware.gpus_per_node": 2}, "global_batch divisible by dp"),
        ({"excluded": ""}, "excluded must say why"),
        ({"kind": "sparse"}, "kind must be dense or moe"),
        ({"model.ffn_type": "geglu"}, "model.ffn_type must be one of"),
        ({"recompute_layers": 1}, "recompute_layers counts blocks of full recompute"),
        ({"recompute": "full", "recompute_layers": 3}, "recompute_layers counts blocks of full recompute"),
    ],
)
def test_bad_entries_are_refused(tmp_path, changes, message):
    path = tmp_path / "steps.yaml"
    path.write_text(yaml.safe_dump({"entries": [entry(**changes)]}))
    with pytest.raises(ValueError, match=message):
        es.load_entries(path)


def test_duplicate_ids_are_refused(tmp_path):
    path = tmp_path / "steps.yaml"
    path.write_text(yaml.safe_dump({"entries": [SMALL, SMALL]}))
    with pytest.raises(ValueError, match="duplicate ids"):
        es.load_entries(path)


@pytest.mark.parametrize(("precision", "scaling"), [("fp8-delayed", "delayed"), ("fp8-current", "current")])
def test_an_fp8_entry_runs_its_linear_layers_in_fp8(precision, scaling):
    cfg = es.entry_config(entry(precision=precision, recompute="full", recompute_layers=1))
    assert (cfg.train.dtype, cfg.train.fp8) == ("bfloat16", scaling)
    assert (cfg.train.recompute, cfg.train.recompute_layers) == ("full", 1)
    bf16 = es.simulate_entry(entry())
    assert es.simulate_entry(entry(precision=precision))["predicted_step_s"] != bf16["predicted_step_s"]


def test_the_stack_decides_whether_the_optimizer_is_fused():
    """Megatron's and torchtitan's AdamW are fused (7 passes); Composer's is torch's foreach (21)."""
    for stack, fused in (
        ("NeMo 24.07 container (Megatron-Core)", True),
        ("torchtitan, FSDP2", True),
        ("llm-foundry / Composer (PyTorch FSDP)", False),
    ):
        assert es.entry_config(entry(stack=stack)).hardware.fused_optimizer is fused
    foreach, fused = (es.simulate_entry(entry(stack=s))["predicted_step_s"] for s in ("Composer", "Megatron-Core"))
    assert fused < foreach
