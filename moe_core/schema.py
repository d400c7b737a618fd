"""The configuration's schema and checks: the core's sections, the checks a type cannot express, and
how a checked config is derived into another (a point's, a paper's model).

The schema's root (every registered paper section included) is assembled, and configs are loaded, by
moe_core.config, which imports the papers' registry first; this module imports no paper, so papers,
run checks and the simulator derive configs with it without an import cycle. Every failure raises
:class:`ConfigError` whose message names the key, what was wrong and what is allowed.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Literal

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from .activation import FFN_ACTIVATIONS
from .capacity import dispatch_rows_per_expert, expert_tensor_parallel
from .dispatch import tensor_parallel_dispatchers
from .grid import grid_split_error
from .layout import grid_config, layout_error
from .points import sweep_points
from .policies import POLICIES, gradient_features, step_refusal
from .sections import (
    COLLECTIVE_CURVES_DIR,
    CONFIG_DIR,
    PAPER_NAMES,
    SECTIONS,
    ConfigError,
    require,
    require_at_least,
    require_choices,
    require_name,
    require_positive,
    require_profile,
    require_seed,
)


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
class PcieTreeConfig:
    """A PCIe server's intra-node tree (``hardware.intra_node: pcie_tree``; moe_core.sim.topology).

    Each node's GPUs hang in order off PCIe switches (``gpus_per_switch`` each; 1 = every GPU on
    its own CPU root port), the switches in order off ``sockets`` CPU root complexes joined by
    socket links (UPI / xGMI). A GPU's own link is ``intra_node_GBps``; every rate here is a line
    rate per direction, scaled by ``intra_node_efficiency`` as that one is.
    """

    gpus_per_switch: int = 1
    switch_uplink_GBps: float = 0.0  # each switch's link to its root complex
    sockets: int = 1
    socket_link_GBps: float = 0.0  # between two sockets, all their links together
    nic_switches: list[int] = field(default_factory=list)  # per NIC of a node: the switch (0-based) it sits under


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
    # Inside a cluster's node: "switch", every device on private links to a non-blocking switch
    # (NVSwitch class); "pcie_tree", GPUs and NICs under shared PCIe switches and sockets (pcie).
    intra_node: Literal["switch", "pcie_tree"] = "switch"
    pcie: PcieTreeConfig = field(default_factory=PcieTreeConfig)
    intra_node_GBps: float = 0.0  # per device (NVLink/NVSwitch class); torus2d: per link
    intra_node_latency_us: float = 0.0
    nic_GBps: float = 0.0  # per NIC
    nics_per_node: int = 1  # = devices_per_node for one NIC per device
    inter_node_latency_us: float = 0.0
    oversubscription: float = 1.0  # node uplink = nics_per_node * nic_GBps / oversubscription
    # The share of the line rates above that a collective library (NCCL) reaches on them, from
    # published microbenchmarks cited in the profile: the simulator's link capacities are line rate x
    # this. 1 where the bandwidths are achieved rates already (calibrated, or a model's constants).
    intra_node_efficiency: float = 1.0
    nic_efficiency: float = 1.0
    # How an all-to-all's share of those rates falls at mid sizes: a curve of published measurements,
    # configs/collective_curves/<name>.yaml (moe_core.sim.collectives.SizeCurve); "" = none (the share
    # above at every size, or the calibrated terms in ``collectives``).
    all_to_all_curve: str = ""
    # -- compute model (moe_core.sim.compute; experiments/op_sweep.py measures and fits it) --
    peak_tflops: float = 0.0  # per device, in the dtype the model computes in
    # Dense FP8 tensor-core peak per device (spec sheet), for steps that run their linear layers in
    # FP8 (train.fp8); 0 = the device has no FP8 GEMMs. Device classes keep this ratio to peak_tflops.
    fp8_peak_tflops: float = 0.0
    compute_efficiency: float = 0.5  # fraction of peak large, compute-bound GEMMs reach (the curve's maximum)
    # Share (0..1) of a GEMM's operand-traffic time (bytes / memory bandwidth) its math does not hide:
    # the GEMM efficiency curve's knee, efficiency(I) = compute_efficiency * I / (I + this * ridge point).
    gemm_exposed_memory: float = 0.0
    # Device memory bandwidth from the spec sheet (HBM, or a CPU's DRAM), B/s per device; 0 = memory
    # traffic not modelled: every GEMM at compute_efficiency, memory-bound ops cost their launches only.
    memory_GBps: float = 0.0
    memory_efficiency: float = 1.0  # fraction of memory_GBps streaming kernels reach
    # Host cost of one kernel as eager PyTorch issues it; 0 = not modelled. On a cuda device the host
    # issues ahead of the GPU and launches cost what it falls behind (moe_core.sim.engine.issued_by_host).
    kernel_launch_us: float = 0.0
    # Per op class ("dense", "gate", "expert"): calibrated multipliers on the compute model's speed
    # (an op takes model time / this); 1 when absent. Calibration fits them from measured phase times.
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
    # A calibrated profile's quality: how many of the records it was fitted on were taken on a noisy
    # host (moe_core.noise.noise_summary; experiments/calibrate.py writes it); empty otherwise.
    calibration_noise: dict[str, float] = field(default_factory=dict)


@dataclass
class ModelConfig:
    """A small decoder-only transformer; every ``moe_every``-th FFN is an MoE layer (GShard: 2)."""

    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 0  # key/value heads (grouped-query attention); 0: n_heads, multi-head attention
    head_dim: int = 0  # features per head (Qwen3: 128 on d_model 4096 with 64 heads); 0: d_model / n_heads
    d_ff: int = 512  # hidden width of the dense FFNs and of every expert
    ffn_activation: str = "relu"  # relu (GShard's FFN) | swiglu (Llama's, Mixtral's: silu(gate) * up, 3 GEMMs)
    seq_len: int = 64
    moe_every: int = 2  # layers 1, 3, 5... (0-based odd) are MoE when 2, as in GShard Fig 3; 0: a dense GPT


def kv_heads(model: DictConfig) -> int:
    """Key/value heads: ``model.n_kv_heads``, or n_heads (multi-head attention) when it is 0."""
    return model.n_kv_heads or model.n_heads


def head_dim(model: DictConfig) -> int:
    """Features per attention head: ``model.head_dim``, or d_model / n_heads when it is 0."""
    return model.head_dim or model.d_model // model.n_heads


@dataclass
class MoEConfig:
    """GShard gating and expert layout (reference/papers.md, GShard Algorithm 1)."""

    num_experts: int = 4
    experts_per_rank: int = 1
    top_k: int = 2  # experts per token: 1 and 2 as GShard; >= 3 the renormalised top-k (Mixtral, Qwen3)
    # Capacity per expert and group: C = max(min_capacity, ceil(capacity_factor * top_k * S / E)).
    capacity_factor: float = 1.25
    min_capacity: int = 4
    # Tokens per local dispatch group (GShard's S); 0 = all tokens of a rank form one group.
    group_size: int = 0
    # "random": keep the 2nd expert only if 2*g2 > U(0,1) (GShard); "always": keep it whenever it fits.
    # GShard's rule is for top_k 2 only: top_k 1 and >= 3 keep every choice whichever is set.
    second_expert_policy: Literal["random", "always"] = "random"
    dropless: bool = False  # no capacity: uneven all-to-all splits, no token is ever dropped
    # The gate's forward copies its expert counts to the host, a host-device sync: on a GPU the host
    # stops issuing ahead there (measured: moe_core.layer; simulated: moe_core.sim.engine.issued_by_host).
    # DeepSpeed-MoE's top-k gating did (deepspeed/moe/sharded_moe.py, from 2021 until PR #5578,
    # 2024-08-22: "will cause device to host synchronization which damage performance"); off by default.
    gate_host_sync: bool = False
    # Ranks each expert's hidden units are split over (simulated only): 0 = parallel.tensor_parallel
    # (DeepSpeed's layout: the "tp" ranks route their shared tokens once); 1 = whole experts, each
    # tensor-parallel rank routing its own 1/tp of the tokens over an expert-parallel group of its
    # own (Megatron's --expert-tensor-parallel-size 1 with sequence parallelism; Mixtral's recipes)
    expert_tensor_parallel: int = 0
    aux_loss_weight: float = 0.01  # GShard's k in L = l_nll + k * l_aux
    # "paper": l_aux = (1/E) sum_e (c_e/S) m_e (uniform routing gives 1/E^2);
    # "e2": E^2 times that, as lingvo/DeepSpeed/Tutel compute it (uniform routing gives ~1).
    aux_loss_scale: Literal["paper", "e2"] = "e2"


@dataclass
class GridConfig:
    """The tensor axes of a 3D tensor-parallel grid (moe_core.grid): ``row x col`` ranks split every
    dense linear layer, ``depth`` shards the blocks and splits the batch; data parallel is the rest."""

    depth: int = 1
    row: int = 1
    col: int = 1


@dataclass
class ParallelConfig:
    """Process layout (moe_core.layout): ``expert_parallel = num_experts / experts_per_rank``, ``tensor_parallel``
    ranks share each group's tokens and split its weights, the rest is data parallel."""

    world_size: int = 4
    tensor_parallel: int = 1  # Megatron-style, of attention, dense FFNs and experts (moe_core.tensor_parallel)
    grid: GridConfig = field(default_factory=GridConfig)  # 3D tensor parallelism (exclusive with tensor_parallel)
    # Pipeline stages of n_layers / pipeline_parallel blocks, stage s on ranks [s W/pp, (s+1) W/pp),
    # run by the 1F1B schedule over train.micro_batches (moe_core.sim.pipeline): simulated only.
    pipeline_parallel: int = 1
    virtual_pipeline: int = 1  # interleaved 1F1B: model chunks per stage (Narayanan et al. SC'21); 1 = plain 1F1B
    # How the pp x virtual_pipeline model chunks split the blocks: "blocks" evenly; "embedding_and_loss" counts
    # the embedding and the loss as a block each (Megatron's --account-for-embedding/loss-in-pipeline-split),
    # so the first and last chunks hold one block fewer (Qwen3-235B: 94 blocks + 2 over 32 chunks of 3)
    pipeline_split: str = "blocks"
    # How data-parallel replicas hold the parameters (simulated only; moe_core.sim.step), over the
    # ranks holding replicas of the same weights (dense: the same tensor-parallel shard; experts:
    # their "dp" replicas): "none" replicates them (DDP: gradients all-reduced); "optimizer" shards
    # the optimizer (ZeRO-1, Megatron's distributed optimizer: gradients reduce-scattered, each rank
    # updates its 1/dp, parameters all-gathered after the step); "full" shards the parameters too
    # (ZeRO-3, FSDP2 fully_shard per block plus one root unit for embeddings and head: all-gathered
    # before each block's forward and backward, gradients reduce-scattered after its backward, in
    # every micro-batch; these units replace the policy's gradient buckets and launch rule).
    data_sharding: Literal["none", "optimizer", "full"] = "none"
    timeout_s: float = 120.0  # collective timeout; a hung rank ends the run after this


@dataclass
class GridOverlapConfig:
    """AxoNN's overlaps of the grid's collectives with compute (moe_core.grid.GridOverlaps)."""

    all_reduce: bool = False  # backward input-gradient all-reduce behind the weight-gradient matmul
    reduce_scatter: bool = False  # weight-gradient reduce-scatter completed after the backward pass
    all_gather: bool = False  # the next layer's weight all-gather issued before this layer computes
    cached_layers: int = 0  # the first N blocks keep their gathered weights from forward for backward


@dataclass
class CommConfig:
    """Communication policy of a training step (see moe_core.policies)."""

    policy: str = "sequential"  # a registered policy (moe_core.policies.POLICIES)
    bucket_mb: float = 4.0  # gradient bucket size of the `overlap` policy (DDP default is 25 MB)
    # Micro-op size of policies that cut their communication into micro-ops (e.g. Lina's tensor
    # partitioning: 30 MB by default, 10-100 MB studied).
    partition_mb: float = 30.0
    # Plans that pack experts (e.g. Lina's lina, lina-pack): steps between re-decisions of the
    # expert layout; the first follows the train.warmup_iters warm-up steps (Lina: every 4 steps).
    packing_interval_iters: int = 4
    # Under tensor parallelism, how the MoE all-to-all treats the tokens the "tp" ranks hold in
    # duplicate (a registered tensor-parallel dispatcher, moe_core.dispatch): "duplicate" sends every
    # copy, "drop-gather" (DeepSpeed) sends 1/tp and all-gathers over "tp", papers add theirs.
    tp_dispatch: str = "drop-gather"
    tp_chunks: int = 0  # pipelined dispatches: chunk count; 0 = the dispatch's own decision
    # "hierarchical": the MoE all-to-all runs in two phases, inside nodes then between same-local-rank
    # peers (moe_core.hierarchical_a2a; the step simulator models the same), when its group spans nodes.
    a2a_algorithm: Literal["flat", "hierarchical"] = "flat"
    # Under a 3D grid (parallel.grid): which of its collectives overlap compute (moe_core.grid.GridOverlaps)
    grid_overlap: GridOverlapConfig = field(default_factory=lambda: GridOverlapConfig())


@dataclass
class TrainConfig:
    batch_size: int = 8  # sequences per rank and step
    micro_batches: int = 1  # gradient accumulation: the per-rank batch in this many passes (must divide batch_size)
    # Activation recomputation (simulated only): "full" re-runs each block's forward before its
    # backward (Megatron --recompute-granularity full, llm-foundry activation_checkpointing);
    # "selective" only its attention core (Megatron --recompute-granularity selective).
    recompute: Literal["none", "selective", "full"] = "none"
    # With recompute=full: how many blocks of each pipeline stage recompute, the first ones
    # (Megatron --recompute-method block --recompute-num-layers N); 0 = every block.
    recompute_layers: int = 0
    # FP8 linear layers (simulated only; Transformer Engine): every linear layer's and expert's three
    # GEMMs at the device's FP8 peak (hardware.fp8_peak_tflops), with TE's casts of their operands to
    # FP8. "delayed": scales from the amax history, the amax fused into the cast (NeMo's recipes);
    # "current": per-tensor scales from the tensor itself, one more pass over each operand (Megatron's
    # FP8-CS). The attention core, the gate, the LM head and every other op stay in train.dtype.
    fp8: Literal["none", "delayed", "current"] = "none"
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
    """Axes of the measured training-step sweep; Snakemake runs one job per point of the product.
    Each point's layout is its axes' (no 3D grid: ``parallel.grid`` is for a run of the base config)."""

    name: str = "default"
    world_size: list[int] = field(default_factory=lambda: [2, 4])
    num_experts: list[int] = field(default_factory=lambda: [4, 8, 16])
    # Empty: num_experts / world_size per rank (every rank holds experts; experts = GPUs).
    experts_per_rank: list[int] = field(default_factory=list)
    policy: list[str] = field(default_factory=lambda: ["sequential", "overlap"])
    seed: list[int] = field(default_factory=lambda: [0])
    # Tensor-parallel sizes; the dispatch and all-to-all choices are the base config's (comm.*).
    tensor_parallel: list[int] = field(default_factory=lambda: [1])
    # A point whose layout is impossible (e.g. 3 experts on 2 ranks) is an error, unless this says
    # to leave such points out.
    skip_impossible: bool = False


@dataclass
class SimSweepConfig:
    """Simulated training-step sweep (experiments/simulate.py): paper-scale clusters, one point each.

    num_experts = world_size * experts_per_rank (experts = GPUs, as in Lina). ``overrides`` set the
    simulated model (a paper-scale model, unlike the small measured one); the hardware profile is
    grown to world_size with more nodes of its kind.
    """

    name: str = "paper-scale"
    paper: str = "gshard"  # the paper whose figures the points belong to (configs/default.yaml: lina)
    hardware: list[str] = field(default_factory=lambda: ["h100-ndr-cluster"])
    world_size: list[int] = field(default_factory=lambda: [8, 16, 32, 64, 128, 256, 512, 1024])
    experts_per_rank: int = 1
    policy: list[str] = field(default_factory=lambda: ["sequential", "overlap"])
    overrides: list[str] = field(default_factory=list)


@dataclass
class CalibrationConfig:
    """experiments/calibrate.py."""

    # A fit on records from a noisy host (moe_core.noise) replaces the last good profile only if true.
    accept_noisy: bool = False


@dataclass
class WandbConfig:
    mode: Literal["offline", "online", "disabled"] = "offline"  # WANDB_MODE overrides this
    project: str = "moe-comm-bench"
    entity: str | None = None


def _root_schema() -> type:
    """The root dataclass: run identity, the core's sections, then every registered paper section."""
    core = [
        ("paper", str, field(default="gshard")),  # results/raw/<paper>/<experiment>/<point>.json
        ("experiment", str, field(default="train_step")),
        ("hardware_profile", str, field(default="local-cpu")),
        ("results_dir", str, field(default="results")),
        # A sensitivity run: the parameters a paper leaves unstated that this run sets to ends of their
        # plausible range, as "key=value" (the run's overrides set it too); its records carry it as the
        # param ``unstated``, and analysis.compare reports their range beside the chosen value's.
        # Empty: every parameter at its chosen value.
        ("unstated", str, field(default="")),
        # Run what the load refuses only as too large (moe_core.run_checks: a measured run's memory
        # estimate over this host's memory, simulated ranks or point counts past their stated bounds).
        # A wrong value is refused whatever this says.
        ("force", bool, field(default=False)),
        ("hardware", HardwareConfig, field(default_factory=HardwareConfig)),
        ("model", ModelConfig, field(default_factory=ModelConfig)),
        ("moe", MoEConfig, field(default_factory=MoEConfig)),
        ("parallel", ParallelConfig, field(default_factory=ParallelConfig)),
        ("comm", CommConfig, field(default_factory=CommConfig)),
        ("train", TrainConfig, field(default_factory=TrainConfig)),
        ("collectives", CollectivesConfig, field(default_factory=CollectivesConfig)),
        ("sweep", SweepConfig, field(default_factory=SweepConfig)),
        ("sim_sweep", SimSweepConfig, field(default_factory=SimSweepConfig)),
        ("calibration", CalibrationConfig, field(default_factory=CalibrationConfig)),
    ]
    registered = [(s.name, s.schema, field(default_factory=s.schema)) for s in SECTIONS.values()]
    return make_dataclass("Config", [*core, *registered, ("wandb", WandbConfig, field(default_factory=WandbConfig))])


@functools.cache
def hardware_profile(name: str) -> DictConfig:
    """The hardware profile ``name`` (configs/hardware/<name>.yaml, or a YAML path) as a checked,
    read-only section, as a config loaded on it holds it; read once per process: simulated studies
    price hundreds of points on a few profiles."""
    hardware = _merge([OmegaConf.structured(HardwareConfig), _load_hardware(name)])
    require_name(hardware.name, "hardware.name")
    _validate_shape(hardware)
    _validate_rates(hardware)
    OmegaConf.set_readonly(hardware, True)
    return hardware


def derive_config(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """``cfg`` (a checked run's config) with ``overrides`` applied, checked as a config (a point's,
    a paper's model): what load_config(data=cfg, overrides=overrides) gives without the run's own
    checks, and without rebuilding the whole config (points are derived by the hundred at load)."""
    layer = _dotlist(overrides)
    profile = layer.get("hardware_profile", cfg.hardware_profile)
    derived = _merge([cfg, layer])  # one copy of cfg: merge copies its first layer
    OmegaConf.set_readonly(derived, False)
    if profile != cfg.hardware_profile:  # the new profile's section replaces the old one's entirely,
        # then the layer's own hardware keys apply to it; the schema class is cfg's own
        # (``python -m moe_core.config`` imports this module twice)
        hardware = [OmegaConf.structured(OmegaConf.get_type(cfg.hardware)), _load_hardware(profile)]
        derived.hardware = _merge([*hardware, layer.get("hardware", {})])
    OmegaConf.set_readonly(derived, True)
    validate(derived)
    return derived


def _dotlist(overrides: list[str]) -> DictConfig:
    """``key=value`` overrides as one layer; ConfigError naming a malformed one."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value (e.g. moe.num_experts=8)")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except (OmegaConfBaseException, yaml.YAMLError) as err:
        raise ConfigError(f"overrides {list(overrides)}: {str(err).splitlines()[0]}") from None


ERROR_KEY = re.compile(r"^config key '([^']+)': ")


def _load_yaml(path: Path) -> DictConfig:
    """A YAML config file; ConfigError naming the file (and line) if it is missing or malformed."""
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist; pass an existing YAML file (see configs/)")
    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"config file '{path}'{where}: not valid YAML ({problem})") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"config file '{path}': must hold a mapping of keys (e.g. 'moe: {{num_experts: 8}}')")
    return loaded


def _merge(layers: list) -> DictConfig:
    try:
        return OmegaConf.merge(*layers)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or getattr(err, "key", None) or _root_key(layers)
        msg = str(err).splitlines()[0]
        if isinstance(err, ConfigKeyError):
            parent = key.rsplit(".", 1)[0] if "." in str(key) else ""
            node = OmegaConf.select(layers[0], parent) if parent else layers[0]
            if isinstance(node, DictConfig):
                msg += f"; valid keys{' of ' + repr(parent) if parent else ''}: {sorted(node.keys())}"
        raise ConfigError(f"config key '{key}': {msg}") from None


def _root_key(layers: list) -> str:
    """The root of a layer that is not a mapping of sections (e.g. ``sweep=[1, 2]``): its first key."""
    for layer in layers[1:]:
        if isinstance(layer, DictConfig):
            for key in layer:
                if not isinstance(layer[key], DictConfig) and isinstance(getattr(layers[0], key, None), DictConfig):
                    return str(key)
    return "?"


def _load_hardware(profile: str) -> DictConfig:
    """A profile name from configs/hardware/, or the path of a YAML file (e.g. a calibrated profile)."""
    path = Path(profile) if profile.endswith((".yaml", ".yml")) else CONFIG_DIR / "hardware" / f"{profile}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (CONFIG_DIR / "hardware").glob("*.yaml"))
        raise ConfigError(
            f"config key 'hardware_profile': '{profile}' is neither a YAML file nor a profile "
            f"in configs/hardware/; allowed: {known} or a path to a .yaml file"
        )
    return _load_yaml(path)


PIPELINE_SPLITS = ("blocks", "embedding_and_loss")  # parallel.pipeline_split: see ParallelConfig
COMPUTE_PHASES = ("dense", "gate", "expert")  # op classes of the step model with their own efficiency
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a collective timeout beyond a week is a typo (and overflows C++ timers)
MAX_EMBEDDING_BYTES = 2**36  # 64 GiB: embedding + head beyond this is a typo, not a model we train


def validate(cfg: DictConfig) -> None:
    """Checks a type cannot express, for the core's sections and every registered one. Raises
    ConfigError naming the full key and what is allowed."""
    _validate_run(cfg)
    _validate_model(cfg)
    _validate_training(cfg)
    _validate_sweeps(cfg)
    for section in SECTIONS.values():
        section.validate(cfg)


def validate_point(cfg: DictConfig) -> None:
    """The checks a sweep point's settings (layout, policy, dispatch, seed, paper) can fail: the
    model's and the training step's; no section reads a point's keys."""
    _validate_model(cfg)
    _validate_training(cfg)


def _validate_run(cfg: DictConfig) -> None:
    """Names that become path components or shell words, and the hardware's shape and rates."""
    require(
        cfg.paper in PAPER_NAMES,
        "paper",
        f"'{cfg.paper}' is not a paper of the suite; allowed: {list(PAPER_NAMES)}",
    )
    for key in ("experiment", "hardware.name", "sweep.name", "sim_sweep.name", "wandb.project"):
        require_name(OmegaConf.select(cfg, key), key)
    if cfg.wandb.entity is not None:
        require_name(cfg.wandb.entity, "wandb.entity")
    require(str(cfg.results_dir).strip() != "", "results_dir", "must name a directory")
    require(
        cfg.unstated == "" or bool(UNSTATED_SETTING.match(cfg.unstated)),
        "unstated",
        "must be '' or settings key=value of plain words joined by ',' "
        f"(e.g. hardware.nic_efficiency=0.67,train.batch_size=4), got {cfg.unstated!r}",
    )
    _validate_shape(cfg.hardware)
    _validate_rates(cfg.hardware)


_SETTING = r"[A-Za-z0-9_.]+=[A-Za-z0-9_.+-]+"
UNSTATED_SETTING = re.compile(rf"^{_SETTING}(,{_SETTING})*\Z")


def _validate_shape(hw: DictConfig) -> None:
    """Nodes, devices and NICs are counts >= 1; links' rates and latencies finite and >= 0 (0: unknown)."""
    require_at_least(hw, "hardware", 1, ("nodes", "devices_per_node", "nics_per_node"))
    require_at_least(hw, "hardware", 0, ("host_cores",))
    require_positive(hw, "hardware", ("oversubscription",))
    rates = ("intra_node_GBps", "intra_node_latency_us", "nic_GBps", "inter_node_latency_us", "host_GBps")
    require_at_least(hw, "hardware", 0, rates)
    for i, gpu_class in enumerate(hw.gpu_classes):
        require_name(gpu_class.name, f"hardware.gpu_classes[{i}].name")
    if hw.topology == "torus2d":
        require(
            len(hw.torus_dims) == 2 and min(hw.torus_dims) >= 1,
            "hardware.torus_dims",
            f"a torus2d profile needs [x, y] >= 1, got {list(hw.torus_dims)}",
        )
    if hw.intra_node == "pcie_tree":
        _validate_pcie_tree(hw)


def _validate_pcie_tree(hw: DictConfig) -> None:
    """A PCIe tree splits the node's GPUs evenly over its switches and the switches over its sockets,
    has positive link rates where traffic can cross them, and puts every NIC under one of its switches."""
    tree = hw.pcie
    require(hw.topology == "cluster", "hardware.intra_node", "pcie_tree needs topology: cluster")
    require(hw.host_GBps == 0, "hardware.intra_node", "pcie_tree models GPU servers; set host_GBps: 0 (CPU testbeds)")
    require_at_least(tree, "hardware.pcie", 1, ("gpus_per_switch", "sockets"))
    require(
        hw.devices_per_node % tree.gpus_per_switch == 0,
        "hardware.pcie.gpus_per_switch",
        f"must divide devices_per_node ({hw.devices_per_node}), got {tree.gpus_per_switch}",
    )
    switches = hw.devices_per_node // tree.gpus_per_switch
    require(
        switches % tree.sockets == 0,
        "hardware.pcie.sockets",
        f"must divide the node's {switches} PCIe switches (devices_per_node / gpus_per_switch), got {tree.sockets}",
    )
    require(
        math.isfinite(tree.switch_uplink_GBps) and tree.switch_uplink_GBps > 0,
        "hardware.pcie.switch_uplink_GBps",
        f"must be a finite rate > 0 (GB/s per direction, from the switch's spec), got {tree.switch_uplink_GBps}",
    )
    if tree.sockets > 1:
        require(
            math.isfinite(tree.socket_link_GBps) and tree.socket_link_GBps > 0,
            "hardware.pcie.socket_link_GBps",
            f"must be a finite rate > 0 with {tree.sockets} sockets (UPI / xGMI spec), got {tree.socket_link_GBps}",
        )
    require(
        len(tree.nic_switches) == hw.nics_per_node and all(0 <= s < switches for s in tree.nic_switches),
        "hardware.pcie.nic_switches",
        f"needs one switch index in [0, {switches}) per NIC ({hw.nics_per_node}), got {list(tree.nic_switches)}",
    )


def _validate_rates(hw: DictConfig) -> None:
    """The compute model's parameters (moe_core.sim.compute) and the links' shares: rates and costs >= 0,
    fractions in range, a known all-to-all curve."""
    for key in ("peak_tflops", "fp8_peak_tflops", "memory_GBps", "kernel_launch_us"):
        require(
            math.isfinite(hw[key]) and hw[key] >= 0, f"hardware.{key}", f"must be a finite number >= 0, got {hw[key]}"
        )
    for key in ("compute_efficiency", "memory_efficiency", "intra_node_efficiency", "nic_efficiency"):
        require(0 < hw[key] <= 1, f"hardware.{key}", f"is a fraction of the spec rate, in (0, 1]; got {hw[key]}")
    require(
        0 <= hw.gemm_exposed_memory <= 1,
        "hardware.gemm_exposed_memory",
        f"is the share of a GEMM's memory time left exposed, in [0, 1]; got {hw.gemm_exposed_memory}",
    )
    if hw.all_to_all_curve:
        curves = sorted(p.stem for p in COLLECTIVE_CURVES_DIR.glob("*.yaml"))
        require(
            hw.all_to_all_curve in curves,
            "hardware.all_to_all_curve",
            f"unknown curve {hw.all_to_all_curve!r}; use one of {curves} (configs/collective_curves/) or ''",
        )
    for phase, multiplier in hw.phase_efficiency.items():
        require(
            phase in COMPUTE_PHASES,
            f"hardware.phase_efficiency.{phase}",
            f"unknown op class; expected one of {list(COMPUTE_PHASES)}",
        )
        require(
            math.isfinite(multiplier) and multiplier > 0,
            f"hardware.phase_efficiency.{phase}",
            f"is a multiplier on the compute model's speed, a finite number > 0; got {multiplier}",
        )


def _validate_model(cfg: DictConfig) -> None:
    """The model and its MoE layers, then how they lay out over the ranks (in that order: the first
    failing check names its key)."""
    _validate_model_shape(cfg.model)
    _validate_moe(cfg.moe)
    _validate_pipeline(cfg)
    _validate_expert_layout(cfg)
    _validate_tensor_parallel(cfg)
    _validate_grid(cfg)


def _validate_model_shape(m: DictConfig) -> None:
    """The transformer's sizes: positive dimensions, heads that divide the width, key/value heads that
    divide the heads, a known activation, MoE layers within the model, an embedding that fits."""
    require_at_least(m, "model", 1, ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "seq_len"))
    require(
        m.head_dim >= 0, "model.head_dim", f"features per head, must be >= 0 (0: d_model / n_heads), got {m.head_dim}"
    )
    require(
        m.head_dim > 0 or m.d_model % m.n_heads == 0,
        "model.n_heads",
        f"must divide model.d_model={m.d_model} (or set model.head_dim), got {m.n_heads}",
    )
    require(
        m.n_kv_heads == 0 or (m.n_kv_heads > 0 and m.n_heads % m.n_kv_heads == 0),
        "model.n_kv_heads",
        f"key/value heads, each shared by n_heads / n_kv_heads query heads: must divide model.n_heads={m.n_heads} "
        f"(0: as many as n_heads), got {m.n_kv_heads}",
    )
    require(
        m.ffn_activation in FFN_ACTIVATIONS,
        "model.ffn_activation",
        f"invalid value {m.ffn_activation!r}, expected one of {list(FFN_ACTIVATIONS)}",
    )
    require(
        0 <= m.moe_every <= m.n_layers,
        "model.moe_every",
        f"must be between 0 (a dense model) and model.n_layers={m.n_layers} (every moe_every-th layer is MoE), "
        f"got {m.moe_every}",
    )
    embedding_bytes = 2 * m.vocab_size * m.d_model * 4
    require(
        embedding_bytes <= MAX_EMBEDDING_BYTES,
        "model.vocab_size",
        f"embedding and head of {m.vocab_size} x {m.d_model} take {embedding_bytes / 2**30:.0f} GiB "
        f"(limit {MAX_EMBEDDING_BYTES / 2**30:.0f} GiB); use a smaller vocabulary",
    )


def _validate_moe(moe: DictConfig) -> None:
    """The MoE layers' routing: top_k experts of num_experts, capacity, aux loss and groups in range."""
    require(moe.top_k >= 1, "moe.top_k", f"experts per token, must be >= 1, got {moe.top_k}")
    require(moe.num_experts >= moe.top_k, "moe.num_experts", f"must be >= moe.top_k={moe.top_k}, got {moe.num_experts}")
    require(
        math.isfinite(moe.capacity_factor) and moe.capacity_factor > 0,
        "moe.capacity_factor",
        f"must be > 0, got {moe.capacity_factor}",
    )
    require(moe.min_capacity >= 0, "moe.min_capacity", f"must be >= 0, got {moe.min_capacity}")
    require(
        math.isfinite(moe.aux_loss_weight) and moe.aux_loss_weight >= 0,
        "moe.aux_loss_weight",
        f"must be >= 0, got {moe.aux_loss_weight}",
    )
    require(moe.group_size >= 0, "moe.group_size", f"must be >= 0 (0 = one group per rank), got {moe.group_size}")


def _validate_expert_layout(cfg: DictConfig) -> None:
    """The experts' layout over a pipeline stage's ranks (moe_core.layout's rules), and how the experts
    split under tensor parallelism."""
    moe = cfg.moe
    stage_ranks = cfg.parallel.world_size // cfg.parallel.pipeline_parallel  # a stage's layout (all of it at pp 1)
    etp = moe.expert_tensor_parallel
    require(
        etp in (0, 1, cfg.parallel.tensor_parallel),
        "moe.expert_tensor_parallel",
        f"0 (as parallel.tensor_parallel), 1 (whole experts) or parallel.tensor_parallel="
        f"{cfg.parallel.tensor_parallel}; got {etp}",
    )
    error = layout_error(
        stage_ranks, moe.num_experts, moe.experts_per_rank, cfg.parallel.tensor_parallel, grid_config(cfg)
    )
    if error and cfg.parallel.pipeline_parallel > 1:
        error = (
            f"config key 'parallel.pipeline_parallel': each stage lays out its {stage_ranks} ranks "
            f"(parallel.world_size / pipeline_parallel) as a run does, and {ERROR_KEY.sub('', error)}"
        )
    if error:
        raise ConfigError(error)


def _validate_pipeline(cfg: DictConfig) -> None:
    """Pipeline stages split the ranks and the blocks evenly, each
    model chunk repeating the model's MoE pattern (moe_core.sim.pipeline simulates a stage as a
    model of its own blocks); interleaving needs stages and, as Megatron's, whole rounds of
    micro-batches."""
    tr, par, m = cfg.train, cfg.parallel, cfg.model
    require_at_least(par, "parallel", 1, ("pipeline_parallel", "virtual_pipeline"))
    m_b, pp, v = tr.micro_batches, par.pipeline_parallel, par.virtual_pipeline
    require(
        par.world_size % pp == 0,
        "parallel.pipeline_parallel",
        f"stages split the ranks evenly: must divide parallel.world_size={par.world_size}, got {pp}",
    )
    require(
        par.pipeline_split in PIPELINE_SPLITS,
        "parallel.pipeline_split",
        f"invalid value {par.pipeline_split!r}, expected one of {list(PIPELINE_SPLITS)}",
    )
    chunks, counted = pp * v, m.n_layers + (2 if par.pipeline_split == "embedding_and_loss" else 0)
    require(
        counted % chunks == 0 and counted // chunks >= (2 if counted > m.n_layers else 1),
        "parallel.pipeline_parallel" if v == 1 else "parallel.virtual_pipeline",
        f"the {chunks} model chunks (pipeline_parallel={pp} x virtual_pipeline={v}) must split model.n_layers="
        f"{m.n_layers} evenly" + (" with the embedding and the loss counted as blocks" if counted > m.n_layers else ""),
    )
    sizes = set(pipeline_chunk_blocks(cfg))
    require(
        chunks == 1 or m.moe_every == 0 or all(size % m.moe_every == 0 for size in sizes),
        "model.moe_every",
        f"every model chunk (of {sorted(sizes)} blocks) must repeat the MoE pattern: moe_every must divide each, "
        f"got {m.moe_every}",
    )
    if v > 1:
        require(
            pp > 1, "parallel.virtual_pipeline", f"interleaves pipeline stages; needs pipeline_parallel > 1, got {pp}"
        )
        require(
            m_b % pp == 0,
            "train.micro_batches",
            f"the interleaved schedule runs micro-batches in rounds of pipeline_parallel={pp}; must be a multiple, got "
            f"{m_b}",
        )


def _validate_recompute_and_precision(cfg: DictConfig) -> None:
    """Partial recomputation counts blocks of full recomputation; FP8 GEMMs need a device that has
    them and a 2-byte train.dtype for everything around them."""
    tr = cfg.train
    require(
        tr.recompute_layers == 0 or (tr.recompute == "full" and 0 < tr.recompute_layers <= cfg.model.n_layers),
        "train.recompute_layers",
        f"counts the blocks of full recomputation, 1 to model.n_layers={cfg.model.n_layers} with "
        f"train.recompute=full, or 0 for every block; got {tr.recompute_layers} with train.recompute={tr.recompute}",
    )
    if tr.fp8 == "none":
        return
    require(
        cfg.hardware.fp8_peak_tflops > 0,
        "train.fp8",
        f"needs a device with FP8 GEMMs; hardware '{cfg.hardware.name}' sets no hardware.fp8_peak_tflops "
        "(set it from the spec sheet, or use train.fp8=none)",
    )
    require(
        tr.dtype == "bfloat16",
        "train.fp8",
        f"FP8 linear layers run inside a bfloat16 step; use train.dtype=bfloat16, got {tr.dtype}",
    )
    require(
        grid_config(cfg).is_trivial,
        "train.fp8",
        "the 3D grid prices its linear layers itself and has no FP8 GEMMs yet; use train.fp8=none with parallel.grid",
    )


def _validate_grid(cfg: DictConfig) -> None:
    """The grid splits heads, features and weight blocks; its overlaps are counts and switches."""
    grid, m = grid_config(cfg), cfg.model
    cached = cfg.comm.grid_overlap.cached_layers
    require(
        0 <= cached <= m.n_layers,
        "comm.grid_overlap.cached_layers",
        f"counts blocks, between 0 and model.n_layers={m.n_layers}; got {cached}",
    )
    if grid.is_trivial:
        return
    for key, plain in (("n_kv_heads", 0), ("head_dim", 0), ("ffn_activation", "relu")):
        require(
            m[key] == plain,
            f"model.{key}",
            f"the 3D grid splits multi-head attention and a ReLU FFN only; use model.{key}={plain} with parallel.grid",
        )
    error = grid_split_error(grid, m.d_model, m.d_ff, m.n_heads)
    if error:
        raise ConfigError(f"config key 'parallel.grid': {error}")
    require(
        cfg.train.recompute == "none",
        "train.recompute",
        f"the 3D grid does not recompute activations yet; use train.recompute=none with parallel.grid, got "
        f"{cfg.train.recompute!r}",
    )


def _validate_step_exchange(cfg: DictConfig) -> None:
    """The step's token exchange and re-layout each state what they need of the layout."""
    refused = step_refusal(cfg)
    if refused is not None:
        raise ConfigError(f"config key '{refused[0]}': {refused[1]}")


def _validate_tensor_parallel(cfg: DictConfig) -> None:
    """Tensor parallelism splits heads and FFN hidden units, and its dispatches split capacity slots."""
    tp, m, comm = cfg.parallel.tensor_parallel, cfg.model, cfg.comm
    allowed = tensor_parallel_dispatchers()
    require(
        comm.tp_dispatch in allowed,
        "comm.tp_dispatch",
        f"invalid value '{comm.tp_dispatch}', expected one of {sorted(allowed)}",
    )
    require(comm.tp_chunks >= 0, "comm.tp_chunks", f"must be >= 0 (0 = the dispatch decides), got {comm.tp_chunks}")
    if tp == 1:
        return
    for key in ("n_heads", "n_kv_heads", "d_ff"):
        require(m[key] % tp == 0, "parallel.tensor_parallel", f"must divide model.{key}={m[key]}, got {tp}")
    if expert_tensor_parallel(cfg) == 1:  # whole experts: each rank's tokens are its own, nothing to drop
        return
    require(
        not cfg.moe.dropless,
        "moe.dropless",
        "tensor parallelism dispatches capacity buffers (DeepSpeed's layout); set moe.dropless=false "
        "or parallel.tensor_parallel=1",
    )
    rows = dispatch_rows_per_expert(cfg)
    require(
        comm.tp_dispatch == "duplicate" or rows % tp == 0,
        "parallel.tensor_parallel",
        f"comm.tp_dispatch={comm.tp_dispatch} gives each tensor-parallel rank 1/{tp} of the {rows} capacity "
        f"slots per expert, which {tp} must divide; change moe.capacity_factor, train.batch_size or moe.min_capacity",
    )
    chunks = comm.tp_chunks or 1
    require(
        (rows // tp) % chunks == 0,
        "comm.tp_chunks",
        f"must divide the {rows // tp} capacity slots per expert a tensor-parallel rank sends, got {comm.tp_chunks}",
    )


def _validate_training(cfg: DictConfig) -> None:
    tr, par, comm = cfg.train, cfg.parallel, cfg.comm
    require_at_least(tr, "train", 1, ("batch_size", "iters", "data_branching"))
    require_at_least(tr, "train", 0, ("warmup_iters",))
    require_seed(tr.seed, "train.seed")
    require(math.isfinite(tr.lr) and tr.lr > 0, "train.lr", f"must be a finite number > 0, got {tr.lr}")
    require(
        math.isfinite(tr.data_zipf) and tr.data_zipf >= 0,
        "train.data_zipf",
        f"must be a finite number >= 0, got {tr.data_zipf}",
    )
    require(
        tr.data_branching <= cfg.model.vocab_size,
        "train.data_branching",
        f"successors per token must be <= model.vocab_size={cfg.model.vocab_size}, got {tr.data_branching}",
    )
    _validate_micro_batches(cfg)
    _validate_recompute_and_precision(cfg)
    require(
        math.isfinite(par.timeout_s) and 1 <= par.timeout_s <= MAX_TIMEOUT_S,
        "parallel.timeout_s",
        f"must be between 1 and {MAX_TIMEOUT_S:.0f} seconds, got {par.timeout_s}",
    )
    require(
        comm.policy in POLICIES, "comm.policy", f"invalid value '{comm.policy}', expected one of {sorted(POLICIES)}"
    )
    _validate_step_exchange(cfg)
    _validate_data_sharding(cfg)
    for key in ("bucket_mb", "partition_mb"):
        require(math.isfinite(comm[key]) and comm[key] > 0, f"comm.{key}", f"must be > 0, got {comm[key]}")
    require(
        comm.packing_interval_iters >= 1,
        "comm.packing_interval_iters",
        f"must be >= 1 step, got {comm.packing_interval_iters}",
    )
    c = cfg.collectives
    require(
        0 < c.min_bytes <= c.max_bytes,
        "collectives.min_bytes",
        f"must satisfy 0 < min_bytes <= max_bytes={c.max_bytes}, got {c.min_bytes}",
    )
    require(c.step_factor >= 2, "collectives.step_factor", f"must be >= 2, got {c.step_factor}")
    require(c.world_size >= 2, "collectives.world_size", f"collectives need >= 2 ranks, got {c.world_size}")
    require_at_least(c, "collectives", 1, ("iters", "latency_iters"))
    require_at_least(c, "collectives", 0, ("warmup_iters", "latency_bytes"))
    require_seed(c.seed, "collectives.seed")
    require(
        math.isfinite(c.traffic_zipf) and c.traffic_zipf >= 0,
        "collectives.traffic_zipf",
        f"must be >= 0, got {c.traffic_zipf}",
    )


def _validate_data_sharding(cfg: DictConfig) -> None:
    """Sharding applies to replicated weights and, fully sharded, to DDP-like gradient plans."""
    sharding, policy = cfg.parallel.data_sharding, cfg.comm.policy
    require(
        sharding == "none" or grid_config(cfg).is_trivial,
        "parallel.data_sharding",
        f"{sharding!r} with a 3D grid: the grid shards its weights over parallel.grid.depth itself "
        "(moe_core.grid); use parallel.data_sharding=none under parallel.grid",
    )
    features = gradient_features(cfg) if sharding == "full" else []
    require(
        not features,
        "parallel.data_sharding",
        f"'full' replaces the policy's gradient units by FSDP's per-block ones, but policy '{policy}' "
        f"{' and '.join(features)}; use parallel.data_sharding=optimizer (or none) with it, or a policy "
        "that buckets its gradients (sequential, overlap)",
    )


def pipeline_chunk_blocks(cfg: DictConfig) -> list[int]:
    """Blocks of each of the pp x virtual_pipeline model chunks in model order (chunk j runs on stage
    j mod pp): all alike, or under ``parallel.pipeline_split=embedding_and_loss`` the first (beside
    the embedding) and the last (beside the loss) one block short."""
    par = cfg.parallel
    chunks = par.pipeline_parallel * par.virtual_pipeline
    if par.pipeline_split == "blocks":
        return [cfg.model.n_layers // chunks] * chunks
    sizes = [(cfg.model.n_layers + 2) // chunks] * chunks
    sizes[0] -= 1
    sizes[-1] -= 1
    return sizes


def micro_batch_config(cfg: DictConfig) -> DictConfig:
    """The config of one gradient-accumulation pass: ``train.batch_size / train.micro_batches``
    sequences in one pass; ``cfg`` itself when there is one pass. What a pass's shapes (its tokens,
    the expert capacity) are computed from."""
    passes = cfg.train.micro_batches
    if passes == 1:
        return cfg
    one_pass = {"batch_size": cfg.train.batch_size // passes, "micro_batches": 1}
    # a pass is one forward and backward; a pipeline schedules its passes (moe_core.sim.pipeline)
    micro = OmegaConf.merge(cfg, {"train": one_pass, "parallel": {"pipeline_parallel": 1, "virtual_pipeline": 1}})
    OmegaConf.set_readonly(micro, True)
    return micro


def _validate_micro_batches(cfg: DictConfig) -> None:
    """Passes divide the per-rank batch, and one pass is a valid step of its own (its tokens split
    into gate groups, its capacity slots over "tp")."""
    passes, batch = cfg.train.micro_batches, cfg.train.batch_size
    key = "train.micro_batches"
    require(passes >= 1, key, f"counts gradient-accumulation passes, must be >= 1, got {passes}")
    require(
        batch % passes == 0,
        key,
        f"must divide train.batch_size={batch} (each pass takes batch_size / micro_batches sequences), got {passes}",
    )
    tokens = batch // passes * cfg.model.seq_len
    require(
        cfg.moe.group_size == 0 or tokens % cfg.moe.group_size == 0,
        "moe.group_size",
        f"must divide a micro-batch's tokens (train.batch_size / train.micro_batches * model.seq_len = {tokens}), "
        f"got {cfg.moe.group_size}",
    )
    if passes > 1:
        try:
            _validate_model(micro_batch_config(cfg))
        except ConfigError as err:
            raise ConfigError(f"config key '{key}': a pass of {batch // passes} sequences is invalid: {err}") from None


def validate_measured(cfg: DictConfig) -> None:
    """What the measured executor (experiments/train_step.py) cannot run yet: settings the step
    simulator (moe_core.sim.step) alone models. Raises ConfigError naming the key to change."""
    # first: a pipeline also needs micro-batches, and the error names its root
    for key in ("parallel.pipeline_parallel", "parallel.virtual_pipeline"):
        require(
            OmegaConf.select(cfg, key) == 1,
            key,
            f"is simulated only (moe_core.sim.pipeline): a measured run has no pipeline schedule; set it in "
            f"sim_sweep.overrides or a simulated config, not for the measured run (got {OmegaConf.select(cfg, key)})",
        )
    require(
        cfg.moe.expert_tensor_parallel in (0, cfg.parallel.tensor_parallel),
        "moe.expert_tensor_parallel",
        "whole experts under tensor parallelism are simulated only: the measured executor splits experts over "
        '"tp"; use moe.expert_tensor_parallel=0 for measured runs',
    )
    sharding = cfg.parallel.data_sharding
    require(
        sharding == "none",
        "parallel.data_sharding",
        f"{sharding!r} is simulated only: the measured executor has no sharded data parallelism yet; "
        "use parallel.data_sharding=none for measured runs",
    )
    passes = cfg.train.micro_batches
    require(
        passes == 1,
        "train.micro_batches",
        f"{passes} passes are simulated only: the measured executor has no gradient accumulation yet; "
        "use train.micro_batches=1 for measured runs",
    )
    require(
        cfg.train.recompute == "none",
        "train.recompute",
        f"{cfg.train.recompute!r} is simulated only: the measured executor has no activation recomputation yet; "
        "use train.recompute=none for measured runs",
    )
    require(
        cfg.train.fp8 == "none",
        "train.fp8",
        f"{cfg.train.fp8!r} is simulated only: the measured executor has no FP8 GEMMs; use train.fp8=none for "
        "measured runs",
    )


def _validate_sweeps(cfg: DictConfig) -> None:
    s, sim = cfg.sweep, cfg.sim_sweep
    for key in ("world_size", "num_experts", "policy", "seed", "tensor_parallel"):
        require(len(s[key]) > 0, f"sweep.{key}", "must list at least one value")
    for key in ("world_size", "num_experts", "experts_per_rank", "tensor_parallel"):
        require(min(s[key], default=1) >= 1, f"sweep.{key}", f"values must be >= 1, got {list(s[key])}")
    for seed in s.seed:
        require_seed(seed, "sweep.seed")
    require_choices(s.policy, POLICIES, "sweep.policy")
    _, impossible = sweep_points(cfg)
    if impossible and not s.skip_impossible:
        raise ConfigError(
            f"config key 'sweep': {len(impossible)} point(s) can never run, e.g. {impossible[0]}; fix the "
            "axes, or set sweep.skip_impossible=true to leave such points out"
        )
    require(
        sim.paper in PAPER_NAMES,
        "sim_sweep.paper",
        f"'{sim.paper}' is not a paper of the suite; allowed: {list(PAPER_NAMES)}",
    )
    for hardware in sim.hardware:
        require_profile(hardware, "sim_sweep.hardware")
    require(
        min(sim.world_size, default=1) >= 1, "sim_sweep.world_size", f"values must be >= 1, got {list(sim.world_size)}"
    )
    require(sim.experts_per_rank >= 1, "sim_sweep.experts_per_rank", f"must be >= 1, got {sim.experts_per_rank}")
    require_choices(sim.policy, POLICIES, "sim_sweep.policy")


def config_digest(cfg: DictConfig) -> str:
    """A short name for ``cfg``'s content (what save_config writes): equal configs, equal digests."""
    return hashlib.sha256(OmegaConf.to_yaml(cfg, resolve=True).encode()).hexdigest()[:12]


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)
