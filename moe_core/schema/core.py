"""The configuration's schema: the core's sections as structured dataclasses (every key, its type,
its default and what it means) and the root that holds them with every registered paper section.

The root is assembled, and configs are loaded, by moe_core.config.load, which imports the papers' registry
first; the checks a type cannot express are in moe_core.schema.validation, reading and deriving configs in
moe_core.schema.derive. This module imports no paper.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import Literal

from moe_core.schema.sections import (
    SECTIONS,
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
class EpKernelConfig:
    """What expert-parallel communication kernels (DeepEP's, pplx's: moe_core.sim.ep_kernels) reach on
    the links, as shares of the line rates; they differ from a collective library's (NCCL's shares
    above) because a kernel runs on a few SMs and forwards inside the node itself. All three or none:
    0 = the kernels are not measured here, and the kernel dispatchers' exchanges are priced as the
    collective library's all-to-alls (what they run as on a testbed without the kernels)."""

    nvlink_efficiency: float = 0.0  # share of intra_node_GBps a kernel's NVLink traffic reaches
    nic_efficiency: float = 0.0  # share of nic_GBps its RDMA traffic reaches
    latency_us: float = 0.0  # fixed cost of one kernel: launch, notify and the last message's flight


@dataclass
class EmulationConfig:
    """Emulated multi-node testbed on one Linux host (measured runs, moe_core.host.testbed).

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

    name: str = ""  # the profile's own, or its file's name (moe_core.schema.derive._load_hardware)
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
    # The optimizer's update as fused kernels (XLA on a TPU, torch's fused=True, Apex and Transformer
    # Engine's FusedAdam under Megatron): 7 passes over the parameters. False: torch's default AdamW,
    # 8 elementwise ops making 21 passes (foreach on a GPU, per tensor on a CPU). moe_core.sim.compute.
    fused_optimizer: bool = False
    # Per op class ("dense", "gate", "expert"): calibrated multipliers on the compute model's speed
    # (an op takes model time / this); 1 when absent. Calibration fits them from measured phase times.
    phase_efficiency: dict[str, float] = field(default_factory=dict)
    # CPU testbeds: the ranks of a node share this many cores, so each rank computes at
    # peak * min(1, host_cores / ranks on its node), and concurrent collectives share the host for
    # their latency (protocol work); 0 = devices do not share compute (GPUs).
    host_cores: int = 0
    # CPU testbeds with more ranks than cores: the scheduler time-slices them, so at a blocking
    # collective the ranks wait for the one it left last: ``host_wake_ms + host_slice_ms * (1 -
    # exp(-c / host_slice_ms))``, c the compute each rank did since its last wait
    # (moe_core.sim.time_slicing). Calibration measures both on the host; 0 = not modelled.
    host_wake_ms: float = 0.0
    host_slice_ms: float = 0.0
    # CPU testbeds: copy throughput of the host's cores, which every byte a collective sends crosses
    # (gloo and TCP run there); 0 = not modelled. Calibration fits it.
    host_GBps: float = 0.0
    gpu_classes: list[GpuClass] = field(default_factory=list)  # heterogeneous devices (optional)
    collectives: dict[str, CollectiveFit] = field(default_factory=dict)  # calibrated terms (optional)
    emulation: EmulationConfig = field(default_factory=EmulationConfig)
    ep_kernels: EpKernelConfig = field(default_factory=EpKernelConfig)
    # A calibrated profile's quality: how many of the records it was fitted on were taken on a noisy
    # host (moe_core.host.noise.noise_summary; experiments/calibrate.py writes it); empty otherwise.
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
    # The token dispatcher a training step runs, by its registry name (moe_core.dispatch; Megatron's
    # --moe-token-dispatcher-type): capacity, hierarchical (two phases over the nodes), dropless (no
    # capacity: uneven all-to-all splits, no token ever dropped), or with experts split over "tp"
    # duplicate, drop-gather, monta; "auto": drop-gather where experts are split over "tp", else capacity.
    dispatcher: str = "auto"
    dropless: bool | None = None  # retired: moe.dispatcher=dropless (moe_core.schema.aliases)
    # The gate's forward copies its expert counts to the host, a host-device sync: on a GPU the host
    # stops issuing ahead there (measured: moe_core.model.layer; simulated: moe_core.sim.engine.issued_by_host).
    # DeepSpeed-MoE's top-k gating did (deepspeed/moe/sharded_moe.py, from 2021 until PR #5578,
    # 2024-08-22: "will cause device to host synchronization which damage performance"); off by default.
    gate_host_sync: bool = False
    # How a capacity dispatch moves tokens into its (E, C) slots and back (moe_core.model.layer):
    # "index", a row scatter and gather (Megatron, Tutel's fast dispatcher, this suite's default); or
    # "einsum", GShard's Algorithm 2 as DeepSpeed-MoE runs it (deepspeed/moe/sharded_moe.py, MOELayer:
    # einsum("sec,sm->ecm", dispatch_mask, tokens) and einsum("sec,ecm->sm", combine_weights, out)),
    # dense GEMMs against one-hot (S, E, C) masks, quadratic in the group size S. Same numbers, other cost.
    permute: Literal["index", "einsum"] = "index"
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
    """The tensor axes of a 3D tensor-parallel grid (moe_core.parallel.grid): ``row x col`` ranks split every
    dense linear layer, ``depth`` shards the blocks and splits the batch; data parallel is the rest."""

    depth: int = 1
    row: int = 1
    col: int = 1


@dataclass
class ParallelConfig:
    """Process layout (moe_core.parallel.layout): ``expert_parallel = num_experts / experts_per_rank``,
    ``tensor_parallel`` ranks share each group's tokens and split its weights, the rest is data parallel."""

    world_size: int = 4
    # Expert-parallel ranks (Megatron's --expert-model-parallel-size): sets moe.experts_per_rank =
    # num_experts / expert_parallel (moe_core.schema.aliases); 0: num_experts / experts_per_rank.
    expert_parallel: int = 0
    tensor_parallel: int = 1  # Megatron-style, of attention, dense FFNs and experts (moe_core.parallel.tensor_parallel)
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
    """AxoNN's overlaps of the grid's collectives with compute (moe_core.parallel.grid.GridOverlaps)."""

    all_reduce: bool = False  # backward input-gradient all-reduce behind the weight-gradient matmul
    reduce_scatter: bool = False  # weight-gradient reduce-scatter completed after the backward pass
    all_gather: bool = False  # the next layer's weight all-gather issued before this layer computes
    cached_layers: int = 0  # the first N blocks keep their gathered weights from forward for backward


@dataclass
class CommConfig:
    """Communication policy of a training step (see moe_core.schedule.policies)."""

    policy: str = "sequential"  # a registered policy (moe_core.schedule.policies.POLICIES)
    bucket_mb: float = 4.0  # gradient bucket size of the `overlap` policy (DDP default is 25 MB)
    # Micro-op size of policies that cut their communication into micro-ops (e.g. Lina's tensor
    # partitioning: 30 MB by default, 10-100 MB studied).
    partition_mb: float = 30.0
    # Plans that pack experts (e.g. Lina's lina, lina-pack): steps between re-decisions of the
    # expert layout; the first follows the train.warmup_iters warm-up steps (Lina: every 4 steps).
    packing_interval_iters: int = 4
    # A drop-gather dispatcher's pipelined chunks (moe.dispatcher); 0 = the dispatcher's own decision
    tp_chunks: int = 0
    tp_dispatch: str = ""  # retired: moe.dispatcher=NAME (moe_core.schema.aliases)
    a2a_algorithm: str = ""  # retired: moe.dispatcher=hierarchical (moe_core.schema.aliases)
    # Under a 3D grid (parallel.grid): which of its collectives overlap compute (moe_core.parallel.grid.GridOverlaps)
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
    # Synthetic data: a random sparse Markov chain over the vocabulary (learnable, see moe_core.model.data).
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

    # A fit on records from a noisy host (moe_core.host.noise) replaces the last good profile only if true.
    accept_noisy: bool = False


@dataclass
class WandbConfig:
    mode: Literal["offline", "online", "disabled"] = "offline"  # WANDB_MODE overrides this
    project: str = "moe-comm-bench"
    entity: str | None = None
    # The group of every W&B run of this config's runs. Empty: "<sweep.name>-<config digest>@<hardware.name>"
    # (moe_core.schema.derive.run_group), filled in when the config is loaded, so a workflow's jobs all
    # read their run's group and the same sweep on other hardware or with another config never mixes.
    group: str = ""


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
        # Run what the load refuses only as too large (moe_core.schema.run_checks: a measured run's memory
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
