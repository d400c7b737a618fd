"""GShard's MoE Transformers (Table 1), their training runs (Table 3), and how the suite's decoder-only
step simulator stands in for them.

The family (reference/papers.md §2.1-§2.3) [FT]: d_model 1024, FFN and expert hidden 8192, 16 heads of
key/value dimension 128, every other FFN of the encoder and of the decoder an MoE layer of E experts
(top-2 gating), E = the number of TPU v3 cores (one expert per core): models (1)-(6) are 2048, 512 and
128 experts at 36 and 12 layers. Weights and activations in float32.

What "36L" means, from Table 1's own numbers:

* Total experts are E x L/2 for every model: 9,216 = 512 x 18, 3,072 = 512 x 6, 2,304 = 128 x 18,
  768 = 128 x 6, 61,440 = 2048 x 30 (the 60-layer model). So L counts the MoE layers twice: L layers
  in all, L/2 of them MoE. (papers.md lists models (1) and (2) as 36,684 and 12,228: digit swaps of
  36,864 = 2048 x 18 and 12,288 = 2048 x 6; to check against the PDF.)
* The L layers are the encoder's and the decoder's together, L/2 each: the dense baseline T(96L) of
  Fig 1 has 2.3B weights, and 48 encoder + 48 decoder layers of these dimensions (attention 4 d^2,
  FFN 2 d 8192, the decoder's cross-attention, 96k embeddings) count 2.31B, while 96 layers on each
  side would be twice that. An even split is the reading that fits. (T(96L)'s attention is d_model
  wide: 2048 wide, as the MoE models' 16 x 128, it would count 2.9B.)
* Table 1's weights (600B, 200B, 150B, 50B, 37B, 12.5B) are 0.97 x the expert weights
  E x L/2 x 2 x 1024 x 8192 for every model (37B: 0.96): the experts are over 99% of every model, and
  the dense layers (0.35-0.89B by :func:`parameter_counts`) are inside the labels' rounding, so the
  counts confirm the experts' shape and the L/2 MoE layers but say nothing about the dense ones.

The stand-in. The step simulator (moe_core.sim.step) runs a decoder-only stack in which every token
passes every layer. An encoder-decoder step moves each source token through the L/2 encoder layers
and each target token through the L/2 decoder layers. So the stand-in has all L layers (every other
FFN MoE, as GShard's Fig 3) and carries half the batch's tokens: each position stands for one source
and one target token. The FFNs' and experts' FLOPs and weights, the all-to-alls' bytes and count are
then the encoder-decoder's, if the batch splits evenly between source and target (unstated;
translation pairs have similar lengths). What the stand-in lacks: the decoder's cross-attention, and
attention 2048 wide (16 heads x 128; the suite's attention is d_model wide), so its attention computes
a third of the real one's FLOPs, its step about 22% fewer FLOPs than the encoder-decoder's, and its
gradient all-reduce carries 0.17-0.37B fewer replicated weights (the simulator would need an attention
width and cross-attention to close the gap); its softmax head is the target vocabulary's (32k), the
one the decoder computes. Memory (memory.py) counts the encoder-decoder's own weights.

The batch (Table 3) [FT]: 4M tokens on 2048 cores, 1M on 512 and on 128. Decimal millions: Table 3's
training days and core-years follow from its steps/s with 1T tokens / 4e6 tokens per step = 250k
steps, the step count of the headline ("1T tokens in 250k steps"); 2^22 tokens would give 3.8 days
for model (1), not 4.0.
"""

from __future__ import annotations

from dataclasses import dataclass

D_MODEL = 1024
D_FF = 8192
N_HEADS = 16
HEAD_DIM = 128  # the key/value dimension per head [FT]; attention is N_HEADS x HEAD_DIM = 2048 wide
SOURCE_VOCAB = 64_000  # SentencePiece, 102 languages [FT]
TARGET_VOCAB = 32_000  # English [FT]; the decoder's softmax, tied to its embedding (assumption)
SIDES = 2  # source and target: each stand-in position is one token of each
TRAINING_TOKENS = 1e12  # every model is evaluated after 1T tokens [FT]
SECONDS_PER_DAY = 86_400
DAYS_PER_YEAR = 365.25


@dataclass(frozen=True)
class GShardModel:
    """One model of Table 1 and its run of Table 3."""

    id: int  # Table 1's (1)..(6)
    experts: int  # per MoE layer; = TPU v3 cores (one expert per core)
    n_layers: int  # encoder and decoder together (the "L" of "36L")
    batch_tokens: int  # tokens per training step, source and target together

    @property
    def name(self) -> str:
        return f"MoE({self.experts}E, {self.n_layers}L)"

    @property
    def cores(self) -> int:
        return self.experts

    @property
    def moe_layers(self) -> int:
        return self.n_layers // 2

    @property
    def total_experts(self) -> int:
        return self.experts * self.moe_layers


TABLE_1 = (
    GShardModel(1, 2048, 36, 4_000_000),
    GShardModel(2, 2048, 12, 4_000_000),
    GShardModel(3, 512, 36, 1_000_000),
    GShardModel(4, 512, 12, 1_000_000),
    GShardModel(5, 128, 36, 1_000_000),
    GShardModel(6, 128, 12, 1_000_000),
)
MODELS = {model.id: model for model in TABLE_1}


@dataclass(frozen=True)
class Weights:
    """``count`` weight tensors of one shape (``cols`` 1 for a vector), sharded over the cores (the
    experts: one per core) or replicated on every core (all the rest; papers.md §2.1, Fig 3)."""

    name: str
    count: int
    rows: int
    cols: int
    sharded: bool = False

    @property
    def parameters(self) -> int:
        return self.count * self.rows * self.cols


def weights(experts: int, n_layers: int) -> list[Weights]:
    """The weights of the encoder-decoder of ``n_layers`` (half each side, every other FFN MoE) with
    ``experts`` per MoE layer. GShard's FFN_e has no biases (papers.md §2.1); attention is
    N_HEADS x HEAD_DIM wide; the decoder's softmax is tied to its embedding (assumption)."""
    side = moe = n_layers // 2  # layers per side; MoE layers in all
    attention_width = N_HEADS * HEAD_DIM
    return [
        # Q, K, V, output: the encoder's self-attention, the decoder's self- and cross-attention
        Weights("attention", 4 * 3 * side, D_MODEL, attention_width),
        Weights("dense FFN", 2 * (n_layers - moe), D_MODEL, D_FF),  # wi and wo
        Weights("gate", moe, D_MODEL, experts),
        Weights("layer norm", 2 * 5 * side, D_MODEL, 1),  # scale and bias; 2 per encoder layer, 3 per decoder's
        Weights("source embedding", 1, SOURCE_VOCAB, D_MODEL),
        Weights("target embedding", 1, TARGET_VOCAB, D_MODEL),
        Weights("experts", 2 * moe * experts, D_MODEL, D_FF, sharded=True),  # wi and wo of each
    ]


def parameter_counts(experts: int, n_layers: int) -> dict[str, int]:
    """Weights by kind: ``experts`` (every MoE layer's) and ``dense`` (everything else)."""
    every = weights(experts, n_layers)
    return {
        "experts": sum(w.parameters for w in every if w.sharded),
        "dense": sum(w.parameters for w in every if not w.sharded),
    }


def tokens_per_side(model: GShardModel) -> int:
    """Each core's share of one side (source or target) of the batch, in tokens."""
    return model.batch_tokens // (SIDES * model.cores)


def tokens_per_core(model: GShardModel, group_size: int, max_groups: int) -> int:
    """Tokens each core holds per MoE layer, in whole groups of ``group_size`` (GShard's S): the G
    groups its share of one side of Table 3's batch fills, at most ``max_groups`` of them. A count
    >= G is Table 3's batch; 1 one group per core at every size, as GShard's scaling
    assumptions have it (S = O(1), N/D = O(1); papers.md §2.1); between, a batch between the two.
    The config's validation makes G at least one."""
    groups = tokens_per_side(model) // group_size
    return max(1, min(groups, max_groups)) * group_size


def simulated_batch_tokens(model: GShardModel, group_size: int, max_groups: int) -> int:
    """Tokens per step the stand-in carries, source and target together (Table 3's, to whole groups,
    or fewer with ``max_groups``: :func:`tokens_per_core`)."""
    return SIDES * model.cores * tokens_per_core(model, group_size, max_groups)


def training_days(steps_per_s: float, batch_tokens: float) -> float:
    """Days to train on 1T tokens at ``steps_per_s`` steps of ``batch_tokens`` (Table 3's arithmetic)."""
    return TRAINING_TOKENS / batch_tokens / steps_per_s / SECONDS_PER_DAY


def core_years(steps_per_s: float, batch_tokens: float, cores: int) -> float:
    """TPU core-years of that training: every core busy for its days."""
    return cores * training_days(steps_per_s, batch_tokens) / DAYS_PER_YEAR
