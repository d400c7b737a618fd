"""Lina's inference-time expert placement (dynamic resource scheduling): pure decision functions.

Li et al., "Accelerating Distributed MoE Training and Inference with Lina", USENIX ATC'23, Section 5
(reference/papers.md, Lina 1.2 "Inference scheduler"). Numpy only; the measured executor
(``inference.py``) and a simulator call the same functions.

* Profiling (``profile_paths``): tokens are grouped by their expert *path*, the top-1 experts of the
  previous ``path_length`` MoE layers (default 3; 1 and 6 were studied); per path and layer the
  next-layer expert counts Psi_j are stored; ``merge_profiles`` adds up profiles of separate batches.
* Estimation (``expected_tokens``): before layer i, token t on path j(t) contributes the top-``keep``
  probabilities P_j(t)(e) of Psi_j (the paper keeps the top-k); summed over tokens this is the
  expected token count per expert, and divided by the batch's N_t the popularity of Eq. 1.
* Phase 1 (``devices_per_expert``, ``phase1_placement``): n_e = N * sum_t P_j(t)(e) / N_t (Eq. 1).
  Popular experts (n_e >= 1) are replicated, unpopular ones packed first-fit-decreasing, at most
  ``max_per_device`` (4) experts per device; experts without an estimate go to free devices.
* Token balancing (``route_rows``, ``replica_token_counts``): tokens of a replicated expert are dealt
  round-robin over its replicas in global (source rank, token) order, so replicas differ by <= 1.
* Phase 2 (``needs_replan``, ``plan_layer``): after the real gate, re-plan with the actual
  popularity when the estimated and actual top-2k expert sets differ.
* Baseline ``static_placement`` (the training layout) and the ablations of Fig 16 through
  ``plan_layer``'s arguments (no estimation: the caller passes the previous batch's popularity;
  no fine-tuning: ``finetune=False``).
* Observations the scheduler rests on, from the same profiled choices: ``popularity_ratio`` (Fig 6,
  skewed expert popularity) and ``path_topk_share`` (Fig 9, tokens of one group follow few experts).

Our reading where the paper is silent (each is one line below, marked "reading"):
* Layers before the ``path_length``-th use the path so far (layer 0: the profiled marginal); the
  paper starts scheduling at the 4th MoE layer.
* Eq. 1 is normalised by the estimated mass, so sum_e n_e = N devices-worth even though only the
  top-k probabilities of each path are kept and unseen paths contribute nothing.
* Integer replicas: every popular expert gets one device, the devices the unpopular experts do not
  fill (N - #popular - round(sum of their n_e)) go one by one to the expert with the largest load
  per replica (the greedy that minimises the largest replica load).
* An item that fits no device goes to the least-loaded device with room; an expert without an
  estimate goes to the device with the fewest experts, then the least load (the paper: evenly over
  free devices, else random).
* Estimated and actual top-2k lists are compared as sets; ties rank the lower expert id first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_EXPERTS_PER_DEVICE = 4  # Lina packs at most 4 unpopular experts on one device


@dataclass(frozen=True)
class Placement:
    """Which devices hold a copy of which expert: ``replicas[e]`` lists expert e's devices, ascending."""

    replicas: tuple[tuple[int, ...], ...]
    num_devices: int

    def __post_init__(self):
        for e, devices in enumerate(self.replicas):
            if not devices or len(set(devices)) != len(devices) or not all(0 <= d < self.num_devices for d in devices):
                raise ValueError(
                    f"Placement.replicas[{e}] must list distinct devices in [0, {self.num_devices}), got {devices}"
                )

    @property
    def num_experts(self) -> int:
        return len(self.replicas)

    def experts_on(self, device: int) -> list[int]:
        return [e for e, devices in enumerate(self.replicas) if device in devices]


@dataclass(frozen=True)
class PathProfile:
    """Next-layer expert counts per path, per MoE layer i.

    A path of layer i is the sequence of top-1 experts of layers max(0, i - path_length) .. i - 1,
    stored as one integer (``path_codes``); layer 0's path is empty, so its counts are the layer's
    marginal popularity. ``codes[i]`` (n_paths,) lists layer i's profiled paths ascending and
    ``counts[i]`` (n_paths, E) how many of their tokens picked each expert at layer i (Psi_j).
    """

    path_length: int
    num_experts: int
    codes: tuple[np.ndarray, ...]
    counts: tuple[np.ndarray, ...]

    def marginal(self, layer: int) -> np.ndarray:
        """(E,) profiled token count per expert of ``layer``, summed over paths."""
        return self.counts[layer].sum(axis=0)

    def next_counts(self, layer: int, path: tuple[int, ...]) -> np.ndarray:
        """(E,) Psi of one path (the experts of the layers just before ``layer``); zeros if never seen."""
        code = path_codes(np.asarray(path, dtype=np.int64).reshape(-1, 1), self.num_experts)[0]
        row = np.searchsorted(self.codes[layer], code)
        if row < len(self.codes[layer]) and self.codes[layer][row] == code:
            return self.counts[layer][row]
        return np.zeros(self.num_experts)


def path_codes(prior: np.ndarray, num_experts: int) -> np.ndarray:
    """(tokens,) one integer per path: the (length, tokens) experts read as digits in base E."""
    codes = np.zeros(prior.shape[1], dtype=np.int64)
    for row in prior:  # in place: a batch's paths are millions of tokens
        codes *= num_experts
        codes += row
    return codes


# Path codes below this many values are counted with a bincount (linear in tokens); sorting them, as
# np.unique does, took most of a simulated inference run at 32 sequences per GPU and more.
BINCOUNT_CODES = 1 << 22


def unique_codes(codes: np.ndarray, space: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(codes, return_inverse=True, return_counts=True)`` for integer codes in [0, space):
    the distinct codes in order, each token's index among them and each code's count."""
    if space > BINCOUNT_CODES:
        return np.unique(codes, return_inverse=True, return_counts=True)
    counts = np.bincount(codes, minlength=space)
    present = counts > 0
    index = np.cumsum(present) - 1  # code -> its rank among the codes present
    return np.flatnonzero(present), index[codes], counts[present]


def code_counts(codes: np.ndarray, space: int) -> tuple[np.ndarray, np.ndarray]:
    """``unique_codes`` without each token's index (an estimate needs only the counts): the distinct
    codes in order and each code's count."""
    if space > BINCOUNT_CODES:
        return np.unique(codes, return_counts=True)
    counts = np.bincount(codes, minlength=space)
    present = np.flatnonzero(counts)
    return present, counts[present]


def _check_choices(choices, num_experts: int, name: str) -> np.ndarray:
    choices = np.asarray(choices)
    if choices.ndim != 2 or not np.issubdtype(choices.dtype, np.integer):
        raise ValueError(
            f"{name} must be a 2-D integer array (layers, tokens), got shape {choices.shape} of {choices.dtype}"
        )
    if choices.size and (choices.min() < 0 or choices.max() >= num_experts):
        raise ValueError(f"{name} must hold expert ids in [0, {num_experts}), got {choices.min()}..{choices.max()}")
    return choices


def _check_counts(counts, name: str) -> np.ndarray:
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 1 or not np.isfinite(counts).all() or (counts < 0).any():
        raise ValueError(f"{name} must be a 1-D array of non-negative finite values, got {counts.tolist()}")
    return counts


def _check_devices(num_devices: int) -> None:
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")


def profile_paths(choices, num_experts: int, path_length: int = 3) -> PathProfile:
    """Count, per MoE layer, the next-layer top-1 expert of every path (Lina's profiling).

    Args:
        choices: (layers, tokens) top-1 expert id of every profiled token in consecutive MoE layers.
        num_experts: E.
        path_length: l, how many previous layers form a path (Lina: 3; 1 and 6 studied).
    """
    if path_length < 1:
        raise ValueError(f"path_length must be >= 1, got {path_length}")
    if num_experts**path_length >= 2**62:
        raise ValueError(f"num_experts**path_length = {num_experts}**{path_length} does not fit a path code")
    choices = _check_choices(choices, num_experts, "choices")
    codes, counts = [], []
    for i in range(choices.shape[0]):
        prior = choices[max(0, i - path_length) : i]
        paths, inverse, _ = unique_codes(path_codes(prior, num_experts), num_experts ** len(prior))
        cells = inverse.reshape(-1) * num_experts + choices[i]  # (path, expert) of every token, row-major
        table = np.bincount(cells, minlength=len(paths) * num_experts).reshape(len(paths), num_experts)
        codes.append(paths)
        counts.append(table.astype(np.float64))
    return PathProfile(path_length, num_experts, tuple(codes), tuple(counts))


def merge_profiles(profiles: Sequence[PathProfile]) -> PathProfile:
    """The profile of several profiles' tokens together: per layer the union of their paths, and each
    path's counts added. Equal to ``profile_paths`` of their choices concatenated along the tokens,
    without holding them all at once (a simulated run profiles millions of tokens per layer)."""
    first = profiles[0]
    if any(
        (p.path_length, p.num_experts, len(p.codes)) != (first.path_length, first.num_experts, len(first.codes))
        for p in profiles
    ):
        raise ValueError("profiles to merge must share their path length, experts and layers")
    codes, counts = [], []
    for layer in range(len(first.codes)):
        paths = np.unique(np.concatenate([p.codes[layer] for p in profiles]))
        table = np.zeros((len(paths), first.num_experts))
        for p in profiles:
            table[np.searchsorted(paths, p.codes[layer])] += p.counts[layer]  # a profile's paths are distinct
        codes.append(paths)
        counts.append(table)
    return PathProfile(first.path_length, first.num_experts, tuple(codes), tuple(counts))


def expected_tokens(profile: PathProfile, layer: int, prior, keep: int | None = None) -> np.ndarray:
    """Estimated token count per expert of ``layer``: sum over tokens t of P_j(t)(e).

    Args:
        prior: (min(layer, path_length), tokens) top-1 experts of this batch's tokens in the layers
            just before ``layer``, as many as a path holds (the earlier ones never matter: a caller
            keeps only these, not a copy of every layer's choices at every layer).
        keep: keep the top-``keep`` experts of each path's distribution (Lina: top-k); None keeps all.
    Returns (E,) floats; divided by N_t this is Eq. 1's popularity. Tokens on a path never seen in
    profiling contribute nothing (they have no estimate).
    """
    prior = _check_choices(prior, profile.num_experts, "prior")
    rows = min(layer, profile.path_length)
    if prior.shape[0] != rows:
        raise ValueError(f"prior must hold the {rows} layers before layer {layer}, got {prior.shape[0]}")
    paths, n_tokens = code_counts(path_codes(prior, profile.num_experts), profile.num_experts ** len(prior))
    known = profile.codes[layer]
    rows = np.minimum(np.searchsorted(known, paths), len(known) - 1)
    seen = known[rows] == paths
    psi = profile.counts[layer][rows[seen]]  # (seen paths, E)
    p = psi / psi.sum(axis=1, keepdims=True)
    if keep is not None:
        kept = np.zeros(p.shape, dtype=bool)
        np.put_along_axis(kept, np.argsort(-p, axis=1, kind="stable")[:, :keep], True, axis=1)
        p = np.where(kept, p, 0.0)
    return n_tokens[seen] @ p


def top_experts(popularity, n: int) -> np.ndarray:
    """The ``n`` most popular experts, most popular first; ties rank the lower id first."""
    popularity = _check_counts(popularity, "popularity")
    return np.argsort(-popularity, kind="stable")[:n]


def devices_per_expert(popularity, num_devices: int) -> np.ndarray:
    """Eq. 1: n_e = N * popularity_e, popularity normalised to sum to 1 (reading: sum n_e = N).

    ``popularity`` is sum_t P_j(t)(e) / N_t or any per-expert token count; all zeros gives zeros.
    """
    popularity = _check_counts(popularity, "popularity")
    _check_devices(num_devices)
    total = popularity.sum()
    return num_devices * popularity / total if total > 0 else np.zeros_like(popularity)


def first_fit_decreasing(
    sizes, num_bins: int, capacity: float = 1.0, max_items: int = MAX_EXPERTS_PER_DEVICE, groups=None
) -> np.ndarray:
    """Bin of every item: largest first, into the first bin it fits (load, item count, group).

    An item fits a bin when the load stays <= ``capacity``, the bin holds < ``max_items`` items and no
    item of the same ``groups`` value (two replicas of one expert never share a device). An item that
    fits nowhere goes to the least-loaded bin with room. Bins left empty are the devices saved.
    Raises ValueError when some item finds no bin with room.
    """
    sizes = _check_counts(sizes, "sizes")
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    groups = np.arange(len(sizes)) if groups is None else np.asarray(groups)
    load, members = np.zeros(num_bins), [[] for _ in range(num_bins)]
    assignment = np.empty(len(sizes), dtype=np.int64)
    for item in np.argsort(-sizes, kind="stable"):
        room = [b for b in range(num_bins) if len(members[b]) < max_items and groups[item] not in members[b]]
        if not room:
            raise ValueError(
                f"item {item} (group {groups[item]}) fits no bin: all {num_bins} bins hold "
                f"{max_items} items or one of its group"
            )
        fits = [b for b in room if load[b] + sizes[item] <= capacity + 1e-9]
        b = fits[0] if fits else min(room, key=lambda b: load[b])
        assignment[item] = b
        load[b] += sizes[item]
        members[b].append(groups[item])
    return assignment


def replica_counts(n: np.ndarray, num_devices: int, max_per_device: int = MAX_EXPERTS_PER_DEVICE) -> np.ndarray:
    """Copies per expert: 1 per popular expert (n_e >= 1), then spare devices to the largest n_e / r_e.

    Unpopular experts (n_e < 1) get 0 here: they are packed, not replicated. Spare devices are those
    the unpopular experts do not fill: N - #popular - round(sum of unpopular n_e) (reading), and no
    more than leave every expert a slot under ``max_per_device``.
    """
    popular = n >= 1.0
    copies = popular.astype(np.int64)
    spare = num_devices - int(copies.sum()) - int(round(n[~popular].sum()))
    spare = min(spare, num_devices * max_per_device - len(n))
    for _ in range(max(0, spare) if popular.any() else 0):
        copies[np.argmax(np.where(popular, n / np.maximum(copies, 1), -np.inf))] += 1
    return copies


def phase1_placement(n, num_devices: int, max_per_device: int = MAX_EXPERTS_PER_DEVICE) -> Placement:
    """Lina's phase-1 pre-allocation from devices-worth per expert ``n`` (``devices_per_expert``).

    Popular experts get ``replica_counts`` copies of size n_e / r_e, unpopular experts (0 < n_e < 1)
    one slot of size n_e; all are packed first-fit-decreasing onto ``num_devices`` devices of
    capacity 1 (one device-worth of tokens), <= ``max_per_device`` experts each. Experts without an
    estimate (n_e = 0) go to the device with the fewest experts, then the least load.
    """
    n = _check_counts(n, "devices_per_expert")
    _check_devices(num_devices)
    if len(n) > num_devices * max_per_device:
        raise ValueError(f"{len(n)} experts do not fit {num_devices} devices with max_per_device={max_per_device}")
    copies = replica_counts(n, num_devices, max_per_device)
    copies[(n > 0) & (copies == 0)] = 1  # unpopular: one packed slot
    expert_of = np.repeat(np.arange(len(n)), copies)  # one item per copy
    sizes = n[expert_of] / copies[expert_of]
    bins = first_fit_decreasing(sizes, num_devices, 1.0, max_per_device, groups=expert_of)
    replicas = [sorted(int(b) for b in bins[expert_of == e]) for e in range(len(n))]
    load = np.bincount(bins, weights=sizes, minlength=num_devices)
    members = np.bincount(bins, minlength=num_devices)
    for e in np.flatnonzero(n == 0):
        room = [d for d in range(num_devices) if members[d] < max_per_device]
        d = min(room, key=lambda d: (members[d], load[d]))
        replicas[e] = [d]
        members[d] += 1
    return Placement(tuple(tuple(r) for r in replicas), num_devices)


def static_placement(num_experts: int, num_devices: int) -> Placement:
    """The baseline: one copy per expert, expert e on device e when E <= N, else contiguous blocks
    (device e * N // E, i.e. e // experts_per_device when N divides E), as in training."""
    _check_devices(num_devices)
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts}")
    if num_experts <= num_devices:
        return Placement(tuple((e,) for e in range(num_experts)), num_devices)
    return Placement(tuple((e * num_devices // num_experts,) for e in range(num_experts)), num_devices)


def needs_replan(estimated, actual, top_k: int) -> bool:
    """Phase-2 trigger: do the estimated and actual top-2k expert sets differ?"""
    estimated, actual = _check_counts(estimated, "estimated"), _check_counts(actual, "actual")
    if len(estimated) != len(actual):
        raise ValueError(f"estimated ({len(estimated)}) and actual ({len(actual)}) must cover the same experts")
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    return set(top_experts(estimated, 2 * top_k).tolist()) != set(top_experts(actual, 2 * top_k).tolist())


def plan_layer(
    estimated, actual, num_devices: int, top_k: int, finetune: bool = True, max_per_device: int = MAX_EXPERTS_PER_DEVICE
) -> tuple[Placement, bool]:
    """Lina's two phases for one MoE layer of one batch.

    Args:
        estimated: (E,) estimated popularity (``expected_tokens``; the no-estimation ablation passes
            the previous batch's actual counts).
        actual: (E,) token count per expert from the real gate.
        finetune: run phase 2 (False: the "without fine-tuning" ablation).
    Returns (placement, replanned): phase 1's placement, or the actual popularity's when phase 2 fires.
    """
    if finetune and needs_replan(estimated, actual, top_k):
        return phase1_placement(devices_per_expert(actual, num_devices), num_devices, max_per_device), True
    return phase1_placement(devices_per_expert(estimated, num_devices), num_devices, max_per_device), False


def route_rows(expert_ids, placement: Placement, offsets=None) -> np.ndarray:
    """Destination device of every row (token, choice): expert e's rows go round-robin over its replicas.

    Args:
        expert_ids: (P,) expert of every row of this source, in row order.
        offsets: (E,) rows of each expert that earlier sources already dealt (global round-robin,
            so replica totals over all sources differ by <= 1); None = this is the first source.
    """
    expert_ids = np.asarray(expert_ids, dtype=np.int64)
    E = placement.num_experts
    if expert_ids.size and (expert_ids.min() < 0 or expert_ids.max() >= E):
        raise ValueError(f"expert_ids must be in [0, {E}), got {expert_ids.min()}..{expert_ids.max()}")
    offsets = np.zeros(E, dtype=np.int64) if offsets is None else np.asarray(offsets, dtype=np.int64)
    order = np.argsort(expert_ids, kind="stable")
    starts = np.concatenate([[0], np.cumsum(np.bincount(expert_ids, minlength=E))[:-1]])
    rank_in_expert = np.empty_like(expert_ids)
    rank_in_expert[order] = np.arange(len(expert_ids)) - starts[expert_ids[order]]  # i-th row of its expert here
    dest = np.empty_like(expert_ids)
    for e, devices in enumerate(placement.replicas):
        rows = expert_ids == e
        dest[rows] = np.asarray(devices)[(offsets[e] + rank_in_expert[rows]) % len(devices)]
    return dest


def send_counts(expert_ids, placement: Placement, offsets=None) -> np.ndarray:
    """(N,) rows this source sends to every device under ``route_rows``."""
    return np.bincount(route_rows(expert_ids, placement, offsets), minlength=placement.num_devices)


def replica_token_counts(counts, placement: Placement) -> np.ndarray:
    """(S, N, E) rows source s sends to device d for expert e, from the (S, E) rows per source and expert.

    The closed form of ``route_rows`` over all sources: every rank derives the whole exchange from
    the gathered per-expert counts, so the uneven all-to-all splits need no second count exchange.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim != 2 or counts.shape[1] != placement.num_experts or (counts < 0).any():
        raise ValueError(
            f"counts must be a non-negative (sources, {placement.num_experts}) array, got {counts.tolist()}"
        )
    S, E = counts.shape
    before = np.cumsum(counts, axis=0) - counts  # (S, E): rows of earlier sources
    # every replica at once: replica q of expert e on device d, one of r copies
    expert = np.array([e for e, devices in enumerate(placement.replicas) for _ in devices])
    device = np.array([d for devices in placement.replicas for d in devices])
    q = np.concatenate([np.arange(len(devices)) for devices in placement.replicas])
    r = np.array([len(devices) for devices in placement.replicas])[expert]
    start, end = before[:, expert], before[:, expert] + counts[:, expert]  # (S, replicas)
    out = np.zeros((S, placement.num_devices, E), dtype=np.int64)
    out[:, device, expert] = _count_mod(end, q, r) - _count_mod(start, q, r)  # rows g with g % r == q
    return out


def _count_mod(x: np.ndarray, q, r) -> np.ndarray:
    """How many g in [0, x) have g % r == q (elementwise over broadcast arrays)."""
    return np.maximum(0, (x - q + r - 1) // r)


def load_imbalance(routed: np.ndarray) -> float:
    """Largest device's rows over the mean device's rows (1 = perfectly balanced) of an (S, N, E) exchange."""
    per_device = routed.sum(axis=(0, 2))
    return float(per_device.max() / per_device.mean()) if per_device.sum() else 1.0


def popularity_ratio(choices, num_experts: int) -> float:
    """Most over least popular expert's token count, per MoE layer, averaged over layers (Lina Fig 6).

    Args:
        choices: (layers, tokens) top-1 expert of every token (``profile_paths``' input).
    Layers where some expert got no token have no finite ratio and are left out; NaN when every
    layer is such a layer.
    """
    choices = _check_choices(choices, num_experts, "choices")
    ratios = [c.max() / c.min() for c in (np.bincount(row, minlength=num_experts) for row in choices) if c.min() > 0]
    return float(np.mean(ratios)) if ratios else float("nan")


def path_topk_share(profile: PathProfile, k: int) -> float:
    """Share of tokens whose expert at layer i is among the top-``k`` experts of their path group's
    layer-i distribution Psi_j, over layers 1.. (layer 0 has no path). With ``path_length`` 1 the
    group is "the tokens that picked the same expert in layer i - 1": Lina Fig 9."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    hits = total = 0.0
    for counts in profile.counts[1:]:  # (paths, E)
        hits += np.sort(counts, axis=1)[:, ::-1][:, :k].sum()
        total += counts.sum()
    return float(hits / total) if total else float("nan")


def schedule_rates(estimate_right: list[bool], replanned: list[bool]) -> dict[str, float]:
    """Over the (layer, batch) decisions of a run: ``estimation_accuracy``, the share whose estimated
    top-2k set equalled the actual one (Lina Fig 19, Table 5), and ``replan_rate``, the share that
    ran phase 2 (the paper: 23% on average)."""
    if not estimate_right or len(estimate_right) != len(replanned):
        raise ValueError(
            f"need one replanned flag per estimation check, got {len(estimate_right)} checks and {len(replanned)} flags"
        )
    return {"estimation_accuracy": float(np.mean(estimate_right)), "replan_rate": float(np.mean(replanned))}
