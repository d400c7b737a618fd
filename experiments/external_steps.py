"""Step-level external validation: the simulator's training step against published GPU training steps.

    python -m experiments external_steps --config configs/default.yaml

analysis/external_steps.yaml lists published end-to-end training throughputs on real GPU clusters with their
settings. Each entry is either priced or carries ``excluded: "<why>"`` (a mechanism the simulator lacks). A
priced entry is mapped to the suite's own config (a dense GPT: d_model, layers, heads and key/value heads,
d_ff and FFN activation, vocab, sequence; bfloat16; tensor, pipeline (1F1B, interleaved when the source says
so) and data parallelism as the source states them; the per-rank batch global_batch / dp in micro-batches of
the source's size; the source's activation recomputation (every block, or the first ``recompute_layers`` of
each stage); the linear layers in FP8 where the source trains in FP8 (``precision`` fp8-delayed or
fp8-current: Transformer Engine's scaling recipes); FSDP as full data sharding, Megatron's distributed
optimizer as optimizer sharding)
and, for an MoE entry, Megatron's MoE: every layer's FFN top-k experts over ``ep`` ranks, whole (etp 1) or split
as the dense blocks, dropless (routing priced as balanced) or at the stated capacity) and simulated by
``moe_core.sim.pipeline.simulate_step`` on the entry's hardware profile as it is (spec-sheet
values; nothing is fitted to these rows, they are held out). A GELU FFN is priced as the suite's ReLU FFN:
the same two GEMMs and one elementwise kernel per pass; SwiGLU as SwiGLU.

The error is on step time: ``step_error = predicted step / published step - 1``, the published step derived
from the published metric with the source's own definition (``tokens_per_s_per_gpu``: global_batch x seq_len /
(step x GPUs); ``model_tflops_per_gpu``: the iteration's model FLOPs by the source's formula (``flops_formula``:
Megatron-LM's, experiments.external_steps.megatron_flops) / (step x GPUs); ``step_s``: the step
itself). The records also carry the metric predicted the same way.

Records: ``results/raw/common/external_steps/<id>.json`` (mode simulated, backend sim) with metrics
``published``, ``predicted``, ``published_step_s``, ``predicted_step_s``, ``step_error`` and the simulated
step's exposed communication ``exposed_comm_ms``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig
from tqdm import tqdm

from experiments.benchmark import predicted_record, predictions_main, published_entries
from moe_core.config.load import CONFIG_DIR, REPO_ROOT, ConfigError, load_config
from moe_core.records.console import table
from moe_core.sim.pipeline import simulate_step
from moe_core.sim.topology import build_topology

PAPER, EXPERIMENT = "common", "external_steps"
STEPS_FILE = REPO_ROOT / "analysis" / "external_steps.yaml"
REQUIRED_KEYS = ("id", "what", "source", "kind", "hardware", "model", "parallel", "batch", "precision", "metric")
PRICED_KEYS = ("profile", "published", "stack")  # the stack decides the optimizer pricing
MODEL_KEYS = ("n_layers", "d_model", "n_heads", "d_ff", "vocab_size", "seq_len")
METRICS = ("step_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu")  # the metrics a priced entry may carry
FLOPS_FORMULAS = ("megatron-lm",)  # how a source counts the model FLOPs of model_tflops_per_gpu
# A source's precision as the suite's (train.dtype, train.fp8): 2-byte formats on the bf16 peak; FP8 the
# linear layers on the FP8 peak with Transformer Engine's delayed (NeMo) or current (Megatron FP8-CS) scaling
PRECISION = {
    "bf16": ("bfloat16", "none"),
    "fp16": ("bfloat16", "none"),
    "fp8-delayed": ("bfloat16", "delayed"),
    "fp8-current": ("bfloat16", "current"),
}
RECOMPUTE = ("none", "selective", "full")  # a priced entry states its activation recomputation
FSDP = (True, "FULL_SHARD", "FSDP2")  # how sources say their parameters are fully sharded (FSDP, ZeRO-3)
# The suite's FFN for a source's: SwiGLU as it is; GELU as ReLU, the same two GEMMs and one elementwise
# kernel per pass (GELU's few more FLOPs per element are memory-bound either way)
FFN_ACTIVATION = {"swiglu": "swiglu", "gelu": "relu"}
# Stacks whose AdamW update is fused (hardware.fused_optimizer): Megatron's (and NeMo's) FusedAdam from
# Transformer Engine or Apex, torchtitan's optimizer.implementation "fused" default. llm-foundry's
# Composer DecoupledAdamW is torch's AdamW, foreach on CUDA.
FUSED_OPTIMIZER_STACKS = ("Megatron", "NeMo", "torchtitan")


# ----------------------------------------------------------------------------------------------
# The entries


def load_entries(path: str | Path = STEPS_FILE) -> list[dict[str, Any]]:
    """The entries of ``path`` in file order, checked; a bad one raises ValueError naming its id."""
    return published_entries(path, REQUIRED_KEYS, _checked)


def _checked(entry: Any, where: str) -> dict[str, Any]:
    """``entry`` (a mapping with every required key) as it is, or ValueError saying what to fix."""
    if entry["kind"] not in ("dense", "moe"):
        raise ValueError(f"{where}: kind must be dense or moe, got {entry['kind']!r}")
    if "excluded" in entry:
        if not isinstance(entry["excluded"], str) or not entry["excluded"].strip():
            raise ValueError(f"{where}: excluded must say why the entry is not priced")
        return entry
    _check_priced(entry, where)
    return entry


def _check_priced(entry: dict, where: str) -> None:
    """The settings a priced entry needs, or ValueError (or add ``excluded: "<why>"`` instead)."""
    missing = [key for key in PRICED_KEYS if entry.get(key) is None]
    missing += [f"model.{key}" for key in MODEL_KEYS if entry["model"].get(key) is None]
    missing += [f"batch.{key}" for key in ("global_batch",) if entry["batch"].get(key) is None]
    missing += [f"hardware.{key}" for key in ("nodes", "gpus_per_node") if entry["hardware"].get(key) is None]
    if missing:
        raise ValueError(f'{where}: missing {missing}; set them or add excluded: "<why>"')
    if entry["metric"] not in METRICS:
        raise ValueError(f"{where}: metric {entry['metric']!r} is not priced; use one of {list(METRICS)}")
    if entry["metric"] == "model_tflops_per_gpu" and entry.get("flops_formula") not in FLOPS_FORMULAS:
        raise ValueError(f"{where}: model_tflops_per_gpu needs flops_formula, one of {list(FLOPS_FORMULAS)}")
    if entry["kind"] == "moe":
        _check_moe(entry, where)
    if entry["precision"] not in PRECISION:
        raise ValueError(f"{where}: precision {entry['precision']!r} is not priced; use one of {list(PRECISION)}")
    if not (CONFIG_DIR / "hardware" / f"{entry['profile']}.yaml").is_file():
        raise ValueError(f"{where}: unknown profile {entry['profile']!r}; add configs/hardware/<profile>.yaml")
    if entry["model"].get("ffn_type") not in FFN_ACTIVATION:
        raise ValueError(
            f"{where}: model.ffn_type must be one of {list(FFN_ACTIVATION)}, got {entry['model'].get('ffn_type')!r}"
        )
    if entry.get("recompute") not in RECOMPUTE:
        raise ValueError(f"{where}: recompute must be one of {list(RECOMPUTE)}, got {entry.get('recompute')!r}")
    layers = entry.get("recompute_layers", 0)
    if layers and (entry["recompute"] != "full" or not 0 < layers <= entry["model"]["n_layers"]):
        raise ValueError(f"{where}: recompute_layers counts blocks of full recompute, 1 to n_layers; got {layers}")
    gpus, tp, pp = entry_gpus(entry), _axis(entry, "tp"), _axis(entry, "pp")
    if gpus % (tp * pp) or entry["batch"]["global_batch"] % (gpus // (tp * pp)):
        raise ValueError(f"{where}: need GPUs divisible by tp x pp and global_batch divisible by dp = GPUs / (tp x pp)")
    per_rank, micro = _per_rank_batch(entry), _micro_batch(entry)
    if per_rank % micro:
        raise ValueError(f"{where}: micro_batch {micro} must divide the per-rank batch global_batch / dp = {per_rank}")
    if not (isinstance(entry["published"], (int, float)) and entry["published"] > 0):
        raise ValueError(f"{where}: published must be a positive number, got {entry['published']!r}")


def _check_moe(entry: dict, where: str) -> None:
    """What a priced MoE entry must state, in the forms the simulator has."""
    m, par = entry["model"], entry["parallel"]
    missing = [f"model.{key}" for key in ("num_experts", "top_k", "capacity_factor") if m.get(key) is None]
    missing += [f"parallel.{key}" for key in ("ep",) if par.get(key) is None]
    if missing:
        raise ValueError(f'{where}: missing {missing}; set them or add excluded: "<why>"')
    if (
        m.get("moe_layer_pattern") != "every layer"
        or m.get("shared_experts")
        or m.get("expert_d_ff")
        not in (
            None,
            m["d_ff"],
        )
    ):
        raise ValueError(f"{where}: a priced MoE entry has an MoE FFN of d_ff in every layer and no shared expert")
    if par.get("etp") not in (None, 1, _axis(entry, "tp")):
        raise ValueError(f"{where}: parallel.etp must be 1 or parallel.tp, got {par.get('etp')!r}")


def entry_gpus(entry: dict) -> int:
    return entry["hardware"]["nodes"] * entry["hardware"]["gpus_per_node"]


def _axis(entry: dict, name: str) -> int:
    """A parallel axis's size as the source states it; an axis it leaves out is 1."""
    return entry["parallel"].get(name) or 1


def entry_dp(entry: dict) -> int:
    return entry_gpus(entry) // (_axis(entry, "tp") * _axis(entry, "pp"))


def _per_rank_batch(entry: dict) -> int:
    return entry["batch"]["global_batch"] // entry_dp(entry)


def _micro_batch(entry: dict) -> int:
    """Sequences per pass as the source states them; a source that states none runs its batch in one pass."""
    return entry["batch"].get("micro_batch") or _per_rank_batch(entry)


def data_sharding(entry: dict) -> str:
    """How the entry's data-parallel replicas hold the parameters (moe_core.config.load ``parallel.data_sharding``)."""
    p = entry["parallel"]
    if p.get("fsdp") in FSDP:
        return "full"
    return "optimizer" if p.get("distributed_optimizer") else "none"


def record_points(cfg: DictConfig) -> list[str]:
    """Every point one run writes: the priced entries' ids (pure; the workflow declares them)."""
    return [entry["id"] for entry in load_entries() if "excluded" not in entry]


# ----------------------------------------------------------------------------------------------
# An entry as the suite's config, and its step


def entry_overrides(entry: dict) -> list[str]:
    """The config of ``entry``'s training step on its profile: a dense GPT, one rank per GPU, the per-rank
    batch global_batch / dp in passes of the source's micro-batch (gradient accumulation, or the pipeline's
    micro-batches), its recomputation and data sharding."""
    m, gpus = entry["model"], entry_gpus(entry)
    tp, pp = _axis(entry, "tp"), _axis(entry, "pp")
    ranks = gpus // pp  # of one pipeline stage: its experts' layout lives there
    per_rank, micro = _per_rank_batch(entry), _micro_batch(entry)
    return [
        *(_moe_overrides(entry) if entry["kind"] == "moe" else _dense_overrides(ranks // tp)),
        f"hardware_profile={entry['profile']}",
        f"hardware.nodes={entry['hardware']['nodes']}",
        f"hardware.fused_optimizer={fused_optimizer(entry)}",
        f"parallel.world_size={gpus}",
        f"parallel.tensor_parallel={tp}",
        f"parallel.pipeline_parallel={pp}",
        f"parallel.virtual_pipeline={_axis(entry, 'vpp')}",
        f"parallel.data_sharding={data_sharding(entry)}",
        *(f"model.{key}={m[key]}" for key in MODEL_KEYS),
        f"model.n_kv_heads={m.get('n_kv_heads') or 0}",  # grouped-query attention where the source has it
        f"model.head_dim={m.get('head_dim') or 0}",  # Qwen3's 128-wide heads on a narrower d_model
        f"model.ffn_activation={FFN_ACTIVATION[m['ffn_type']]}",
        f"train.batch_size={per_rank}",
        f"train.micro_batches={per_rank // micro}",
        f"train.recompute={entry['recompute']}",
        f"train.recompute_layers={entry.get('recompute_layers', 0)}",  # Megatron --recompute-num-layers
        f"train.dtype={PRECISION[entry['precision']][0]}",
        f"train.fp8={PRECISION[entry['precision']][1]}",
        "comm.bucket_mb=25",  # PyTorch DDP's default bucket
    ]


def fused_optimizer(entry: dict) -> bool:
    """Whether ``entry``'s stack runs a fused AdamW (FUSED_OPTIMIZER_STACKS)."""
    return any(name in entry["stack"] for name in FUSED_OPTIMIZER_STACKS)


def _dense_overrides(experts: int) -> list[str]:
    """A dense GPT; its (unused) experts one per rank of a stage's "tp" slice keep the layout valid."""
    return [f"moe.num_experts={experts}", "moe.experts_per_rank=1", "moe.top_k=1", "model.moe_every=0"]


def _moe_overrides(entry: dict) -> list[str]:
    """Megatron's MoE: every layer's FFN an MoE of ``num_experts`` over ``ep`` ranks, top-k softmax
    routing that keeps every choice, dropless (balanced routing) or at a capacity factor, the experts
    whole (etp 1) or split as the dense blocks (etp = tp)."""
    m, par = entry["model"], entry["parallel"]
    capacity = m["capacity_factor"]
    routing = ["moe.dispatcher=dropless"] if capacity == "dropless" else [f"moe.capacity_factor={capacity}"]
    return [
        f"moe.num_experts={m['num_experts']}",
        f"moe.experts_per_rank={m['num_experts'] // par['ep']}",
        f"moe.top_k={m['top_k']}",
        "moe.second_expert_policy=always",
        "moe.min_capacity=0",
        *routing,
        f"moe.expert_tensor_parallel={0 if par.get('etp') in (None, _axis(entry, 'tp')) else par['etp']}",
        "model.moe_every=1",
    ]


def megatron_flops(entry: dict) -> float:
    """Model FLOPs of one iteration as Megatron-LM counts them (megatron/training/training.py
    num_floating_point_operations; Narayanan et al. SC'21 appendix): 12 B s L h^2 x ((1 + g/a + s/h) q/h
    + ffn/h x top_k x (3/2 with SwiGLU) + V / (2 L h)), with a heads, g key/value heads, q = a x head
    features; the attention core counted whole (no causal halving, as before Megatron's 2025 version)."""
    m = entry["model"]
    h, a, s, layers = m["d_model"], m["n_heads"], m["seq_len"], m["n_layers"]
    g = m.get("n_kv_heads") or a
    q_ratio = a * (m.get("head_dim") or h // a) / h
    routed = m["top_k"] if entry["kind"] == "moe" else 1
    gated = 3 / 2 if m["ffn_type"] == "swiglu" else 1
    per_layer = (1 + g / a + s / h) * q_ratio + m["d_ff"] / h * routed * gated + m["vocab_size"] / (2 * layers * h)
    return 12 * entry["batch"]["global_batch"] * s * layers * h * h * per_layer


def entry_config(entry: dict) -> DictConfig:
    try:
        return load_config(overrides=entry_overrides(entry), whole_run=False)
    except ConfigError as err:
        raise ValueError(f"entry {entry['id']!r}: {err}") from err


def published_step_s(entry: dict) -> float:
    """The published step time, derived from the published metric the way the source defines it."""
    if entry["metric"] == "step_s":
        return float(entry["published"])
    if entry["metric"] == "model_tflops_per_gpu":
        return megatron_flops(entry) / (entry["published"] * 1e12 * entry_gpus(entry))
    tokens = entry["batch"]["global_batch"] * entry["model"]["seq_len"]
    return tokens / (entry["published"] * entry_gpus(entry))


def metric_of_step(entry: dict, step_s: float) -> float:
    """The entry's metric computed from a step time (the inverse of :func:`published_step_s`)."""
    return published_step_s(entry) * entry["published"] / step_s if entry["metric"] != "step_s" else step_s


def simulate_entry(entry: dict) -> dict[str, float]:
    """The simulated step of ``entry``: predicted and published metric and step, the step error."""
    cfg = entry_config(entry)
    sim = simulate_step(cfg, build_topology(cfg.hardware))
    step_s, published_s = sim["step_ms"] / 1e3, published_step_s(entry)
    return {
        "published": float(entry["published"]),
        "predicted": metric_of_step(entry, step_s),
        "published_step_s": published_s,
        "predicted_step_s": step_s,
        "step_error": step_s / published_s - 1,
        "exposed_comm_ms": float(sim["exposed_comm_ms"]),
    }


# ----------------------------------------------------------------------------------------------
# Records and summary


def entry_params(entry: dict) -> dict[str, Any]:
    return {
        "what": entry["what"],
        "kind": entry["kind"],
        "gpu": entry["hardware"]["gpu"],
        "gpus": entry_gpus(entry),
        "measure": entry["metric"],
        "tp": _axis(entry, "tp"),
        "pp": _axis(entry, "pp"),
        "dp": entry_dp(entry),
        "micro_batch": _micro_batch(entry),
        "recompute": entry["recompute"],
        "recompute_layers": entry.get("recompute_layers", 0),
        "precision": entry["precision"],
        "data_sharding": data_sharding(entry),
    }


def step_records(cfg: DictConfig, path: str | Path = STEPS_FILE) -> list[dict]:
    """One predicted record per priced entry of ``path``."""
    records = []
    priced = [entry for entry in load_entries(path) if "excluded" not in entry]
    for entry in tqdm(priced, desc="external steps", file=sys.stderr):
        records.append(
            predicted_record(
                cfg,
                paper=PAPER,
                experiment=EXPERIMENT,
                point=entry["id"],
                hardware=entry["profile"],
                params=entry_params(entry),
                metrics=simulate_entry(entry),
                backend="sim",
            )
        )
    return records


def summary(records: list[dict]) -> str:
    """A per-entry table and the median and 90th percentile |step error|, dense and MoE apart."""
    rows = []
    for r in records:
        p, m = r["params"], {name: value["value"] for name, value in r["metrics"].items()}
        rows.append(
            {
                "id": r["point"],
                "kind": p["kind"],
                "gpus": p["gpus"],
                "published": m["published"],
                "predicted": m["predicted"],
                "step err": m["step_error"],
            }
        )
    lines = [table(rows, floatfmt=("", "", "", ".4g", ".4g", "+.1%"))]
    for kind in ("dense", "moe"):
        errors = np.abs([r["metrics"]["step_error"]["value"] for r in records if r["params"]["kind"] == kind])
        if len(errors):
            lines.append(
                f"{kind}: {len(errors)} entries, median |step error| {np.median(errors):.1%}, "
                f"p90 {np.percentile(errors, 90):.1%}"
            )
        else:
            lines.append(f"{kind}: no entry priced")
    return "\n".join(lines)


def records_with_summary(cfg: DictConfig) -> list[dict]:
    records = step_records(cfg)
    print(summary(records))
    return records


def run(args: argparse.Namespace) -> int:
    """Compute and write the records of ``args`` (experiments.external_steps's command line)."""
    return predictions_main(args, records_with_summary)
