"""Calibrate a hardware profile on measured records: the simulator's own model, fitted by least squares.

* Network: from collectives measured alone (:func:`alone_times`), fit one bandwidth per link
  class (intra-node; NIC when the profile has several nodes; the host's copy throughput on CPU
  testbeds) and, per collective, a per-step
  latency and a bandwidth efficiency, minimising the log-ratio of simulated to measured mean
  times (:func:`moe_core.sim.collectives.simulate_collective` is the model, so what is fitted is
  exactly what predicts).
* Compute: from measured training steps, a multiplier per op class (dense, gate, expert) on the
  speed of the profile's compute model (moe_core.sim.compute, whose parameters an op sweep fits,
  experiments/op_sweep.py): the model's time of that class over its measured phase time, written as
  ``phase_efficiency``. The streaming ops between the layers (copies, the optimizer) keep the op
  sweep's price.
* In-step wait: what the measured steps' all-to-alls take beyond the fitted model, per call (peers
  arriving late), as ``collectives.all_to_all.in_step_us``.
* Time slicing (CPU testbeds): what ranks that outnumber the host's cores wait at a barrier beyond
  their share of the cores, measured on the host (moe_core.host.time_slicing), as
  ``host_wake_ms`` and ``host_slice_ms`` (:func:`fit_time_slicing`, moe_core.sim.time_slicing).

Which measured points are used is the caller's choice; the rest validate (experiments/validate.py).

Measured times enter as the mean of their per-iteration samples (:data:`STATISTIC`), in calibration
and validation alike. The simulator predicts expected times: its terms add (latency, bytes over
bandwidth, work-conserving sharing), as means do. On a CPU testbed latency-bound samples are
bimodal (most iterations fast, the rest a scheduler slice later), and which mode holds the median
depends on how often the slice is paid: alone a 1 KiB all-to-all's median sits in the fast mode,
next to an all-reduce in the slow one, a 3.9x ratio the mean (1.8x) does not show.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf
from scipy.optimize import curve_fit, least_squares

from moe_core.schema.build import build_config
from moe_core.schema.validation import COMPUTE_PHASES
from moe_core.sim.collectives import EXCHANGES, RING_COLLECTIVES, simulate_collective
from moe_core.sim.kernels import calibration_class
from moe_core.sim.step import StepModel
from moe_core.sim.topology import build_topology

COLLECTIVES = (*RING_COLLECTIVES, *EXCHANGES)  # all-reduce first: the reference of fit_network
STATISTIC = "mean"  # of a metric's per-iteration samples: what calibration fits and validation compares
MAX_EVALUATIONS = 60  # least-squares iterations (each also costs a finite-difference Jacobian)
# The measured phase that holds the streaming ops (copies, optimizer: moe_core.sim.kernels), which the op
# sweep's model prices with no multiplier: moe_core.records.step_metrics counts them in dense_ms.
STREAMING_IN = "dense"


def _with(hw: DictConfig, **changes) -> DictConfig:
    return OmegaConf.merge(hw, changes)


def fit_network(hw: DictConfig, alone: pd.DataFrame, seed: int = 0) -> tuple[DictConfig, dict]:
    """Fit link bandwidths and per-collective terms to ``alone``: rows with collective, world_size,
    size_bytes, traffic_zipf and the ``measured`` time_ms (:data:`STATISTIC`). Returns the fitted
    profile and the fit's statistics.

    A collective's efficiency caps its rate (Transfer.efficiency), so alone it takes bytes /
    (bandwidth x efficiency): alone times cannot tell a fast link used at half its rate from a slow
    one used fully, though a concurrent collective can use the unused half of the first only. The
    reference collective (all-reduce when measured, nccl-tests' bus bandwidth convention) therefore
    has efficiency 1: link bandwidths are what it reaches, other efficiencies relative to it."""
    kinds = [c for c in COLLECTIVES if not alone.empty and (alone["collective"] == c).any()]
    if not kinds:
        raise ValueError("no collective measured alone to calibrate on; run experiments/collectives.py first")
    links = ["intra_node_GBps"] + ["nic_GBps"] * (hw.nodes > 1) + ["host_GBps"] * bool(hw.host_cores)
    points = alone.to_dict("records")
    measured = np.array([p["measured"] for p in points])

    def profile(theta: np.ndarray) -> DictConfig:
        bw = 10 ** theta[: len(links)]
        alphas = theta[len(links) : len(links) + len(kinds)]
        efficiencies = [1.0, *theta[len(links) + len(kinds) :]]  # the reference collective's is 1
        fits = {
            k: {"alpha_us": 0.0, "alpha_step_us": float(a), "efficiency": float(e)}
            for k, a, e in zip(kinds, alphas, efficiencies)
        }
        return _with(hw, collectives=fits, **{link: float(b) for link, b in zip(links, bw)})

    def residuals(theta: np.ndarray) -> np.ndarray:
        fitted = profile(theta)
        topo = build_topology(fitted)
        predicted = np.array([simulate_collective(fitted, topo, {**p, "seed": seed}) for p in points])
        return np.log(predicted / measured)

    # Start: the best achieved bandwidth of the largest messages, 100 us per step, full efficiency.
    biggest = alone[alone["size_bytes"] == alone["size_bytes"].max()]
    guess_GBps = float((biggest["size_bytes"] / (biggest["measured"] * 1e-3) / 1e9).max())
    theta0 = np.array([np.log10(guess_GBps)] * len(links) + [100.0] * len(kinds) + [1.0] * (len(kinds) - 1))
    lower = [-4.0] * len(links) + [0.0] * len(kinds) + [0.01] * (len(kinds) - 1)
    upper = [5.0] * len(links) + [1e6] * len(kinds) + [1.0] * (len(kinds) - 1)
    # Bounded effort: noisy CPU measurements can leave the problem flat; the fit reports whether it
    # converged, and its errors say how good it is either way.
    result = least_squares(residuals, theta0, bounds=(lower, upper), x_scale="jac", max_nfev=MAX_EVALUATIONS)
    errors = np.abs(np.exp(result.fun) - 1)
    stats = {
        "points": len(points),
        "median_abs_rel_error": float(np.median(errors)),
        "max_abs_rel_error": float(errors.max()),
        "converged": bool(result.status > 0),
        "evaluations": int(result.nfev),
    }
    return profile(result.x), stats


def fit_compute(hw: DictConfig, train: list[tuple[dict, dict]]) -> tuple[DictConfig, dict]:
    """A multiplier per op class (dense, gate, expert) on the compute model's speed, from measured
    training steps.

    ``train`` holds (resolved config, measured metrics) pairs (:func:`measured`). With every
    multiplier 1 the step model predicts each class's compute time (its ops' times,
    :func:`moe_core.sim.kernels.calibration_class`); its ratio to the measured phase time
    (``dense_ms``, ``gate_ms``, ``expert_ms``; ``dense_ms`` less the copies and the optimizer, which
    the op sweep's model prices alone), the median over steps, is the class's
    ``phase_efficiency``: > 1 where the model is too slow, < 1 where too fast. A profile without a
    peak (a testbed no op sweep has measured) gets a nominal 1 TFLOP/s GEMM-only model, so its
    multipliers are the classes' achieved TFLOP/s.
    """
    if not train:
        raise ValueError("no measured training step to calibrate compute on; run experiments/train_step.py first")
    nominal = {} if hw.peak_tflops > 0 else {"peak_tflops": 1.0, "compute_efficiency": 1.0}
    model = _with(hw, phase_efficiency={phase: 1.0 for phase in COMPUTE_PHASES}, **nominal)
    ratios: dict[str, list[float]] = {phase: [] for phase in COMPUTE_PHASES}
    for config, metrics in train:
        cfg = OmegaConf.merge(build_config(data=config, whole_run=False), {"hardware": model})
        ops, _ = StepModel(cfg, build_topology(model)).build()
        compute = [op for op in ops if op.transfer is None]
        streaming_s = sum(op.duration_s for op in compute if calibration_class(op.phase) is None)
        for phase in COMPUTE_PHASES:
            predicted_s = sum(op.duration_s for op in compute if calibration_class(op.phase) == phase)
            measured_s = metrics[f"{phase}_ms"] * 1e-3 - (streaming_s if phase == STREAMING_IN else 0.0)
            if measured_s <= 0:
                raise ValueError(
                    f"a measured step's {phase}_ms ({metrics[f'{phase}_ms']:.3g}) is not longer than the "
                    f"copies and optimizer the op sweep's model prices in it ({streaming_s * 1e3:.3g} ms): "
                    "rerun experiments/op_sweep.py on this host and put its fit in the hardware profile"
                )
            ratios[phase].append(predicted_s / measured_s)
    multiplier = {phase: float(np.median(r)) for phase, r in ratios.items()}
    return _with(model, phase_efficiency=multiplier), {
        "points": len(train),
        "multiplier_median": multiplier,
        "multiplier_spread": {phase: float(max(r) / min(r)) for phase, r in ratios.items()},
    }


def fit_in_step_wait(hw: DictConfig, train: list[tuple[dict, dict]]) -> tuple[DictConfig, dict]:
    """Extra time per all-to-all inside a training step (``collectives.all_to_all.in_step_us``).

    With network and compute fitted, the step model predicts each step's all-to-all time; what the
    measured steps spend beyond it, per all-to-all call, is the wait for late peers (median over
    ``train``, never negative).
    """
    fit = hw.collectives.get("all_to_all")
    if fit is None or not train:
        return hw, {"points": 0}
    excess_us = []
    for config, metrics in train:
        cfg = OmegaConf.merge(build_config(data=config, whole_run=False), {"hardware": hw})
        sim = StepModel(cfg, build_topology(hw)).run()
        calls = sum(op.phase.endswith("a2a") and op.transfer is not None for op in sim.ops)
        if calls:
            excess_us.append((metrics["a2a_ms"] - sim.metrics()["a2a_ms"]) * 1e3 / calls)
    if not excess_us:  # expert parallel size 1 everywhere: no exchange to learn from
        return hw, {"points": 0}
    wait_us = max(0.0, float(np.median(excess_us)))
    return _with(hw, collectives={"all_to_all": {"in_step_us": wait_us}}), {
        "points": len(excess_us),
        "in_step_us": wait_us,
    }


def fit_time_slicing(hw: DictConfig, samples: pd.DataFrame) -> tuple[DictConfig, dict]:
    """``host_wake_ms`` and ``host_slice_ms`` from ``samples`` (moe_core.host.time_slicing.measure:
    ``compute_ms``, each rank's compute between barriers on a core of its own, and ``wait_ms``, what
    an iteration took beyond the ranks' share of the cores): the least-squares fit of
    moe_core.sim.time_slicing's ``wake + slice * (1 - exp(-c / slice))``."""
    c, wait = samples["compute_ms"].to_numpy(), samples["wait_ms"].to_numpy()

    def model(c, wake, slice_ms):
        return wake + slice_ms * -np.expm1(-c / slice_ms)

    (wake, slice_ms), _ = curve_fit(model, c, wait, p0=(0.1, float(c.max())), bounds=([0.0, 1e-3], [np.inf, 1e3]))
    errors = np.abs(model(c, wake, slice_ms) - wait)
    return _with(hw, host_wake_ms=float(wake), host_slice_ms=float(slice_ms)), {
        "points": len(samples),
        "compute_ms": [round(float(x), 3) for x in c],
        "wait_ms": [round(float(x), 3) for x in wait],
        "max_abs_error_ms": float(errors.max()),
    }


def calibration_split(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """Which measured records calibrate and which validate (one rule for both entry points).

    Calibrate on collectives measured alone and on the plain training steps of the smallest world
    size (every expert count and policy); hold out the concurrent pairs (contention is predicted,
    never fitted: only their interleaved alone iterations calibrate, see :func:`alone_times`) and
    every other training step (other world sizes and layouts). Plain: every rank computes the whole
    dense model (tensor parallel 1, no 3D grid). A layout that splits it runs collectives inside its
    dense ops, which a measured step counts as dense time and the model as communication, so fitting
    compute on it would fold them into the compute multipliers. Every expert count, not the fewest
    alone: each step is one job, and on a shared CPU host one job can run 16% slower in every step
    (2026-12-06: 94 -> 109 ms median between two runs), which, fitted on that layout's two policies,
    moved every held-out prediction by as much; the median over six steps does not follow one job.
    A run that measures plain steps at one world size only (an emulated testbed of 2 x 2 ranks fits
    no other) would hold out none of them: it calibrates on the fewest experts and holds out the rest.
    """

    def layout(record: dict) -> tuple[int, int]:
        return record["params"]["world_size"], record["params"]["num_experts"]

    def plain(record: dict) -> bool:
        p = record["params"]
        return all((p.get(axis) or 1) == 1 for axis in ("tensor_parallel", "grid_depth", "grid_row", "grid_col"))

    measured = [r for r in records if r["mode"] == "measured"]
    layouts = sorted({layout(r) for r in measured if r["experiment"] == "train_step" and plain(r)})
    fitted = [each for each in layouts if each[0] == layouts[0][0]]  # the smallest world size's
    if len(fitted) == len(layouts):  # one world size: its fewest experts
        fitted = fitted[:1]
    calibrate, validate = [], []
    for r in measured:
        if r["experiment"] == "collectives":
            (validate if r["params"].get("concurrent") else calibrate).append(r)
        elif r["experiment"] == "train_step":
            (calibrate if plain(r) and layout(r) in fitted else validate).append(r)
    return calibrate, validate


def alone_times(records: list[dict], hardware: str) -> pd.DataFrame:
    """Every collective time measured on ``hardware`` with nothing running beside it: one row per
    point (its params and ``measured`` ms, :data:`STATISTIC`) from each alone record's ``time_ms``,
    and from each paired record's ``alone_ms``, the alone iterations experiments/collectives.py
    interleaves with the paired ones. Those see the host in the state the paired iterations see it
    (on a CPU testbed, latency-bound times drift by tens of percent between loops), so the
    contention the paired times add is what remains to predict; the paired times themselves stay
    held out."""
    rows = []
    for r in records:
        if r["mode"] != "measured" or r["experiment"] != "collectives" or r["hardware"] != hardware:
            continue
        metric = "alone_ms" if r["params"].get("concurrent") else "time_ms"
        rows.append({**r["params"], "concurrent": None, "measured": r["metrics"][metric][STATISTIC]})
    return pd.DataFrame(rows)


def measured(record: dict) -> dict[str, float]:
    """Each metric of ``record`` that has samples, as :data:`STATISTIC` of them."""
    return {name: stats[STATISTIC] for name, stats in record["metrics"].items() if STATISTIC in stats}
