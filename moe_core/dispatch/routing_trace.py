"""Recorded routing: the top-k choices of the suite's own trained gate, saved as a trace and replayed.

Synthetic skews (moe_core.dispatch.workloads) say how routing might look; a trace says how a trained
router routed. :func:`record` trains the suite's MoE model on its Markov data (whose token popularity
is Zipf-skewed as text is) and keeps every MoE layer's choices for one unseen batch
(moe_core.comm.workloads.gated_choices); :func:`save` writes them as one small ``.npz``: ``choices``
(layers, tokens, top_k) expert ids, best first, and ``meta`` (JSON: experts, top_k, the model and how
it was trained). The workload ``trace:<name>`` replays ``TRACES_DIR/<name>.npz`` (:func:`replay`).

Replay, for ``ranks`` ranks of ``tokens_per_rank`` tokens each at ``step``:

* step s replays layer ``s mod layers`` (the trace's period is its layer count: a dispatcher sees
  every layer's routing in turn, as a step's layers do);
* rank r takes the trace's tokens from ``r * tokens_per_rank`` on, wrapping around when the run
  asks for more tokens than the trace holds (a replay larger than its trace repeats it);
* a run with fewer experts than the trace merges consecutive experts (expert e of the trace becomes
  ``e // (trace experts / experts)``), which keeps every rank's load when experts sit on ranks
  contiguously; two choices of one token that merge count as two assignments of it. A run with
  more experts than the trace, or with experts that do not divide the trace's, is refused;
* ``top_k`` keeps the gate's best ``top_k`` choices (at most the trace's).

The Gini coefficient of the per-expert load (:func:`gini`) is DODOCO's (arXiv 2605.20982) measure
of routing skew; the study records it beside the imbalance factor.
"""

from __future__ import annotations

import functools
import json
import re
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SAFE_TRACE_NAME = re.compile(r"[A-Za-z0-9_-]+")  # a trace's name becomes part of point names
# The committed traces (results/reference/routing_traces/README.md says how each was recorded).
TRACES_DIR = Path(__file__).resolve().parents[2] / "results" / "reference" / "routing_traces"


@dataclass(frozen=True)
class RoutingTrace:
    """One recorded routing: ``choices`` (layers, tokens, top_k) expert ids, best first, among
    ``experts``; ``meta`` says what model made it and how."""

    choices: np.ndarray
    experts: int
    meta: dict

    @property
    def layers(self) -> int:
        return self.choices.shape[0]

    @property
    def top_k(self) -> int:
        return self.choices.shape[2]


def record(cfg, train_steps: int, trace_batch_size: int, mock_tokens: bool = False) -> RoutingTrace:
    """The routing of ``cfg``'s model after ``train_steps`` training steps, on one unseen batch of
    ``trace_batch_size`` sequences (of uniformly random token ids with ``mock_tokens``)."""
    from moe_core.comm.workloads import gated_choices
    from moe_core.dispatch import routes_dropless

    choices, _ = gated_choices(cfg, train_steps, trace_batch_size, mock_tokens, dropless=routes_dropless(cfg))
    meta = {
        "experts": cfg.moe.num_experts,
        "top_k": cfg.moe.top_k,
        "train_steps": train_steps,
        "trace_batch_size": trace_batch_size,
        "mock_tokens": mock_tokens,
        "seed": cfg.train.seed,
        "model": {k: cfg.model[k] for k in ("d_model", "d_ff", "n_layers", "n_heads", "seq_len", "vocab_size")},
        "data": {"branching": cfg.train.data_branching, "zipf": cfg.train.data_zipf},
    }
    return RoutingTrace(choices, cfg.moe.num_experts, meta)


def save(trace: RoutingTrace, path: Path) -> None:
    """Write ``trace`` to ``path`` (.npz), whole or not at all."""
    from moe_core.records.results import atomic_output

    with atomic_output(path) as tmp, open(tmp, "wb") as f:
        np.savez_compressed(f, choices=trace.choices.astype(np.int16), meta=json.dumps(trace.meta))


def read(path: Path) -> RoutingTrace:
    """The trace saved at ``path``; ValueError naming the file, the field that is wrong and how to fix
    it (a damaged file, a missing field, choices or meta that disagree)."""
    advice = "record it again with experiments/record_routing.py"
    try:
        with np.load(path) as data:
            choices, meta = data["choices"], json.loads(str(data["meta"]))
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile, zlib.error) as err:
        raise ValueError(f"routing trace {path}: cannot read it ({type(err).__name__}: {err}); {advice}") from None
    why = trace_error(choices, meta)
    if why:
        raise ValueError(f"routing trace {path}: {why}; {advice}")
    return RoutingTrace(choices.astype(np.int64), meta["experts"], meta)


def trace_error(choices: np.ndarray, meta) -> str | None:
    """Why ``choices`` and ``meta`` (a saved trace's fields) are not a trace (None: they are): meta
    a JSON object whose ``experts`` is a count; choices (layers, tokens, top_k) integer ids, each
    token's distinct, every one of meta.experts experts chosen somewhere (a meta.experts that
    disagrees with the choices would merge them wrongly on replay), meta.top_k the choices' last axis."""
    if not isinstance(meta, dict) or type(meta.get("experts")) is not int or meta["experts"] < 1:
        return "field meta: must be a JSON object whose 'experts' is an integer >= 1"
    experts = meta["experts"]
    if choices.ndim != 3 or 0 in choices.shape or choices.dtype.kind not in "iu":
        return f"field choices: must be non-empty (layers, tokens, top_k) integers, got {choices.dtype} {choices.shape}"
    if not 0 <= choices.min() <= choices.max() < experts:
        return f"field choices: must be (layers, tokens, top_k) ids below meta.experts={experts}"
    if "top_k" in meta and meta["top_k"] != choices.shape[2]:
        return f"field meta.top_k: {meta['top_k']!r} disagrees with the choices' {choices.shape[2]} per token"
    ordered = np.sort(choices, axis=2)
    if (ordered[..., 1:] == ordered[..., :-1]).any():
        return "field choices: a token names one expert twice among its top_k"
    chosen = np.unique(choices).size
    if chosen != experts:
        return f"field meta.experts: {experts} experts, but the choices name {chosen} distinct ones"
    return None


@functools.cache
def load(name: str) -> RoutingTrace:
    """The committed trace ``name`` (``TRACES_DIR/<name>.npz``); ValueError listing those there are."""
    if not SAFE_TRACE_NAME.fullmatch(name):
        raise ValueError(f"routing trace name {name!r}: use letters, digits, '-' and '_'")
    path = TRACES_DIR / f"{name}.npz"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in TRACES_DIR.glob("*.npz"))) or "none"
        raise ValueError(f"no routing trace {name!r} in {TRACES_DIR.name}/ (there: {known})")
    return read(path)


def replay(trace: RoutingTrace, *, step: int, tokens_per_rank: list[int], experts: int, top_k: int) -> list[np.ndarray]:
    """Per source rank, (its tokens, ``top_k``) int64 expert ids among ``experts``: ``trace``'s layer
    ``step mod layers``, the ranks' tokens consecutive from the trace's first, merged and cut as the
    module docstring says."""
    misfit = why_not_replayed(trace, experts, top_k)
    if misfit:
        raise ValueError(misfit)
    layer = trace.choices[step % trace.layers, :, :top_k] // (trace.experts // experts)  # (tokens, top_k)
    starts = np.cumsum([0, *tokens_per_rank[:-1]])
    total = layer.shape[0]
    return [layer[(start + np.arange(n)) % total] for start, n in zip(starts, tokens_per_rank)]


def why_not_replayed(trace: RoutingTrace, experts: int, top_k: int) -> str | None:
    """Why ``trace`` cannot be replayed with ``experts`` experts and ``top_k`` (None: it can)."""
    if experts < 1 or trace.experts % experts:
        return f"a trace of {trace.experts} experts replays on a divisor of {trace.experts} experts, not {experts}"
    if not 1 <= top_k <= trace.top_k:
        return f"the trace holds its gate's top {trace.top_k} choices; top_k={top_k} asks for more"
    return None


def gini(loads: np.ndarray) -> float:
    """The Gini coefficient of per-expert loads: 0 when every expert gets the same, towards 1 when one
    gets all (mean absolute difference over twice the mean); 0 when nothing is routed."""
    loads = np.sort(np.asarray(loads, dtype=float).ravel())
    n, total = loads.size, loads.sum()
    if n == 0 or total == 0:
        return 0.0
    return float((2 * np.arange(1, n + 1) - n - 1) @ loads / (n * total))
