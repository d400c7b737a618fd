"""Checks of a whole run at load: what a run derives from its config is checked with it, so nothing
it derives fails after a process started.

moe_core.config.load.load_config runs :func:`check_run` after the config's own checks, for every entry
point, the launcher and the workflow:

* every list-valued override key of a section (moe_core.schema.points.OVERRIDE_LISTS: ``sim_sweep.overrides``,
  ``lina.overrides``, ``monta.overrides``, ``inference.overrides``, ``axonn.measured_overrides``):
  each entry a ``key=value`` that does not decide where records go (RECORD_KEYS) nor sets another
  list, and the list applied to the run's config, in every context it is used in, a valid config;
* every measured training-step point (moe_core.schema.points.measured_points): its config valid, and none
  of the settings only the simulator models (moe_core.schema.validation.validate_measured);
* sizes (:func:`check_sizes`): every rank count a key sets, measured or simulated (:func:`rank_counts`,
  :func:`measured_jobs`: the run's, the sweeps', every section's jobs and studies, a profile's nodes),
  within MAX_SIM_WORLD_SIZE ranks (:func:`too_many_ranks`); each measured job's memory on this host
  (a CPU testbed: every rank's process, RANK_PROCESS_BYTES, and what its config sizes, e.g. a training
  step's parameters, gradients, Adam state and activations, estimate_bytes) within the host's memory;
  the measured and simulated point counts within MAX_MEASURED_POINTS and MAX_SIM_POINTS;
* settings only the simulator runs (pipeline parallelism) off the measured run's config;
* settings a run would ignore (``comm.tp_chunks`` where nothing is tensor-parallel);
* the papers' own checks of what they derive (moe_core.schema.points.RUN_CHECKS).

The size checks can be overridden with ``force=true``; no other check can. A message names the key
the user set: an entry of a list as ``monta.overrides[2]``, a measured point's value by its sweep axis
(``sweep.seed``), the list or the sweep itself when the key it names was not set by either.
"""

from __future__ import annotations

import copy
import os
import socket

from omegaconf import DictConfig, OmegaConf

from moe_core.model.activation import in_width
from moe_core.model.capacity import moe_blocks
from moe_core.model.heads import head_dim, kv_heads
from moe_core.schema.derive import config_digest, derive_config, hardware_profile
from moe_core.schema.points import (
    MEASURED_POINTS,
    OVERRIDE_LISTS,
    RUN_CHECKS,
    point_name,
    point_overrides,
    sim_points,
    sweep_points,
)
from moe_core.schema.sections import ERROR_KEY, ConfigError, require
from moe_core.schema.validation import validate_measured, validate_point

# Keys that decide where a run's records go: set for the whole run, never inside an override list.
RECORD_KEYS = ("results_dir", "paper", "experiment")
MAX_MEASURED_POINTS = 256  # each a torchrun job of seconds to minutes: more is a typo in a sweep's axes
MAX_SIM_POINTS = 4096  # each a step simulation of up to seconds
# Ranks of any run, simulated or measured: the largest cluster a paper of the suite simulates (GShard's
# 2048 TPU cores) twice; the step simulator's cost grows with the ranks squared (its traffic matrices),
# and a measured job of more ranks is a typo on any cluster the suite runs on.
MAX_SIM_WORLD_SIZE = 4096
# A measured rank's process before its config sizes anything: Python, torch and the suite imported
# (about 260 MB resident on CPU).
RANK_PROCESS_BYTES = 2**28
# A measured sweep point's swept value -> the sweep axis that set it (a message names the axis).
SWEEP_AXES = {
    "parallel.world_size": "sweep.world_size",
    "moe.num_experts": "sweep.num_experts",
    "moe.experts_per_rank": "sweep.experts_per_rank",
    "comm.policy": "sweep.policy",
    "train.seed": "sweep.seed",
    "parallel.tensor_parallel": "sweep.tensor_parallel",
}


# The configs whose run passed check_run, as "<digest>@<host>" joined by ",", in this process or the one
# that started it: a launcher's ranks and a workflow's jobs inherit it and do not check again what
# their parent checked (the checks take most of a load). The host is part of the key because the
# memory check reads the host's memory (a SLURM job inherits its submitter's environment).
PASSED_ENV = "MOE_CORE_CHECKED_RUNS"
_REMEMBERED = 64  # the most recent passed configs kept in the variable


def check_run(cfg: DictConfig) -> None:
    """Every check above; ConfigError naming the key the user set. A config whose run passed once in
    this process or its parent, on this host, is not checked again (PASSED_ENV)."""
    key = f"{config_digest(cfg)}@{socket.gethostname()}"
    passed = [k for k in os.environ.get(PASSED_ENV, "").split(",") if k]
    if key in passed:
        return
    _check_run(cfg)
    os.environ[PASSED_ENV] = ",".join([*passed, key][-_REMEMBERED:])


def _check_run(cfg: DictConfig) -> None:
    validate_measured(cfg)  # first: every list and point below derives from the measured run's config
    for key, uses in OVERRIDE_LISTS.items():
        check_override_list(cfg, key, uses(cfg))
    check_sizes(cfg)  # before the points: a sweep of a million ranks or points is refused before each is validated
    check_point_counts(cfg)
    check_measured_points(cfg)
    check_ignored(cfg)
    for check in RUN_CHECKS:
        check(cfg)


def check_override_list(cfg: DictConfig, key: str, uses: list[list[str]]) -> None:
    """Each entry of the list ``key``, then each of its ``uses`` (the complete overrides it is applied
    to the run's config with)."""
    entries = list(OmegaConf.select(cfg, key))
    blame = {}
    for i, entry in enumerate(entries):
        name, equals, _ = entry.partition("=")
        where = f"{key}[{i}]"
        require(bool(equals), where, f"{entry!r} is not of the form key=value (e.g. model.d_model=1024)")
        name = name.strip()
        require(
            name.split(".")[0] not in RECORD_KEYS,
            where,
            f"{entry!r}: {name} decides where records go; set it for the whole run (top level), not in a list",
        )
        require(name not in OVERRIDE_LISTS, where, f"{entry!r}: an override list cannot set another")
        blame[name] = where
    for overrides in uses if entries else ():  # an empty list changes nothing its uses' points do not
        derived(cfg, overrides, key, blame, f"{key} applied to the run's config")


def derived(cfg: DictConfig, overrides: list[str], where: str, blame: dict[str, str], what: str) -> DictConfig:
    """``derive_config(cfg, overrides)``; its ConfigError names ``blame``'s key for the key it names
    (the entry or sweep axis that set it), else ``where``."""
    try:
        return derive_config(cfg, overrides)
    except ConfigError as err:
        raise _blamed(err, where, blame, what) from None


def _blamed(err: ConfigError, where: str, blame: dict[str, str], what: str) -> ConfigError:
    """``err`` of a derived config (``what``), named by the user's key: ``blame``'s for the key it
    names, else ``where``."""
    match = ERROR_KEY.match(str(err))
    inner = match[1] if match else ""
    key = next((blame[k] for k in blame if _same_key(inner, k)), where)
    return ConfigError(f"config key '{key}': {what}: {err}")


def _same_key(a: str, b: str) -> bool:
    """Whether two dotted keys are one, or one a section of the other."""
    return a == b or a.startswith(f"{b}.") or b.startswith(f"{a}.")


def check_measured_points(cfg: DictConfig) -> None:
    """Every measured training-step point's config is valid and fits this host: the sweep's points
    (blamed on their axes) and the papers' (blamed on their section). Points set leaves of the
    config only, so each is applied to one writable copy in turn, then undone (a copy per point
    would cost a tenth of a second each)."""
    points = [("sweep", p, SWEEP_AXES) for p in sweep_points(cfg)[0]]
    points += [(p["paper"], p, {}) for fn in MEASURED_POINTS for p in fn(cfg)]
    scratch = copy.deepcopy(cfg)
    OmegaConf.set_readonly(scratch, False)
    for where, point, blame in points:
        overrides = point_overrides(point)
        what = f"measured point {point_name(point)}"
        try:
            scratch.merge_with_dotlist(overrides)
            validate_point(scratch)
            validate_measured(scratch)
        except ConfigError as err:
            raise _blamed(err, where, blame, what) from None
        check_memory(scratch, f"{what} of {where}")
        for override in overrides:
            key = override.partition("=")[0]
            OmegaConf.update(scratch, key, OmegaConf.select(cfg, key), merge=False)


def host_memory_bytes() -> int:
    """This host's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# Per parameter: float32 weight, gradient and Adam's two moments. Per token and layer: the
# activations autograd keeps (about 16 d_model-wide and 2 d_ff-wide tensors, float32).
BYTES_PER_PARAM = 16


def estimate_bytes(cfg: DictConfig) -> dict[str, int]:
    """One measured rank's memory by the key that sizes each part: parameters (embedding and head by
    model.vocab_size, blocks by model.d_model, experts by moe.experts_per_rank), activations by
    train.batch_size; tensor parallelism splits the blocks' weights."""
    m, tp = cfg.model, max(cfg.parallel.tensor_parallel, cfg.parallel.grid.row * cfg.parallel.grid.col)
    moe_layers = len(moe_blocks(m.n_layers, m.moe_every))
    ffn = (in_width(m.ffn_activation) + 1) * m.d_model * m.d_ff
    attention_params = m.d_model * (2 * m.n_heads + 2 * kv_heads(m)) * head_dim(m)  # Q, K, V, out
    blocks = m.n_layers * attention_params + (m.n_layers - moe_layers) * ffn
    experts = moe_layers * cfg.moe.experts_per_rank * ffn
    tokens = cfg.train.batch_size * m.seq_len
    attention = cfg.train.batch_size * m.n_heads * m.seq_len**2
    activations = m.n_layers * (tokens * (16 * m.d_model + 2 * m.d_ff) + 2 * attention) * 4
    return {
        "model.vocab_size": 2 * m.vocab_size * m.d_model * BYTES_PER_PARAM,
        "model.d_model": blocks // tp * BYTES_PER_PARAM,
        "moe.experts_per_rank": experts // tp * BYTES_PER_PARAM,
        "train.batch_size": activations,
    }


def check_memory(cfg: DictConfig, where: str) -> None:
    """A measured training-step run fits this host (:func:`check_measured_job`), its ranks sized by
    :func:`estimate_bytes`."""
    check_measured_job(cfg, "parallel.world_size", cfg.parallel.world_size, estimate_bytes(cfg), where)


def too_many_ranks(ranks: int) -> str | None:
    """The bound on every rank count, measured or simulated (a config's keys, advise's --ranks): None,
    or why ``ranks`` is over it."""
    if ranks <= MAX_SIM_WORLD_SIZE:
        return None
    return f"{ranks} ranks, over the bound of {MAX_SIM_WORLD_SIZE} on any run, measured or simulated"


def check_ranks(cfg: DictConfig, key: str, ranks: int) -> None:
    """``ranks`` (set by ``key``) within :func:`too_many_ranks`'s bound, unless ``force``."""
    why = None if cfg.force else too_many_ranks(ranks)
    require(why is None, key, f"{why}; use fewer, or set force=true")


def check_measured_job(cfg: DictConfig, key: str, ranks: int, rank_bytes: dict[str, int], where: str = "") -> None:
    """A measured job of ``ranks`` ranks (set by ``key``), unless ``force``: within the rank bound
    (:func:`check_ranks`) and, on CPU ranks (all on this host), within this host's memory: each rank's
    process (RANK_PROCESS_BYTES) and ``rank_bytes`` (its bytes by the key that sizes them). On a GPU
    the device's memory bounds a rank, which the load cannot see."""
    check_ranks(cfg, key, ranks)
    if cfg.force or cfg.hardware.device != "cpu":
        return
    parts = {key: RANK_PROCESS_BYTES, **rank_bytes}
    total, host = sum(parts.values()) * ranks, host_memory_bytes()
    largest = max(parts, key=parts.get)
    require(
        total <= host,
        largest,
        f"the measured run {where or f'of {key}'} needs about {total / 2**30:.0f} GiB on this host ({ranks} "
        f"ranks; {largest} sizes most of it), over its {host / 2**30:.0f} GiB; use fewer ranks or smaller sizes, "
        "or set force=true to run it anyway",
    )


def measured_jobs(cfg: DictConfig) -> list[tuple[str, int, dict[str, int]]]:
    """Every measured job besides the training-step points (check_measured_points): the key of its
    ranks, their count, and each rank's bytes by the key that sizes them (the buffers it exchanges)."""
    c, d, a, m = cfg.collectives, cfg.dispatch_study, cfg.aurora, cfg.monta
    return [
        # input and output of two concurrent collectives
        ("collectives.world_size", c.world_size, {"collectives.max_bytes": 4 * c.max_bytes}),
        # the all-gather dispatcher's: every rank's float32 tokens, dispatched and combined
        (
            "dispatch_study.world_size",
            d.world_size,
            {"dispatch_study.tokens_per_rank": 8 * d.world_size * d.tokens_per_rank * d.d_model},
        ),
        ("aurora.world_size", a.world_size, {"aurora.bytes_per_rank": 2 * a.bytes_per_rank}),
        ("monta.world_size", m.world_size, {"monta.bytes_per_rank": 2 * m.bytes_per_rank}),
        ("axonn.world_size", cfg.axonn.world_size, {}),
        ("inference.world_size", cfg.inference.world_size, {}),
    ]


def rank_counts(cfg: DictConfig) -> list[tuple[str, int]]:
    """Every rank count a key sets besides the measured jobs' (:func:`measured_jobs`): the key and
    its ranks (a list's largest). The simulator's clusters, the run's and the measured sweep's ranks
    (measured or simulated; their memory: check_measured_points)."""
    hw, monta_node = cfg.hardware, hardware_profile(cfg.monta.hardware).devices_per_node
    largest = {
        key: max(OmegaConf.select(cfg, key), default=1)
        for key in (
            "sweep.world_size",
            "sim_sweep.world_size",
            "dispatch_study.sim_world_sizes",
            "lina.experts",  # experts = GPUs
            "lina.inference_experts",
            "gshard.collective_partitions",
        )
    }
    return [
        ("parallel.world_size", cfg.parallel.world_size),
        ("hardware.nodes", hw.nodes * hw.devices_per_node),
        *largest.items(),
        ("monta.hierarchical_nodes", max(cfg.monta.hierarchical_nodes, default=1) * monta_node),
        ("aurora.num_experts", cfg.aurora.num_experts),  # GPUs per served model
    ]


# The simulated dispatcher study's routing, per token of every simulated rank: its int64 expert id.
SIM_ROUTE_BYTES = 8


def check_sizes(cfg: DictConfig) -> None:
    """The size checks of every key that sets ranks, unless ``force``: each rank count within the bound
    (:func:`rank_counts`), each measured job within this host's memory (:func:`measured_jobs`), the
    simulated dispatcher study's routing too."""
    for key, ranks in rank_counts(cfg):
        check_ranks(cfg, key, ranks)
    for key, ranks, rank_bytes in measured_jobs(cfg):
        check_measured_job(cfg, key, ranks, rank_bytes)
    d = cfg.dispatch_study
    routes = SIM_ROUTE_BYTES * d.sim_tokens_per_rank * max(d.sim_world_sizes)
    require(
        cfg.force or routes <= host_memory_bytes(),
        "dispatch_study.sim_tokens_per_rank",
        f"the simulated study's routing takes {routes / 2**30:.0f} GiB, over this host's "
        f"{host_memory_bytes() / 2**30:.0f} GiB; use fewer tokens, or set force=true",
    )


def check_point_counts(cfg: DictConfig) -> None:
    """The measured and simulated points stay within their bounds (a typo in a sweep's axes), unless
    ``force``."""
    if cfg.force:
        return
    measured = len(sweep_points(cfg)[0]) + sum(len(fn(cfg)) for fn in MEASURED_POINTS)
    require(
        measured <= MAX_MEASURED_POINTS,
        "sweep",
        f"{measured} measured points, over the bound of {MAX_MEASURED_POINTS}; shorten the axes, or set force=true",
    )
    simulated = len(sim_points(cfg))
    require(
        simulated <= MAX_SIM_POINTS,
        "sim_sweep",
        f"{simulated} simulated points, over the bound of {MAX_SIM_POINTS}; shorten the axes, or set force=true",
    )


def check_ignored(cfg: DictConfig) -> None:
    """Settings no point of the run would use are errors, not silently dropped."""
    tensor_parallel = max(cfg.parallel.tensor_parallel, *cfg.sweep.tensor_parallel)
    require(
        cfg.comm.tp_chunks == 0 or tensor_parallel > 1,
        "comm.tp_chunks",
        f"chunks the tensor-parallel dispatch, but neither parallel.tensor_parallel nor sweep.tensor_parallel "
        f"is above 1; set it to 0 or use tensor parallelism (got {cfg.comm.tp_chunks})",
    )
