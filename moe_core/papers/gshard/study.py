"""GShard's scaling study on the TPU v3 torus: its experiments, their points and how each is simulated.

experiments/gshard.py writes a record of each point, analysis/papers/gshard.py reads them. A point is
simulated on the committed torus profile with as many cores as its model has experts
(``gshard.profiles``); :func:`step_overrides` builds the suite's stand-in of a Table 1 model
(models.py), the step simulator (moe_core.sim.step) times it, roofline.py bounds its components and
memory.py sizes it per core. Sensitivity runs (``SCALING_UNSTATED``) repeat the scaling points at the
other ends of the unstated parameters' ranges. :func:`record_points` names every point without
simulating any, for the workflow.
"""

from __future__ import annotations

from omegaconf import DictConfig

from moe_core.papers.gshard.config import COLLECTIVES, MEMORY, PAPER, SCALING, SCALING_UNSTATED
from moe_core.papers.gshard.memory import memory_per_core
from moe_core.papers.gshard.models import (
    D_FF,
    D_MODEL,
    MODELS,
    N_HEADS,
    TARGET_VOCAB,
    GShardModel,
    simulated_batch_tokens,
    tokens_per_core,
)
from moe_core.papers.gshard.roofline import line_rate_s, roofline_ms
from moe_core.papers.gshard.torus import torus_slice
from moe_core.records.predictions import Prediction
from moe_core.schema.derive import derive_config, hardware_profile
from moe_core.schema.points import own_layout, point_params, unstated_variants
from moe_core.schema.sections import ConfigError
from moe_core.sim.collectives import footprint, simulate_collective
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology
from moe_core.units import GB

COLLECTIVE_KINDS = ("all_to_all", "all_reduce")


def scaling_point(model: GShardModel) -> str:
    return f"model{model.id}_{model.experts}e_{model.n_layers}l"


def memory_point(n_layers: int, experts: int) -> str:
    return f"{n_layers}l_{experts}e"


def collective_point(kind: str, partitions: int, size_bytes: int) -> str:
    return f"{kind}_p{partitions}_{size_bytes}"


def profiles_by_cores(cfg: DictConfig) -> dict[int, str]:
    """Cores -> the profile of ``gshard.profiles`` with that many (chips x ``gshard.cores_per_chip``);
    ConfigError for a profile that is not a torus of one device per chip."""
    by_cores = {}
    for i, name in enumerate(cfg.gshard.profiles):
        hw = hardware_profile(name)
        if hw.topology != "torus2d" or hw.devices_per_node != 1:
            raise ConfigError(
                f"config key 'gshard.profiles[{i}]': '{name}' is not a TPU torus profile "
                f"(topology torus2d, one device per chip); got topology {hw.topology}, "
                f"{hw.devices_per_node} devices per node"
            )
        by_cores[hw.nodes * cfg.gshard.cores_per_chip] = name
    return by_cores


def profile_for(cfg: DictConfig, cores: int) -> str:
    """The profile of ``gshard.profiles`` with ``cores`` cores; ConfigError naming those it has."""
    by_cores = profiles_by_cores(cfg)
    if cores not in by_cores:
        raise ConfigError(
            f"config key 'gshard.profiles': no profile has {cores} cores (chips x gshard.cores_per_chip="
            f"{cfg.gshard.cores_per_chip}); the profiles have {sorted(by_cores)}"
        )
    return by_cores[cores]


def recompute(model: GShardModel) -> str:
    """GShard rematerializes the 36- and 60-layer models and not the 12- and 24-layer ones (Fig 7's
    text: rematerialization takes 28% of the cycles at 36 layers, 34% at 60, 0% at 12 and 24; a whole
    forward recomputed before the backward is a quarter of a step's FLOPs): every block recomputes."""
    return "full" if model.n_layers >= 36 else "none"


def step_overrides(cfg: DictConfig, model: GShardModel) -> list[str]:
    """The suite's config of ``model``'s stand-in (models.py): all its layers, every other FFN MoE, one
    expert per core on the profile with its cores, each chip holding its cores' share of one side."""
    g = cfg.gshard
    chip_tokens = tokens_per_core(model, g.group_size, g.max_groups_per_core) * g.cores_per_chip
    return [
        *own_layout(),
        f"hardware_profile={profile_for(cfg, model.cores)}",
        f"paper={PAPER}",
        f"parallel.world_size={model.cores // g.cores_per_chip}",
        f"moe.num_experts={model.experts}",
        f"moe.experts_per_rank={g.cores_per_chip}",
        "moe.top_k=2",
        f"moe.capacity_factor={g.capacity_factor}",
        "moe.min_capacity=0",  # GShard's C = 2S/E, no floor
        f"moe.group_size={g.group_size}",
        "moe.permute=einsum",  # Algorithm 2's dispatch and combine einsums, GSEC,GSM->EGCM and back
        f"model.d_model={D_MODEL}",
        f"model.n_heads={N_HEADS}",
        f"model.d_ff={D_FF}",
        f"model.n_layers={model.n_layers}",
        "model.moe_every=2",
        f"model.seq_len={g.seq_len}",
        f"model.vocab_size={TARGET_VOCAB}",
        f"train.batch_size={chip_tokens // g.seq_len}",
        "train.dtype=float32",
        f"train.recompute={recompute(model)}",
        f"comm.policy={g.policy}",
    ]


def memory_GB(cfg: DictConfig, experts: int, n_layers: int, tokens: int) -> dict[str, float]:
    """Memory per core by kind (GB), its total, and the total's share of the core's HBM."""
    g = cfg.gshard
    kinds = memory_per_core(experts, n_layers, experts, tokens, g.seq_len, g.group_size, g.capacity_factor)
    metrics = {name.replace("_bytes", "_GB"): size / GB for name, size in kinds.items()}
    metrics["memory_GB"] = sum(kinds.values()) / GB
    metrics["memory_share_of_device"] = metrics["memory_GB"] / g.device_memory_GB
    return metrics


def scaling_runs(cfg: DictConfig, model: GShardModel) -> dict[str, list[str]]:
    """Prediction name -> overrides: ``model`` at the chosen values of the unstated parameters, and at the
    other ends of their ranges (``SCALING_UNSTATED``); named as :func:`scaling_names` names them."""
    name, overrides = scaling_point(model), step_overrides(cfg, model)
    runs = {name: overrides}
    for variant, changed in unstated_variants(cfg, name, overrides, SCALING_UNSTATED).items():
        # the stand-in's batch follows gshard.max_groups_per_core: rebuilt with the variant's settings
        runs[variant] = [*step_overrides(derive_config(cfg, changed), model), *changed[len(overrides) :]]
    return runs


def scaling_names(cfg: DictConfig, model: GShardModel) -> list[str]:
    """The point names of :func:`scaling_runs` without building their configs (the workflow reads
    them at every parse; deriving the variants' configs takes seconds)."""
    name = scaling_point(model)
    return [name, *unstated_variants(cfg, name, [], SCALING_UNSTATED)]


def all_scaling_runs(cfg: DictConfig) -> list[tuple[GShardModel, str, list[str]]]:
    """``(model, point name, overrides)`` of every scaling run of ``gshard.models`` (the profiles
    checked first: a bad one fails before any simulation)."""
    profiles_by_cores(cfg)
    models = [MODELS[i] for i in cfg.gshard.models]
    return [(model, name, overrides) for model in models for name, overrides in scaling_runs(cfg, model).items()]


def scaling(cfg: DictConfig, model: GShardModel, name: str, overrides: list[str]) -> Prediction:
    """One model of Table 1 simulated on its profile (one run of ``scaling_runs``): step, rooflines,
    memory as trained."""
    point = derive_config(cfg, overrides)
    g = point.gshard  # a sensitivity run's own (gshard.max_groups_per_core)
    topo = build_topology(point.hardware)
    step = StepModel(point, topo).run().metrics()
    roof = roofline_ms(point, topo)
    moe_roofline = roof["gate_roofline_ms"] + roof["expert_roofline_ms"]
    metrics = {
        **step,
        **roof,
        "steps_per_s": 1e3 / step["step_ms"],
        "moe_roofline_fraction": moe_roofline / (step["gate_ms"] + step["expert_ms"]),
        **memory_GB(cfg, model.experts, model.n_layers, tokens_per_core(model, g.group_size, g.max_groups_per_core)),
    }
    params = {
        **point_params(point),
        "gshard_model": model.id,
        "n_layers": model.n_layers,
        "cores": model.cores,
        "chips": model.cores // g.cores_per_chip,
        "batch_tokens": simulated_batch_tokens(model, g.group_size, g.max_groups_per_core),
        "group_size": g.group_size,
        "seq_len": g.seq_len,
    }
    return Prediction(SCALING, name, point.hardware.name, params, metrics)


def memory_points(cfg: DictConfig) -> list[Prediction]:
    """Fig 7: memory per core of every ``gshard.memory_layers`` x profile's expert count, at one group
    of ``gshard.group_size`` tokens per core and side (N/D constant)."""
    out = []
    for experts, name in sorted(profiles_by_cores(cfg).items()):
        for n_layers in cfg.gshard.memory_layers:
            params = {
                "num_experts": experts,
                "n_layers": n_layers,
                "cores": experts,
                "group_size": cfg.gshard.group_size,
            }
            metrics = memory_GB(cfg, experts, n_layers, cfg.gshard.group_size)
            out.append(Prediction(MEMORY, memory_point(n_layers, experts), name, params, metrics, backend="model"))
    return out


def collective_points(cfg: DictConfig) -> list[Prediction]:
    """Fig 9: each collective of each size per partition on each torus slice of the largest profile."""
    g = cfg.gshard
    by_cores = profiles_by_cores(cfg)
    pod = hardware_profile(by_cores[max(by_cores)])
    return [
        collective(cfg, pod, partitions, kind, size)
        for partitions in g.collective_partitions
        for kind in COLLECTIVE_KINDS
        for size in g.collective_bytes_per_partition
    ]


def collective(cfg: DictConfig, pod: DictConfig, partitions: int, kind: str, size: int) -> Prediction:
    """One collective of ``size`` bytes per partition over ``partitions`` cores of ``pod``'s chips. A chip
    holds ``gshard.cores_per_chip`` partitions: it sends their all-to-all buffers together, and
    all-reduces one buffer (its cores' partial sums added on the chip first)."""
    chips = partitions // cfg.gshard.cores_per_chip
    hw = torus_slice(pod, chips)
    topo = build_topology(hw)
    chip_bytes = size * (cfg.gshard.cores_per_chip if kind == "all_to_all" else 1)
    metrics = {
        "time_ms": simulate_collective(hw, topo, {"collective": kind, "world_size": chips, "size_bytes": chip_bytes}),
        "line_rate_ms": 1e3 * line_rate_s(footprint(topo, kind, chips, chip_bytes), topo),
    }
    x, y = hw.torus_dims
    params = {"collective": kind, "partitions": partitions, "chips": chips, "world_size": chips}
    params |= {"torus_x": x, "torus_y": y, "size_bytes": size}
    return Prediction(COLLECTIVES, collective_point(kind, partitions, size), pod.name, params, metrics)


def record_points(cfg: DictConfig) -> dict[str, list[str]]:
    """Experiment -> the point names one run writes (pure and quick: the workflow declares them)."""
    g = cfg.gshard
    experts = sorted(profiles_by_cores(cfg))
    return {
        SCALING: [name for i in g.models for name in scaling_names(cfg, MODELS[i])],
        MEMORY: [memory_point(n_layers, e) for e in experts for n_layers in g.memory_layers],
        COLLECTIVES: [
            collective_point(kind, p, size)
            for p in g.collective_partitions
            for kind in COLLECTIVE_KINDS
            for size in g.collective_bytes_per_partition
        ],
    }
