"""The checks a config's types cannot express: each raises :class:`ConfigError` whose message names
the key, what was wrong and what is allowed (the run's, a derived point's, and what a measured run
cannot do yet), and the shapes derived from a checked config (a micro-batch, a pipeline's chunks).
Imports no paper, so papers, run checks and the simulator use it without an import cycle.
"""

from __future__ import annotations

import math
import re

from omegaconf import DictConfig, ListConfig, OmegaConf

from moe_core.dispatch import configuration_refusal, configured, configured_name, routes_dropless
from moe_core.model.activation import FFN_ACTIVATIONS
from moe_core.parallel.grid import grid_split_error
from moe_core.parallel.layout import grid_config, layout_error
from moe_core.schedule.policies import POLICIES, gradient_features, step_refusal
from moe_core.schema.points import sweep_points
from moe_core.schema.sections import (
    COLLECTIVE_CURVES_DIR,
    ERROR_KEY,
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
    require(
        bool(WANDB_GROUP.fullmatch(cfg.wandb.group)),
        "wandb.group",
        f"{cfg.wandb.group!r} must be empty (named after the sweep, the config and the hardware) or at most "
        "128 letters, digits and '_', '-', '.', '+', '@'",
    )
    require(str(cfg.results_dir).strip() != "", "results_dir", "must name a directory")
    require(
        cfg.unstated == "" or bool(UNSTATED_SETTING.match(cfg.unstated)),
        "unstated",
        "must be '' or settings key=value of plain words joined by ',' "
        f"(e.g. hardware.nic_efficiency=0.67,train.batch_size=4), got {cfg.unstated!r}",
    )
    validate_hardware(cfg.hardware)


_SETTING = r"[A-Za-z0-9_.]+=[A-Za-z0-9_.+-]+"
UNSTATED_SETTING = re.compile(rf"^{_SETTING}(,{_SETTING})*\Z")
# A W&B group (W&B allows 128 characters): a run group of moe_core.schema.derive.run_group, or a name.
WANDB_GROUP = re.compile(r"[A-Za-z0-9_.+@-]{0,128}")


def validate_hardware(hw: DictConfig) -> None:
    """A hardware section (a run's, or a profile read alone): its shape, then its rates, then that
    every rate is physically plausible."""
    _validate_shape(hw)
    _validate_rates(hw)
    validate_plausible_rates(hw)


# The range a profile's nonzero rate or time must lie in, by its key's unit suffix (0 is "unknown"
# where a key allows it). Wide: rates up to a million times today's fastest (NVLink 5, 900 GB/s per
# direction; 2,000 dense FP8 TFLOP/s) and down to 1e-4 (calibration's own lower bound on a link,
# moe_core.sim.calibrate, a thousandth of a 1 Gb/s emulated link); times up to a second of latency, a
# minute of host time slice. Outside them a value is a typo in units, and the simulator's times
# overflow to inf (1e308 GB/s) or print hundreds of digits (1e-300 GB/s).
PLAUSIBLE_RANGES = {"_GBps": (1e-4, 1e9), "_tflops": (1e-4, 2e9), "_us": (0.0, 1e6), "_ms": (0.0, 6e4)}


def validate_plausible_rates(hw: DictConfig, prefix: str = "hardware") -> None:
    """Every rate and time of a hardware section (its nested parts too: pcie, gpu_classes,
    collectives) is 0 or within PLAUSIBLE_RANGES for its unit; ConfigError naming the full key."""
    for key, value in hw.items():
        where = f"{prefix}.{key}"
        if isinstance(value, DictConfig):
            validate_plausible_rates(value, where)
        elif isinstance(value, ListConfig):
            for i, item in enumerate(value):
                if isinstance(item, DictConfig):
                    validate_plausible_rates(item, f"{where}[{i}]")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            _require_plausible(key, value, where)


def _require_plausible(key: str, value: float, where: str) -> None:
    """``value`` of ``key`` (full key ``where``) is 0 or within the range of its unit, if it has one."""
    unit = next((u for u in PLAUSIBLE_RANGES if key.endswith(u)), None)
    if unit is None or value == 0:
        return
    low, high = PLAUSIBLE_RANGES[unit]
    require(
        math.isfinite(value) and low <= value <= high,
        where,
        f"{value:g} is not a plausible value in {unit.lstrip('_')} (0 for unknown, else {low:g} to {high:g}); "
        "check the profile's units",
    )


def _validate_shape(hw: DictConfig) -> None:
    """Nodes, devices and NICs are counts >= 1; links' rates and latencies finite and >= 0 (0: unknown)."""
    require_at_least(hw, "hardware", 1, ("nodes", "devices_per_node", "nics_per_node"))
    require_at_least(hw, "hardware", 0, ("host_cores", "host_wake_ms", "host_slice_ms"))
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
    for key in ("nvlink_efficiency", "nic_efficiency"):
        share = hw.ep_kernels[key]
        require(
            0 <= share <= 1,
            f"hardware.ep_kernels.{key}",
            f"is a share of the line rate in [0, 1] (0: unknown); got {share}",
        )
    latency = hw.ep_kernels.latency_us
    require(
        math.isfinite(latency) and latency >= 0, "hardware.ep_kernels.latency_us", f"must be >= 0 us, got {latency}"
    )
    stated = [key for key in ("nvlink_efficiency", "nic_efficiency", "latency_us") if hw.ep_kernels[key] > 0]
    require(
        len(stated) in (0, 3),
        "hardware.ep_kernels",
        f"give all of nvlink_efficiency, nic_efficiency and latency_us, or none (0); got only {stated}",
    )
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
    _validate_permute(cfg)
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
    """The experts' layout over a pipeline stage's ranks (moe_core.parallel.layout's rules), and how the experts
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
    """Tensor parallelism splits heads and FFN hidden units; the token dispatcher states what it needs
    of the layout (checked here, so a micro-batch's pass is checked too)."""
    tp, m, comm = cfg.parallel.tensor_parallel, cfg.model, cfg.comm
    require(comm.tp_chunks >= 0, "comm.tp_chunks", f"must be >= 0 (0 = the dispatch decides), got {comm.tp_chunks}")
    for key in ("n_heads", "n_kv_heads", "d_ff"):
        require(m[key] % tp == 0, "parallel.tensor_parallel", f"must divide model.{key}={m[key]}, got {tp}")
    reason = configuration_refusal(cfg)
    require(reason is None, "moe.dispatcher", reason)


def _validate_permute(cfg: DictConfig) -> None:
    """The einsum permutation fills capacity slots; a dropless dispatcher has none to fill."""
    require(
        cfg.moe.permute == "index" or not routes_dropless(cfg),
        "moe.permute",
        f"einsum fills the capacity slots of GShard's dispatch, and moe.dispatcher={configured_name(cfg)} "
        "routes dropless (no slots): set moe.permute=index or a capacity dispatcher",
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
        "(moe_core.parallel.grid); use parallel.data_sharding=none under parallel.grid",
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
    reason = configured(cfg).measured_refusal()
    require(reason is None, "moe.dispatcher", f"{reason}; choose another dispatcher for measured runs")
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
