"""Synthetic top-1 routing for Lina's simulated inference at the paper's scale.

Lina's inference scheduling pays off because of three properties of real routing (reference/
papers.md, Lina §1.2, Figs 6 and 9): expert popularity is skewed; a token's expert in the next
layer follows the experts it took before (what path-based estimation exploits); and popularity
changes from batch to batch (why estimating beats reusing the previous batch's). The measured
inference (experiments/inference.py) gets them from a trained gate on this machine's scale; at the
paper's (16 experts on 16 GPUs, 12 MoE layers, 8K tokens per GPU) this model generates them:

* every MoE layer has a base popularity, Zipf over its experts in a random order of its own;
* a batch draws its own popularity per layer around the base (Dirichlet, concentration ``drift``);
* layer 0: a token draws its expert from the batch's popularity; layer i+1: with probability
  ``stickiness`` it follows its path, taking the expert of layer i+1 whose base rank equals its
  layer-i expert's (so popular paths stay popular and every layer's base stays the same Zipf), else
  it draws anew from the batch's popularity of layer i+1.

Parameters from the paper's own numbers (:func:`lina_routing`), none fitted to a result:

* ``zipf``: Fig 6, in inference the most popular expert receives 4.02x (4 experts) and 5.56x
  (16 experts) the tokens of the least popular. A Zipf of exponent s over E experts has that ratio
  E^s, so s = ln(ratio) / ln(E): 1.00 at 4 experts, 0.62 at 16; other counts interpolate the ratio
  geometrically in ln(E) (8 experts: 4.73, s = 0.75).
* ``stickiness``: Fig 9, 41.94% of the tokens that took the same expert in layer i take that
  group's most frequent expert in layer i+1. Here a group's most frequent next expert is its path
  successor, taken with probability rho + (1 - rho) p_succ, so the share is
  rho + (1 - rho) sum_e p_e^2 (the group of expert e is p_e of the tokens, its successor has the
  same base share); solved for rho. The paper's figure pools two 12-layer models; one rho serves
  every layer.
* ``drift`` is not in the paper (assumption; config ``lina.inference_drift``): 400, so an expert
  holding 1/16 of the tokens varies by about 20% (one standard deviation) from batch to batch: 16
  GPUs x 8 sequences of 1024 tokens average the topics of 128 sequences. The plausible range
  100-1600 (40% to 10%; ``config.INFERENCE_UNSTATED``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Lina Fig 6 [FT]: most over least popular expert's tokens in inference, by expert count.
POPULARITY_RATIO = {4: 4.02, 16: 5.56}
NEXT_LAYER_TOP1_SHARE = 0.4194  # Lina Fig 9 [FT]


def zipf_popularity(num_experts: int, exponent: float) -> np.ndarray:
    """(E,) shares of a Zipf law, most popular first."""
    weights = np.arange(1, num_experts + 1, dtype=float) ** -exponent
    return weights / weights.sum()


def popularity_exponent(num_experts: int) -> float:
    """The Zipf exponent whose most/least popularity ratio is Fig 6's at ``num_experts`` experts."""
    if num_experts < 2:
        raise ValueError(f"routing needs at least 2 experts, got {num_experts}")
    (e0, r0), (e1, r1) = sorted(POPULARITY_RATIO.items())
    t = (np.log(num_experts) - np.log(e0)) / (np.log(e1) - np.log(e0))
    ratio = np.exp((1 - t) * np.log(r0) + t * np.log(r1))
    return float(np.log(ratio) / np.log(num_experts))


def path_stickiness(popularity: np.ndarray, top1_share: float = NEXT_LAYER_TOP1_SHARE) -> float:
    """rho such that tokens of one layer-i expert take their group's top next expert ``top1_share``
    of the time: top1_share = rho + (1 - rho) sum_e p_e^2."""
    chance = float(np.sum(popularity**2))
    if not chance < top1_share < 1:
        raise ValueError(f"a top-1 share of {top1_share} is not above chance ({chance:.3f}) and below 1")
    return (top1_share - chance) / (1 - chance)


# The uniforms' bins of categorical's lookup table: a power of two, so a uniform's bin is exact.
CDF_BINS = 1 << 12


def categorical(rng: np.random.Generator, shares: np.ndarray, size: int) -> np.ndarray:
    """``size`` draws from the categorical distribution ``shares``: exactly ``rng.choice(len(shares),
    size, p=shares)`` (the same uniforms from ``rng``, each mapped to the first category whose
    cumulative share exceeds it), twice as fast at the paper's scale (24 draws of 16 x 32768 tokens
    over 16 experts: 0.19 s against numpy's 0.37 s). numpy binary-searches the cumulative shares for
    every uniform; here a uniform's bin of CDF_BINS equal bins gives its category from a table, and
    only the uniforms of the few bins a cumulative share falls inside are searched."""
    cdf = np.cumsum(shares)
    cdf /= cdf[-1]
    uniforms = rng.random(size)
    edges = np.arange(CDF_BINS + 1) / CDF_BINS
    first = cdf.searchsorted(edges[:-1], side="right")  # the category of a bin's lowest uniform
    last = cdf.searchsorted(np.nextafter(edges[1:], 0), side="right")  # of its highest
    table = np.where(first == last, first, -1).astype(np.min_scalar_type(-len(shares)))
    drawn = table[(uniforms * CDF_BINS).astype(np.intp)]
    split = np.flatnonzero(drawn < 0)  # uniforms of a bin with a category boundary inside
    drawn[split] = cdf.searchsorted(uniforms[split], side="right")
    return drawn


@dataclass(frozen=True)
class SyntheticRouting:
    """Top-1 expert choices of ``num_layers`` MoE layers over ``num_experts`` experts (module docstring)."""

    num_experts: int
    num_layers: int
    zipf: float
    stickiness: float
    drift: float
    seed: int = 0

    def __post_init__(self):
        if self.num_experts < 2 or self.num_layers < 1:
            raise ValueError(f"routing needs >= 2 experts and >= 1 layer, got {self.num_experts}, {self.num_layers}")
        if self.zipf < 0 or not 0 <= self.stickiness < 1 or self.drift <= 0:
            raise ValueError(
                f"need zipf >= 0, 0 <= stickiness < 1, drift > 0; got {self.zipf}, {self.stickiness}, {self.drift}"
            )

    @property
    def base(self) -> np.ndarray:
        """(layers, E) base popularity: the same Zipf in each layer's own random expert order."""
        rng = np.random.default_rng([self.seed, 0])
        shares = zipf_popularity(self.num_experts, self.zipf)
        return np.stack([shares[np.argsort(rng.permutation(self.num_experts))] for _ in range(self.num_layers)])

    def batch(self, tokens: int, index: int) -> np.ndarray:
        """(layers, tokens) top-1 experts of batch ``index`` (seeded by it: every policy sees the same batch),
        in the smallest unsigned integer type that holds an expert id: at the paper's scale a batch is
        millions of tokens per layer, and every pass over it moves bytes."""
        rng = np.random.default_rng([self.seed, 1, index])
        base = self.base
        by_rank = np.argsort(-base, axis=1, kind="stable")  # (layers, E): layer's experts, most popular first
        rank_of = np.argsort(by_rank, axis=1)  # (layers, E): an expert's popularity rank in its layer
        choices = np.empty((self.num_layers, tokens), dtype=np.min_scalar_type(self.num_experts - 1))
        for layer in range(self.num_layers):
            batch_popularity = rng.dirichlet(self.drift * base[layer])
            drawn = categorical(rng, batch_popularity, tokens)
            if layer == 0:
                choices[layer] = drawn
                continue
            successor = by_rank[layer][rank_of[layer - 1]]  # (E,) per expert of layer - 1, its successor
            choices[layer] = np.where(rng.random(tokens) < self.stickiness, successor[choices[layer - 1]], drawn)
        return choices


def lina_routing(num_experts: int, num_layers: int, drift: float, seed: int = 0) -> SyntheticRouting:
    """The routing of Lina's setting at ``num_experts`` experts, its parameters from Figs 6 and 9."""
    zipf = popularity_exponent(num_experts)
    return SyntheticRouting(
        num_experts, num_layers, zipf, path_stickiness(zipf_popularity(num_experts, zipf)), drift, seed
    )
