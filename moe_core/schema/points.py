"""Sweep points: which training-step points a run measures and simulates, and how each is named.

A point is a dict of swept values (``world_size``, ``num_experts``, ``experts_per_rank``,
``policy``, ``seed``, optionally ``partition_mb``, ``paper``, ``tensor_parallel`` and the token
dispatcher ``dispatcher`` with its chunk count ``tp_chunks``). The measured
sweep is the config's ``sweep`` section; the simulated one its ``sim_sweep`` section. Papers add points of their own
(e.g. Lina's policies at every expert count) with :func:`register_measured_points` and
:func:`register_sim_points`, so the workflow and the simulator's ``--sweep`` mode see every point
without naming a paper.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from moe_core.dispatch import AUTO, configured_name, exchange_chunks, routes_dropless, suits
from moe_core.model.capacity import moe_blocks
from moe_core.parallel.grid import GRID_AXES
from moe_core.parallel.layout import layout_error, layout_of
from moe_core.schedule.policies import policy_spec

# cfg -> extra measured points (each with its "paper"), cfg -> {name: (paper, overrides)}
MEASURED_POINTS: list[Callable[[DictConfig], list[dict[str, Any]]]] = []
SIM_POINTS: list[Callable[[DictConfig], dict[str, tuple[str, list[str]]]]] = []
# The sections' list-valued override keys (a paper's model, ...): key -> cfg -> the complete overrides
# of each use of the list (with it, e.g. its hardware profile). moe_core.schema.run_checks checks every
# entry, and each use, when the run's config is loaded.
OVERRIDE_LISTS: dict[str, Callable[[DictConfig], list[list[str]]]] = {}
# Checks of what a paper derives from the run's config (its points' configs), run at load.
RUN_CHECKS: list[Callable[[DictConfig], None]] = []
# The base keys every point sets besides its swept values: a point is a layout of expert, tensor and
# data parallelism, never the run's 3D grid (parallel.grid, which a run of the base config or AxoNN's
# own grid sweep uses), so a grid valid for the run cannot break a sweep's points.
NO_GRID = {"grid_depth": 1, "grid_row": 1, "grid_col": 1}


def register_measured_points(fn: Callable[[DictConfig], list[dict[str, Any]]]) -> Callable:
    MEASURED_POINTS.append(fn)
    return fn


def register_sim_points(fn: Callable[[DictConfig], dict[str, tuple[str, list[str]]]]) -> Callable:
    SIM_POINTS.append(fn)
    return fn


def register_override_list(key: str, contexts: Callable[[DictConfig], list[list[str]]]) -> None:
    OVERRIDE_LISTS[key] = contexts


def register_run_check(fn: Callable[[DictConfig], None]) -> Callable:
    RUN_CHECKS.append(fn)
    return fn


def sweep_points(cfg: DictConfig) -> tuple[list[dict[str, Any]], list[str]]:
    """Expand the measured sweep into points and the reasons points were skipped (impossible
    layouts). ``experts_per_rank`` left empty means num_experts / (world_size / tensor_parallel), at
    least 1: every expert-parallel rank holds experts."""
    s = cfg.sweep
    points, skipped = [], []
    for ws, ne, pol, seed, tp in itertools.product(s.world_size, s.num_experts, s.policy, s.seed, s.tensor_parallel):
        eprs = list(s.experts_per_rank) or [max(1, ne // (ws // tp) if ws >= tp else 1)]
        for epr in eprs:
            why = layout_error(ws, ne, epr, tp)
            point = dict(world_size=ws, num_experts=ne, experts_per_rank=epr, policy=pol, seed=seed)
            point.update(tensor_parallel=tp, dispatcher=sweep_dispatcher(cfg, tp), tp_chunks=cfg.comm.tp_chunks)
            (skipped.append(f"{point}: {why}") if why else points.append(point))
    return points, skipped


def sweep_dispatcher(cfg: DictConfig, tensor_parallel: int) -> str:
    """The base config's dispatcher at a sweep point of ``tensor_parallel`` ranks per "tp" group (and
    in its name): where it is for the other kind of layout (tokens shared over "tp" or not), the
    point's default."""
    return cfg.moe.dispatcher if suits(cfg.moe.dispatcher, tensor_parallel > 1) else AUTO


def measured_points(cfg: DictConfig) -> dict[str, dict[str, Any]]:
    """Every measured training-step point of a run, by name: the sweep's (paper of the config),
    then the papers' (:func:`register_measured_points`). Impossible sweep layouts are left out."""
    points, _ = sweep_points(cfg)
    extra = [p for fn in MEASURED_POINTS for p in fn(cfg)]
    return {point_name(p): {"paper": cfg.paper, **p} for p in [*points, *extra]}


def sim_point_name(hardware: str, params: dict[str, Any]) -> str:
    """A simulated point's name: its hardware profile, then the measured points' name of its params."""
    return f"{hardware}_{point_name(params)}"


def sim_point(
    cfg: DictConfig,
    hardware: str,
    paper: str,
    world_size: int,
    experts_per_rank: int,
    policy: str,
    model: list[str],
    partition_mb: float,
) -> tuple[str, tuple[str, list[str]]]:
    """One simulated point, experts = world size x experts_per_rank: (name, (paper, its complete overrides))."""
    params = dict(
        world_size=world_size,
        num_experts=world_size * experts_per_rank,
        experts_per_rank=experts_per_rank,
        policy=policy,
        seed=cfg.train.seed,
        partition_mb=partition_mb,
        tensor_parallel=1,  # experts = GPUs: no tensor parallelism, whatever the base config's
    )
    overrides = [
        *model,
        f"hardware_profile={hardware}",
        f"paper={paper}",
        f"comm.partition_mb={partition_mb:g}",
        *point_overrides({k: v for k, v in params.items() if k != "partition_mb"}),
    ]
    return sim_point_name(hardware, params), (paper, overrides)


@register_sim_points
def paper_scale_points(cfg: DictConfig) -> dict[str, tuple[str, list[str]]]:
    """The ``sim_sweep`` section: hardware x world size x policy."""
    s = cfg.sim_sweep
    return dict(
        sim_point(cfg, hw, s.paper, ws, s.experts_per_rank, policy, list(s.overrides), cfg.comm.partition_mb)
        for hw, ws, policy in itertools.product(s.hardware, s.world_size, s.policy)
    )


def paper_scale_models(cfg: DictConfig) -> list[list[str]]:
    """Each use of ``sim_sweep.overrides``: the simulated model on each profile of the sweep."""
    return [[*cfg.sim_sweep.overrides, f"hardware_profile={hw}"] for hw in cfg.sim_sweep.hardware]


register_override_list("sim_sweep.overrides", paper_scale_models)


def sim_points(cfg: DictConfig) -> dict[str, tuple[str, list[str]]]:
    """Every simulated training-step point of a run: name -> (paper, its complete overrides). A point
    two sweeps name is simulated once."""
    points: dict[str, tuple[str, list[str]]] = {}
    for fn in SIM_POINTS:
        points.update(fn(cfg))
    return points


def own_layout() -> list[str]:
    """The overrides a paper's derived config starts with: neither the run's 3D grid nor its tensor
    parallelism (valid for the run, not for the paper's own layout, which its overrides state after)."""
    return [*point_overrides({}), "parallel.tensor_parallel=1"]


def point_overrides(point: dict[str, Any]) -> list[str]:
    """The ``key=value`` overrides that turn the base config into one sweep point (no 3D grid: NO_GRID)."""
    keys = {
        "world_size": "parallel.world_size",
        "num_experts": "moe.num_experts",
        "experts_per_rank": "moe.experts_per_rank",
        "policy": "comm.policy",
        "seed": "train.seed",
        "partition_mb": "comm.partition_mb",
        "paper": "paper",
        "tensor_parallel": "parallel.tensor_parallel",
        "dispatcher": "moe.dispatcher",
        "tp_chunks": "comm.tp_chunks",
        "grid_depth": "parallel.grid.depth",
        "grid_row": "parallel.grid.row",
        "grid_col": "parallel.grid.col",
    }
    return [f"{keys[k]}={v}" for k, v in {**point, **NO_GRID}.items()]


def unstated_param(cfg: DictConfig) -> dict[str, str]:
    """A sensitivity run's record param (``{"unstated": "key=value"}``), none for a chosen-value run."""
    return {"unstated": cfg.unstated} if cfg.unstated else {}


# A count with at most this many whole values is simulated at each of them (Unstated.alone).
WHOLE_LEVELS = 4


@dataclass(frozen=True)
class Unstated:
    """A parameter a paper leaves unstated: its config key, the value the suite chose (the verdict's)
    and the ends of its plausible range. Where one is declared, the evidence for all three is written
    beside it; the chosen value must be the one the run's config or profile holds (tests check).
    ``implies``: value -> the other overrides that value stands for (an NVLink-class link rate is also
    an NVSwitch-class node, not a PCIe tree). ``evidence``: the reasoning for the chosen value and the
    ends in one line, for the fit table (the full argument stays beside the declaration)."""

    key: str
    chosen: float
    low: float
    high: float
    implies: dict[float, tuple[str, ...]] = field(default_factory=dict)
    evidence: str = ""

    def __post_init__(self):
        if not self.low <= self.chosen <= self.high or self.low == self.high:
            raise ValueError(f"unstated {self.key}: need low <= chosen <= high, low < high; got {self}")

    @property
    def integer(self) -> bool:
        """A count (declared with whole numbers: a batch of sequences, NICs a node), which a run sets
        to a whole value."""
        return all(isinstance(v, int) for v in (self.chosen, self.low, self.high))

    @property
    def ends(self) -> tuple[float, ...]:
        """The ends of the range other than the chosen value."""
        return tuple(v for v in (self.low, self.high) if v != self.chosen)

    @property
    def alone(self) -> tuple[float, ...]:
        """The values a sensitivity run sets this parameter to alone: the ends of its range and, for a
        count of at most WHOLE_LEVELS whole values, every one of them (a number that moves in whole
        steps, as GShard's step does with whole groups of tokens, is then simulated at each step rather
        than interpolated between the ends)."""
        if self.integer and self.high - self.low < WHOLE_LEVELS:
            return tuple(v for v in range(self.low, self.high + 1) if v != self.chosen)
        return self.ends


# paper -> config key -> its unstated parameter, for the analysis (register_unstated)
UNSTATED_PARAMS: dict[str, dict[str, Unstated]] = {}


def register_unstated(paper: str, *params: Unstated) -> tuple[Unstated, ...]:
    """Declare ``params`` as unstated by ``paper`` (analysis.compare reads their chosen values and
    ranges); returns them, for the paper's sweeps."""
    known = UNSTATED_PARAMS.setdefault(paper, {})
    for param in params:
        if known.get(param.key, param) != param:
            raise ValueError(f"{paper}: unstated {param.key} declared twice, as {known[param.key]} and {param}")
        known[param.key] = param
    return params


def setting_text(settings: dict[str, float]) -> str:
    """A sensitivity run's setting as recorded (config key ``unstated``): ``key=value`` pairs joined by ","."""
    return ",".join(f"{key}={value:g}" for key, value in settings.items())


def setting_overrides(settings: dict[str, float], params: Sequence[Unstated] = ()) -> list[str]:
    """The overrides that run a config at ``settings``: each parameter's value, those a value of one of
    ``params`` implies (Unstated.implies), then ``unstated`` recording the setting (which every record
    of the run carries: :func:`unstated_param`)."""
    implied = {p.key: p.implies for p in params}
    return [
        *(f"{key}={value:g}" for key, value in settings.items()),
        *(o for key, value in settings.items() for o in implied.get(key, {}).get(value, ())),
        f"unstated={setting_text(settings)}",
    ]


def chosen_setting(paper: str) -> dict[str, float]:
    """``paper``'s unstated parameters at their chosen values."""
    return {p.key: p.chosen for p in UNSTATED_PARAMS[paper].values()}


def parse_setting(text: str) -> dict[str, float]:
    """The inverse of :func:`setting_text`."""
    return {key: float(value) for key, value in (pair.split("=", 1) for pair in text.split(","))}


def sensitivity_settings(params: Sequence[Unstated]) -> list[dict[str, float]]:
    """The joint design over ``params``, the settings a run is repeated at besides the chosen one:

    * one at a time: each parameter alone at each end of its range (a small count at each of its whole
      values: Unstated.alone), the others at their chosen values (which parameter moves a number, and
      what value of it the published number would need);
    * every corner of the range box (each parameter at its low or high end) where two or more differ
      from their chosen values: the joint extremes, 2^k corners for k parameters at most.

    A reproduced number's range is taken over all of them and the chosen run.
    """
    settings = [{p.key: value} for p in params for value in p.alone]
    for corner in itertools.product(*[(p.low, p.high) for p in params]):
        moved = {p.key: v for p, v in zip(params, corner) if v != p.chosen}
        if len(moved) >= 2:
            settings.append(dict(zip((p.key for p in params), corner)))
    return settings


def unstated_variants(
    cfg: DictConfig, name: str, overrides: list[str], params: Sequence[Unstated]
) -> dict[str, list[str]]:
    """Sensitivity runs of one run of ``cfg`` (:func:`sensitivity_settings`): the run's name with the
    setting appended and its overrides with the parameters set and the setting recorded (config key
    ``unstated``). None when ``cfg`` is itself at a setting (a sensitivity run, or the run at a
    paper's fitted testbed): such a run is simulated at that setting alone."""
    if cfg.unstated:
        return {}
    variants = {}
    for setting in sensitivity_settings(params):
        suffix = "_".join(f"{key.rsplit('.', 1)[-1]}{value:g}" for key, value in setting.items())
        variants[f"{name}_{suffix}"] = [*overrides, *setting_overrides(setting, params)]
    return variants


def point_params(cfg: DictConfig) -> dict[str, Any]:
    """The parameters a training-step record carries (measured and simulated alike)."""
    layout = layout_of(cfg)
    return {
        **unstated_param(cfg),
        "world_size": layout.world_size,
        "num_experts": layout.num_experts,
        "experts_per_rank": layout.experts_per_rank,
        "policy": cfg.comm.policy,
        "seed": cfg.train.seed,
        "expert_parallel": layout.expert_parallel,
        "data_parallel": layout.data_parallel,
        "top_k": cfg.moe.top_k,
        "capacity_factor": cfg.moe.capacity_factor,
        "dispatcher": configured_name(cfg),
        "dropless": routes_dropless(cfg),
        "permute": cfg.moe.permute,
        "tokens_per_rank": cfg.train.batch_size * cfg.model.seq_len,
        "moe_layers": len(moe_blocks(cfg.model.n_layers, cfg.model.moe_every)),
        "dtype": cfg.train.dtype,
        "partition_mb": cfg.comm.partition_mb,
        "tensor_parallel": layout.tensor_parallel,
        "tp_chunks": cfg.comm.tp_chunks,
        # the chunks the dispatcher decided (None: duplicates sent), for the analysis
        "tp_exchange_chunks": exchange_chunks(cfg),
        # the 3D grid (data x depth x row x col; all data without one) and its overlaps
        **{f"grid_{axis}": size for axis, size in zip(GRID_AXES, layout.grid.shape)},
        **{f"grid_overlap_{key}": value for key, value in cfg.comm.grid_overlap.items()},
    }


# What every point name (a record's file name without .json) looks like: a plain word of letters,
# digits and ``_ . - + = ,``, never a path (no separator, no leading dot). The workflow's wildcards
# accept only such names, so no requested target resolves outside results_dir.
POINT_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.+=,-]*"


def point_name(point: dict[str, Any]) -> str:
    """File name of a sweep point: ``ws4_e8_epr2_sequential_s0`` (``_part30`` added for policies whose
    results depend on the micro-op size, ``_tp2-drop-gather`` under tensor parallelism (``-n4`` with a
    set chunk count), the dispatcher's name otherwise unless it is the default capacity all-to-all:
    ``_hier`` for the hierarchical one, ``_dropless``, ``_<name>`` for any other)."""
    name = (
        f"ws{point['world_size']}_e{point['num_experts']}_epr{point['experts_per_rank']}"
        f"_{point['policy']}_s{point['seed']}"
    )
    if policy_spec(point["policy"]).micro_op_size_in_name and "partition_mb" in point:
        name += f"_part{point['partition_mb']:g}"
    dispatcher = point.get("dispatcher", AUTO)
    if point.get("tensor_parallel", 1) > 1:
        name += f"_tp{point['tensor_parallel']}-{'drop-gather' if dispatcher == AUTO else dispatcher}"
        return name + (f"-n{point['tp_chunks']}" if point.get("tp_chunks") else "")
    if dispatcher in (AUTO, "capacity"):
        return name
    return f"{name}_{SHORT_NAMES.get(dispatcher, dispatcher)}"


# dispatchers whose point names carry a short form of their name
SHORT_NAMES = {"hierarchical": "hier"}


def replayed_config(record: dict[str, Any]) -> dict[str, Any]:
    """A measured record's resolved config with the decisions it took on its own hardware pinned, so
    a simulation of it (calibration, validation) runs the same plan on another profile: the
    tensor-parallel dispatch's chunk count (``comm.tp_chunks``)."""
    config = copy.deepcopy(record["config"])
    chunks = record["params"].get("tp_exchange_chunks")
    if chunks:
        config["comm"]["tp_chunks"] = chunks
    return config
