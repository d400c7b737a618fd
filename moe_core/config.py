"""One structured configuration for every entry point, the workflow and the tests.

Merge order: schema defaults <- YAML files (in the order given) <- command-line ``key=value``
overrides. The schema (the dataclasses below) is the single source of truth: OmegaConf checks every
key and type against it, and :func:`validate` adds the checks a type cannot express (ranges, layout
divisibility). Every failure raises :class:`ConfigError` whose message names the full key, what was
wrong and what is allowed, before any process is started.

The hardware profile is loaded from ``configs/hardware/<hardware_profile>.yaml`` into
``cfg.hardware``.
"""

from __future__ import annotations

import argparse
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"

Policy = Literal["sequential", "overlap", "aurora", "aurora-sjf", "aurora-rcs",  # moe_core.policies.POLICIES
                 "lina-priority", "lina-partition", "lina-pipeline", "lina", "lina-pack"]


class ConfigError(ValueError):
    """A configuration a user wrote is wrong; the message says which key and how to fix it."""


@dataclass
class GpuClass:
    """One class of devices in a heterogeneous cluster (e.g. Aurora's 100/80/50/40 Gb/s GPUs)."""

    name: str = "default"
    count: int = 1  # devices of this class; classes fill the cluster in order
    peak_tflops: float = 0.0
    nic_GBps: float = 0.0  # per device and direction


@dataclass
class CollectiveFit:
    """Calibrated cost terms of one collective (moe_core.sim.calibrate writes these)."""

    alpha_us: float = 0.0  # fixed latency per call
    alpha_step_us: float = 0.0  # latency per algorithm step (ring step, a2a peer)
    efficiency: float = 1.0  # achieved fraction of the bottleneck link's bandwidth
    # Extra time per call inside a training step: the worst rank waits for peers that arrive late
    # (per-rank compute jitter), which a collective timed alone never shows. Fitted on measured steps.
    in_step_us: float = 0.0


@dataclass
class EmulationConfig:
    """Emulated multi-node testbed on one Linux host (measured runs, moe_core.testbed).

    One network namespace per node, joined through a bridge by veth pairs shaped with ``tc tbf``
    in both directions; ranks of a node run inside its namespace.
    """

    enabled: bool = False
    rate_mbit: float = 1000.0  # each node's link, per direction
    burst_kb: int = 256
    latency_ms: float = 50.0  # tbf queue bound (drop threshold), not an added delay


@dataclass
class HardwareConfig:
    """What runs execute on. Measured profiles describe this machine; simulated ones a cluster.

    Bandwidths are bytes/s per direction (GB/s = 1e9 B/s); papers that state bits are converted in
    the YAML, with a comment. 0 means unknown (a measured-only profile).
    """

    name: str = "local-cpu"
    description: str = ""
    device: Literal["cpu", "cuda"] = "cpu"
    backend: Literal["gloo", "nccl"] = "gloo"
    nodes: int = 1
    devices_per_node: int = 4
    # -- network model (moe_core.sim) --
    topology: Literal["cluster", "torus2d"] = "cluster"  # cluster with devices_per_node=1: a big switch
    torus_dims: list[int] = field(default_factory=list)  # [x, y] devices for torus2d
    intra_node_GBps: float = 0.0  # per device (NVLink/NVSwitch class); torus2d: per link
    intra_node_latency_us: float = 0.0
    nic_GBps: float = 0.0  # per NIC
    nics_per_node: int = 1  # = devices_per_node for one NIC per device
    inter_node_latency_us: float = 0.0
    oversubscription: float = 1.0  # node uplink = nics_per_node * nic_GBps / oversubscription
    # -- compute model --
    peak_tflops: float = 0.0  # per device, in the dtype the model computes in
    compute_efficiency: float = 0.5  # fraction of peak the model's GEMMs reach
    # Per op class ("dense", "gate", "expert"), overriding compute_efficiency: routing bookkeeping
    # (softmax, top-k, cumsum) and small expert GEMMs run far from dense-GEMM efficiency. Calibration
    # fits it from the measured phase times.
    phase_efficiency: dict[str, float] = field(default_factory=dict)
    # CPU testbeds: the ranks of a node share this many cores, so each rank computes at
    # peak * min(1, host_cores / ranks on its node), and concurrent collectives share the host for
    # their latency (protocol work); 0 = devices do not share compute (GPUs).
    host_cores: int = 0
    # CPU testbeds: copy throughput of the host's cores, which every byte a collective sends crosses
    # (gloo and TCP run there); 0 = not modelled. Calibration fits it.
    host_GBps: float = 0.0
    gpu_classes: list[GpuClass] = field(default_factory=list)  # heterogeneous devices (optional)
    collectives: dict[str, CollectiveFit] = field(default_factory=dict)  # calibrated terms (optional)
    emulation: EmulationConfig = field(default_factory=EmulationConfig)


@dataclass
class ModelConfig:
    """A small decoder-only transformer; every ``moe_every``-th FFN is an MoE layer (GShard: 2)."""

    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 512  # hidden width of the dense FFNs and of every expert
    seq_len: int = 64
    moe_every: int = 2  # layers 1, 3, 5... (0-based odd) are MoE when 2, as in GShard Fig 3


@dataclass
class MoEConfig:
    """GShard gating and expert layout (reference/papers.md, GShard Algorithm 1)."""

    num_experts: int = 4
    experts_per_rank: int = 1
    top_k: int = 2
    # Capacity per expert and group: C = max(min_capacity, ceil(capacity_factor * top_k * S / E)).
    capacity_factor: float = 1.25
    min_capacity: int = 4
    # Tokens per local dispatch group (GShard's S); 0 = all tokens of a rank form one group.
    group_size: int = 0
    # "random": keep the 2nd expert only if 2*g2 > U(0,1) (GShard); "always": keep it whenever it fits.
    second_expert_policy: Literal["random", "always"] = "random"
    dropless: bool = False  # no capacity: uneven all-to-all splits, no token is ever dropped
    aux_loss_weight: float = 0.01  # GShard's k in L = l_nll + k * l_aux
    # "paper": l_aux = (1/E) sum_e (c_e/S) m_e (uniform routing gives 1/E^2 * E = 1/E);
    # "e2": E^2 times that, as lingvo/DeepSpeed/Tutel compute it (uniform routing gives ~1).
    aux_loss_scale: Literal["paper", "e2"] = "e2"


@dataclass
class ParallelConfig:
    """Process layout. ``expert_parallel = num_experts / experts_per_rank``; the rest is data parallel."""

    world_size: int = 4
    timeout_s: float = 120.0  # collective timeout; a hung rank ends the run after this


@dataclass
class CommConfig:
    """Communication policy of a training step (see moe_core.policies)."""

    policy: Policy = "sequential"
    bucket_mb: float = 4.0  # gradient bucket size of the `overlap` policy (DDP default is 25 MB)
    partition_mb: float = 30.0  # Lina's micro-op size (paper default 30 MB, studied 10-100 MB)
    # Lina's expert packing (policies lina, lina-pack): steps between re-decisions of the packing
    # factor; the first decision follows the train.warmup_iters warm-up steps (paper: every 4 steps).
    packing_interval_iters: int = 4


@dataclass
class TrainConfig:
    batch_size: int = 8  # sequences per rank and step
    lr: float = 3e-3
    warmup_iters: int = 3
    iters: int = 10  # timed iterations (each a full training step)
    seed: int = 0
    dtype: Literal["float32", "bfloat16"] = "float32"
    # Synthetic data: a random sparse Markov chain over the vocabulary (learnable, see moe_core.data).
    data_branching: int = 4  # successors per token
    data_zipf: float = 1.0  # Zipf exponent of token popularity (skews expert load)


@dataclass
class CollectivesConfig:
    """The nccl-tests-style collective microbenchmark (experiments/collectives.py)."""

    world_size: int = 4
    min_bytes: int = 1024
    max_bytes: int = 64 * 2**20
    step_factor: int = 4
    warmup_iters: int = 3
    iters: int = 10
    # Sizes up to latency_bytes are latency-bound: cheap per call but the noisiest (host scheduling
    # jitter), so they get latency_iters timed iterations instead (OSU micro-benchmarks' rule).
    latency_bytes: int = 256 * 2**10
    latency_iters: int = 30
    # Skew of the uneven all-to-all traffic matrix: Zipf exponent of destination popularity.
    traffic_zipf: float = 1.2
    seed: int = 0


@dataclass
class SweepConfig:
    """Axes of the measured training-step sweep; Snakemake runs one job per point of the product."""

    name: str = "default"
    world_size: list[int] = field(default_factory=lambda: [2, 4])
    num_experts: list[int] = field(default_factory=lambda: [4, 8, 16])
    # Empty: num_experts / world_size per rank (every rank holds experts, Lina's experts = GPUs).
    experts_per_rank: list[int] = field(default_factory=list)
    policy: list[str] = field(default_factory=lambda: ["sequential", "overlap"])
    seed: list[int] = field(default_factory=lambda: [0])


@dataclass
class SimSweepConfig:
    """Simulated training-step sweep (experiments/simulate.py): paper-scale clusters, one point each.

    num_experts = world_size * experts_per_rank (Lina: experts = GPUs). ``overrides`` set the
    simulated model (a paper-scale model, unlike the small measured one); the hardware profile is
    grown to world_size with more nodes of its kind.
    """

    name: str = "paper-scale"
    paper: str = "lina"
    hardware: list[str] = field(default_factory=lambda: ["lina-a100-4x4", "h100-ndr-cluster"])
    world_size: list[int] = field(default_factory=lambda: [8, 16, 32, 64, 128, 256, 512, 1024])
    experts_per_rank: int = 1
    policy: list[str] = field(default_factory=lambda: ["sequential", "overlap"])
    overrides: list[str] = field(default_factory=list)


@dataclass
class LinaSweepConfig:
    """Lina's experiments (experiments/rules/lina.smk).

    Simulated on the paper's testbed (4 nodes x 4 A100, 100 Gb/s IB), experts = GPUs: every policy
    at every expert count (Figs 10-14) and, at the largest count, policy ``lina`` at each partition
    size (Fig 15). Measured on this testbed: ``measured_policy`` at the measured sweep's largest world
    size with experts = ranks, micro-ops scaled to the small model (``measured_partition_mb``).
    """

    hardware: str = "lina-a100-4x4"
    experts: list[int] = field(default_factory=lambda: [2, 4, 8, 16])
    policy: list[str] = field(default_factory=lambda: ["overlap", "lina-priority", "lina-partition",
                                                        "lina-pipeline", "lina", "lina-pack"])
    partition_mb: list[float] = field(default_factory=lambda: [10.0, 30.0, 50.0, 100.0])
    overrides: list[str] = field(default_factory=list)  # the simulated model
    measured_policy: list[str] = field(default_factory=lambda: ["lina-priority", "lina-pipeline", "lina"])
    measured_partition_mb: float = 0.25


@dataclass
class AuroraConfig:
    """Aurora's experiments: experiments/aurora.py (simulated) and experiments/aurora_a2a.py (measured).

    Workloads are routing traces of our model (``aurora.moe_layers`` MoE layers of ``num_experts``
    top-1 experts, trained ``train_steps`` steps on data of each skew) and parametric Zipf matrices.
    """

    gating_zipf: list[float] = field(default_factory=lambda: [1.0, 1.5, 2.0])  # train.data_zipf per trace
    traffic_zipf: list[float] = field(default_factory=lambda: [0.8, 1.6])  # Zipf exponent per parametric workload
    num_experts: int = 8  # experts per model = GPUs per model (Aurora Section 8)
    moe_layers: int = 4  # MoE layers per model (Aurora Section 8)
    train_steps: int = 20  # router training before the trace
    trace_batch_size: int = 32  # sequences of the traced batch
    # Per-token size of the served model in the system model: the traces say who sends how many
    # tokens to whom, these give each token's bytes and FLOPs. Aurora serves LIMoE B/16 and B/32,
    # ViT-B sized (768 / 3072); our traced model is far smaller than any served one.
    d_model: int = 768
    d_ff: int = 3072
    element_bytes: int = 2  # bytes per activation element on the wire (bf16 inference)
    homogeneous_hardware: str = "aurora-bigswitch-100g"
    heterogeneous_hardware: str = "aurora-bigswitch-hetero"
    random_draws: int = 5  # seeds of each random baseline (RCS, RGA, REC)
    imprecision: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75])  # Fig 14's levels
    gap_gpus: int = 4  # GPUs of the brute-force comparison (Fig 13; n! pairings)
    # Measured ordered all-to-all (gloo/NCCL): the traces on world_size ranks, scaled so every rank
    # sends bytes_per_rank per layer.
    world_size: int = 4
    bytes_per_rank: int = 4 * 2**20
    warmup_iters: int = 2
    iters: int = 10


@dataclass
class InferenceConfig:
    """Lina's measured inference (experiments/inference.py; the workflow runs one job per expert
    count and path length in ``experts`` x ``path_lengths``, on ``world_size`` ranks)."""

    policies: list[str] = field(default_factory=lambda: ["static", "lina", "lina-no-estimation",
                                                          "lina-no-finetune"])  # besides ideal, always run
    train_steps: int = 100  # training on skewed data before inference (the gate's skew is learnt)
    profile_batches: int = 8  # batches whose expert paths are profiled
    warmup_batches: int = 3
    batches: int = 30  # timed inference batches
    top_k: int = 1  # Lina's inference gate
    keep: int = 0  # experts kept per path estimate; 0 = top_k, as Lina
    path_length: int = 3  # this run's l (Lina: 3; 1 and 6 studied)
    # The token all-to-alls: all_to_all_single, or Aurora's ordered one in that policy's order
    # (moe_core.policies.AURORA_ORDERS), planned from the traffic matrix every rank already has.
    a2a_policy: Literal["library", "aurora", "aurora-sjf", "aurora-rcs"] = "library"
    world_size: int = 4
    experts: list[int] = field(default_factory=lambda: [4])
    path_lengths: list[int] = field(default_factory=lambda: [3])
    overrides: list[str] = field(default_factory=list)  # the inference model


@dataclass
class WandbConfig:
    mode: Literal["offline", "online", "disabled"] = "offline"  # WANDB_MODE overrides this
    project: str = "moe-comm-bench"
    entity: Optional[str] = None


@dataclass
class Config:
    paper: str = "gshard"  # results/raw/<paper>/<experiment>/<point>.json
    experiment: str = "train_step"
    hardware_profile: str = "local-cpu"
    results_dir: str = "results"
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    collectives: CollectivesConfig = field(default_factory=CollectivesConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    sim_sweep: SimSweepConfig = field(default_factory=SimSweepConfig)
    lina: LinaSweepConfig = field(default_factory=LinaSweepConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    aurora: AuroraConfig = field(default_factory=AuroraConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)


def config_arg_parser(doc: str) -> argparse.ArgumentParser:
    """The command line every entry point shares: ``[--config FILE]... [key=value]...``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--config", action="append", default=[], help="YAML config file (repeatable)")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides (e.g. moe.num_experts=8)")
    return parser


def load_config(files: list[str | Path] = (), overrides: list[str] = (), data: dict | None = None) -> DictConfig:
    """Build, validate and freeze a config: schema <- ``files`` <- ``data`` <- ``overrides``.

    Raises ConfigError naming the full key for unknown keys, bad types or values, impossible layouts
    and missing files.
    """
    user_layers = []
    for path in files:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file '{path}' does not exist; pass an existing YAML file (see configs/)")
        user_layers.append(OmegaConf.load(path))
    if data:
        user_layers.append(OmegaConf.create(data))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value (e.g. moe.num_experts=8)")
    if overrides:
        user_layers.append(OmegaConf.from_dotlist(list(overrides)))
    schema = OmegaConf.structured(Config)
    profile = _merge([schema, *user_layers]).hardware_profile
    # The profile sits between the schema and the user's layers, so `hardware.x=...` still wins;
    # a layer's hardware section that names another profile (e.g. a saved resolved config, then
    # hardware_profile=...) belongs to that profile and is dropped.
    for layer in user_layers:
        name = OmegaConf.select(layer, "hardware.name")
        if name is not None and name != profile:
            layer.pop("hardware")
    cfg = _merge([schema, {"hardware": _load_hardware(profile)}, *user_layers])
    validate(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _merge(layers: list) -> DictConfig:
    try:
        return OmegaConf.merge(*layers)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        msg = str(err).splitlines()[0]
        raise ConfigError(f"config key '{key}': {msg}") from None


def _load_hardware(profile: str) -> DictConfig:
    """A profile name from configs/hardware/, or the path of a YAML file (e.g. a calibrated profile)."""
    path = Path(profile) if profile.endswith((".yaml", ".yml")) else CONFIG_DIR / "hardware" / f"{profile}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (CONFIG_DIR / "hardware").glob("*.yaml"))
        raise ConfigError(f"config key 'hardware_profile': '{profile}' is neither a YAML file nor a profile "
                          f"in configs/hardware/; allowed: {known} or a path to a .yaml file")
    return OmegaConf.load(path)


COMPUTE_PHASES = ("dense", "gate", "expert")  # op classes of the step model with their own efficiency


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"config key '{key}': {message}")


def validate(cfg: DictConfig) -> None:
    """Checks a type cannot express. Raises ConfigError naming the key."""
    m, moe, par, tr = cfg.model, cfg.moe, cfg.parallel, cfg.train
    for key in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "seq_len", "moe_every"):
        _require(m[key] >= 1, f"model.{key}", f"must be >= 1, got {m[key]}")
    _require(m.d_model % m.n_heads == 0, "model.n_heads", f"must divide model.d_model={m.d_model}, got {m.n_heads}")
    _require(moe.top_k in (1, 2), "moe.top_k", f"GShard gating supports 1 or 2, got {moe.top_k}")
    _require(moe.num_experts >= moe.top_k, "moe.num_experts", f"must be >= moe.top_k={moe.top_k}")
    _require(moe.capacity_factor > 0, "moe.capacity_factor", f"must be > 0, got {moe.capacity_factor}")
    _require(moe.group_size >= 0, "moe.group_size", f"must be >= 0 (0 = one group per rank), got {moe.group_size}")
    tokens = tr.batch_size * m.seq_len
    _require(moe.group_size == 0 or tokens % moe.group_size == 0, "moe.group_size",
             f"must divide the tokens per rank (train.batch_size * model.seq_len = {tokens}), got {moe.group_size}")
    _require(tr.batch_size >= 1 and tr.iters >= 1 and tr.warmup_iters >= 0, "train",
             "batch_size and iters must be >= 1, warmup_iters >= 0")
    _require(par.timeout_s > 0, "parallel.timeout_s", f"must be > 0, got {par.timeout_s}")
    _require(cfg.comm.bucket_mb > 0, "comm.bucket_mb", f"must be > 0, got {cfg.comm.bucket_mb}")
    _require(cfg.comm.partition_mb > 0, "comm.partition_mb", f"must be > 0, got {cfg.comm.partition_mb}")
    _require(cfg.comm.packing_interval_iters >= 1, "comm.packing_interval_iters",
             f"must be >= 1 step, got {cfg.comm.packing_interval_iters}")
    for phase, eff in cfg.hardware.phase_efficiency.items():
        _require(phase in COMPUTE_PHASES, f"hardware.phase_efficiency.{phase}",
                 f"unknown op class; expected one of {list(COMPUTE_PHASES)}")
        _require(0 < eff <= 1, f"hardware.phase_efficiency.{phase}", f"must be in (0, 1], got {eff}")
    inf = cfg.inference
    for key in ("batches", "profile_batches", "top_k", "path_length", "world_size"):
        _require(inf[key] >= 1, f"inference.{key}", f"must be >= 1, got {inf[key]}")
    _require(inf.train_steps >= 0 and inf.warmup_batches >= 0 and inf.keep >= 0, "inference",
             "train_steps, warmup_batches and keep must be >= 0")
    _require(inf.top_k <= 2, "inference.top_k", f"GShard gating supports 1 or 2, got {inf.top_k}")
    layout_error = check_layout(par.world_size, moe.num_experts, moe.experts_per_rank)
    if layout_error:
        raise ConfigError(layout_error)
    c = cfg.collectives
    _require(0 < c.min_bytes <= c.max_bytes, "collectives.min_bytes", "must satisfy 0 < min_bytes <= max_bytes")
    _require(c.step_factor >= 2, "collectives.step_factor", f"must be >= 2, got {c.step_factor}")
    _require(c.world_size >= 2, "collectives.world_size", f"collectives need >= 2 ranks, got {c.world_size}")
    _require(c.iters >= 1 and c.latency_iters >= 1 and c.warmup_iters >= 0, "collectives",
             "iters and latency_iters must be >= 1, warmup_iters >= 0")
    for pol in cfg.sweep.policy:
        _require(pol in Policy.__args__, "sweep.policy", f"invalid value '{pol}', expected one of {list(Policy.__args__)}")
    for key in ("world_size", "num_experts", "seed"):
        _require(len(cfg.sweep[key]) > 0, f"sweep.{key}", "must list at least one value")
    for key in ("sim_sweep.policy", "lina.policy", "lina.measured_policy"):
        for pol in OmegaConf.select(cfg, key):
            _require(pol in Policy.__args__, key, f"invalid value '{pol}', expected one of {list(Policy.__args__)}")
    _require(min(cfg.lina.partition_mb, default=1) > 0 and cfg.lina.measured_partition_mb > 0, "lina.partition_mb",
             "partition sizes must be > 0 MB")
    known = sorted(p.stem for p in (CONFIG_DIR / "hardware").glob("*.yaml"))
    for key, name in [("sim_sweep.hardware", n) for n in cfg.sim_sweep.hardware] + [("lina.hardware", cfg.lina.hardware)]:
        _require(name in known, key, f"'{name}' has no configs/hardware/{name}.yaml; allowed: {known}")


def check_layout(world_size: int, num_experts: int, experts_per_rank: int) -> str | None:
    """Return why (world_size, num_experts, experts_per_rank) is not a valid layout, or None."""
    if world_size < 1:
        return f"config key 'parallel.world_size': must be >= 1, got {world_size}"
    if experts_per_rank < 1 or num_experts % experts_per_rank:
        return (f"config key 'moe.experts_per_rank': must divide moe.num_experts={num_experts}, "
                f"got {experts_per_rank}")
    ep = num_experts // experts_per_rank
    if world_size % ep:
        return (f"config key 'parallel.world_size': the expert-parallel size num_experts/experts_per_rank = "
                f"{num_experts}/{experts_per_rank} = {ep} must divide world_size={world_size}; "
                f"use experts_per_rank={max(1, num_experts // world_size)} or a world size that is a multiple of {ep}")
    return None


@dataclass(frozen=True)
class Layout:
    """Data x expert parallel layout: ranks r = dp_index * expert_parallel + ep_index."""

    world_size: int
    num_experts: int
    experts_per_rank: int

    @property
    def expert_parallel(self) -> int:
        return self.num_experts // self.experts_per_rank

    @property
    def data_parallel(self) -> int:
        return self.world_size // self.expert_parallel


def layout_of(cfg: DictConfig) -> Layout:
    return Layout(cfg.parallel.world_size, cfg.moe.num_experts, cfg.moe.experts_per_rank)


def sweep_points(cfg: DictConfig) -> tuple[list[dict[str, Any]], list[str]]:
    """Expand the sweep into points (dicts of swept values) and the reasons points were skipped.

    ``experts_per_rank`` left empty means num_experts / world_size (at least 1).
    """
    s = cfg.sweep
    points, skipped = [], []
    for ws, ne, pol, seed in itertools.product(s.world_size, s.num_experts, s.policy, s.seed):
        eprs = list(s.experts_per_rank) or [max(1, ne // ws)]
        for epr in eprs:
            why = check_layout(ws, ne, epr)
            point = dict(world_size=ws, num_experts=ne, experts_per_rank=epr, policy=pol, seed=seed)
            (skipped.append(f"{point}: {why}") if why else points.append(point))
    return points, skipped


def sim_point_name(hardware: str, params: dict[str, Any]) -> str:
    """A simulated point's name: its hardware profile, then the measured points' name of its params."""
    return f"{hardware}_{point_name(params)}"


def sim_points(cfg: DictConfig) -> dict[str, tuple[str, list[str]]]:
    """Every simulated training-step point of a run: name -> (paper, its complete overrides).

    The paper-scale sweep (``sim_sweep``: hardware x world size x policy, experts = world size x
    experts_per_rank) and Lina's (``lina``: experts = GPUs x policy, then the partition sweep at the
    largest expert count). A point both sweeps name is simulated once.
    """
    points: dict[str, tuple[str, list[str]]] = {}

    def add(hw: str, paper: str, ws: int, epr: int, policy: str, model: list[str], partition_mb: float) -> None:
        params = dict(world_size=ws, num_experts=ws * epr, experts_per_rank=epr, policy=policy,
                      seed=cfg.train.seed, partition_mb=partition_mb)
        points[sim_point_name(hw, params)] = (paper, [
            *model, f"hardware_profile={hw}", f"paper={paper}", f"comm.partition_mb={partition_mb:g}",
            *point_overrides({k: v for k, v in params.items() if k != "partition_mb"})])

    s, lina = cfg.sim_sweep, cfg.lina
    for hw, ws, policy in itertools.product(s.hardware, s.world_size, s.policy):
        add(hw, s.paper, ws, s.experts_per_rank, policy, list(s.overrides), cfg.comm.partition_mb)
    for experts, policy in itertools.product(lina.experts, lina.policy):
        add(lina.hardware, "lina", experts, 1, policy, list(lina.overrides), cfg.comm.partition_mb)
    for partition_mb in lina.partition_mb:
        add(lina.hardware, "lina", max(lina.experts), 1, "lina", list(lina.overrides), partition_mb)
    return points


def lina_measured_points(cfg: DictConfig) -> list[dict[str, Any]]:
    """Lina's measured points: ``lina.measured_policy`` at the measured sweep's largest world size
    with experts = ranks (Lina's setting), micro-ops of ``lina.measured_partition_mb``; paper lina."""
    ws = max(cfg.sweep.world_size)
    return [dict(world_size=ws, num_experts=ws, experts_per_rank=1, policy=policy, seed=cfg.sweep.seed[0],
                 partition_mb=cfg.lina.measured_partition_mb, paper="lina") for policy in cfg.lina.measured_policy]


def point_overrides(point: dict[str, Any]) -> list[str]:
    """The ``key=value`` overrides that turn the base config into one sweep point."""
    keys = {"world_size": "parallel.world_size", "num_experts": "moe.num_experts",
            "experts_per_rank": "moe.experts_per_rank", "policy": "comm.policy", "seed": "train.seed",
            "partition_mb": "comm.partition_mb", "paper": "paper"}
    return [f"{keys[k]}={v}" for k, v in point.items()]


def point_params(cfg: DictConfig) -> dict[str, Any]:
    """The parameters a training-step record carries (measured and simulated alike)."""
    layout = layout_of(cfg)
    return {"world_size": layout.world_size, "num_experts": layout.num_experts,
            "experts_per_rank": layout.experts_per_rank, "policy": cfg.comm.policy, "seed": cfg.train.seed,
            "expert_parallel": layout.expert_parallel, "data_parallel": layout.data_parallel,
            "top_k": cfg.moe.top_k, "capacity_factor": cfg.moe.capacity_factor, "dropless": cfg.moe.dropless,
            "tokens_per_rank": cfg.train.batch_size * cfg.model.seq_len, "dtype": cfg.train.dtype,
            "partition_mb": cfg.comm.partition_mb}


def point_name(point: dict[str, Any]) -> str:
    """File name of a sweep point: ``ws4_e8_epr2_sequential_s0`` (``_part30`` added for Lina's
    partitioning policies, ``_dropless`` for dropless routing)."""
    from .lina import LINA_POLICIES  # (moe_core.lina imports this module)

    name = (f"ws{point['world_size']}_e{point['num_experts']}_epr{point['experts_per_rank']}"
            f"_{point['policy']}_s{point['seed']}")
    lina = LINA_POLICIES.get(point["policy"])
    if lina is not None and lina.partition and "partition_mb" in point:
        name += f"_part{point['partition_mb']:g}"
    return name + "_dropless" if point.get("dropless") else name


def capacity(tokens_per_group: int, num_experts: int, top_k: int, capacity_factor: float, min_capacity: int) -> int:
    """Expert capacity per group: C = max(min_capacity, ceil(capacity_factor * top_k * S / E)).

    GShard's paper sets C = 2N/(G E) = top_k * S / E (capacity_factor 1). lingvo's
    ``Top2GatingOnLogits`` uses int(S * cf / E) rounded up to a multiple of 4 (a TPU tiling
    choice); we round up to the next integer so that capacity_factor=1 never drops a token under
    perfectly balanced routing.
    """
    return max(min_capacity, math.ceil(capacity_factor * top_k * tokens_per_group / num_experts))


def save_config(cfg: DictConfig, path: str | Path) -> bool:
    """Write the resolved config as YAML (entry points load it back with ``--config``), unless
    ``path`` already holds exactly that; returns whether it wrote. So the file changes, and its
    modification time moves, only when the config does: what was made from an older config is
    older than the file, which is how the workflow knows to redo it."""
    path = Path(path)
    text = OmegaConf.to_yaml(cfg, resolve=True)
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomic: a reader never sees half a config
    return True


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)
