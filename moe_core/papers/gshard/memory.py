"""Memory per TPU core of GShard's MoE Transformer, by kind, as its Fig 7 splits it (replicated weights,
distributed weights, activations) plus the optimizer's state and the gradients.

* Weights in float32 [FT, papers.md §2.2]: the experts split over the cores (one per core), everything
  else replicated on every core (moe_core/papers/gshard/models.py: ``weights``).
* Optimizer: Adafactor with beta1 = 0 [FT], so no first moment; its second moment is factored, a row
  and a column vector per weight matrix (rows + cols floats), whole for vectors (Shazeer & Stern 2018).
* Gradients: one float32 per weight. Fig 7 does not show them, but the replicated weights' gradients
  are all alive when the backward pass ends and their all-reduce starts.
* Activations: what the backward pass reads, kept from the forward pass without rematerialization,
  for the core's tokens of each side (:func:`activation_floats_per_token`), plus the target softmax's
  probabilities. Not counted: dropout masks (dropout 0.1 [FT]; bits, or recomputed from a seed) and
  XLA's temporary buffers.

With constant tokens per core (GShard's N/D = O(1)) and a constant group size S, every kind is about
constant in the number of experts: one expert per core; the per-token combine weights (E x C = 2S
with C = 2S/E) and the rows each core's expert computes (E x C / S = 2 per token) do not grow with E;
only the replicated gates (d_model x E per MoE layer) and gate probabilities (E per token) do.
"""

from __future__ import annotations

from moe_core.model.capacity import capacity
from moe_core.papers.gshard.models import D_FF, D_MODEL, HEAD_DIM, N_HEADS, TARGET_VOCAB, Weights, weights

FLOAT32_BYTES = 4
TOP_K = 2  # GShard's top-2 gating


def adafactor_state(w: Weights) -> int:
    """Floats of Adafactor's factored second moment for ``w`` (no first moment at beta1 = 0)."""
    per_tensor = w.rows + w.cols if w.cols > 1 else w.rows
    return w.count * per_tensor


def moe_rows_per_token(experts: int, group_size: int, capacity_factor: float) -> float:
    """Expert rows a core computes per token it holds: E x C slots per group of S tokens."""
    return experts * capacity(group_size, experts, TOP_K, capacity_factor, 0) / group_size


def activation_floats_per_token(
    experts: int, n_layers: int, seq_len: int, group_size: int, capacity_factor: float
) -> float:
    """Floats kept for the backward pass per position of one core (a source and a target token), over
    every layer of both sides, no rematerialization. Per sublayer, the tensors its backward reads:

    * attention: its input and normalized input, Q, K, V, the context (N_HEADS x HEAD_DIM each) and
      the softmax probabilities (heads x seq_len); the decoder has two (self and cross);
    * dense FFN: input, normalized input, the ReLU output (d_ff; its sign is ReLU's gradient);
    * MoE FFN: input, normalized input, gate probabilities (E), combine weights (E x C per token: the
      GSEC einsum operand; the dispatch mask is derived from it), and per expert row (E x C / S per
      token) the dispatched input, the ReLU output and the expert output.
    """
    width = N_HEADS * HEAD_DIM
    attention = 2 * D_MODEL + 4 * width + N_HEADS * seq_len
    dense = 2 * D_MODEL + D_FF
    rows = moe_rows_per_token(experts, group_size, capacity_factor)
    combine = rows * group_size  # E x C
    moe = 2 * D_MODEL + experts + combine + rows * (2 * D_MODEL + D_FF)
    side = n_layers // 2  # layers per side, every other FFN MoE
    ffn = (side - side // 2) * dense + side // 2 * moe
    return side * attention + ffn + 2 * side * attention + ffn  # encoder, then decoder


def memory_per_core(
    experts: int,
    n_layers: int,
    cores: int,
    tokens: int,
    seq_len: int,
    group_size: int,
    capacity_factor: float,
) -> dict[str, float]:
    """Bytes per core by kind for the model of ``experts`` per MoE layer and ``n_layers`` on ``cores``
    cores holding ``tokens`` positions each (one source and one target token each)."""
    every = weights(experts, n_layers)
    replicated = [w for w in every if not w.sharded]
    sharded = [w for w in every if w.sharded]
    per_token = activation_floats_per_token(experts, n_layers, seq_len, group_size, capacity_factor)
    replicated_weights = FLOAT32_BYTES * sum(w.parameters for w in replicated)
    distributed_weights = FLOAT32_BYTES * sum(w.parameters for w in sharded) / cores
    return {
        "replicated_weights_bytes": replicated_weights,
        "distributed_weights_bytes": distributed_weights,
        "optimizer_bytes": FLOAT32_BYTES
        * (sum(adafactor_state(w) for w in replicated) + sum(adafactor_state(w) for w in sharded) / cores),
        "gradients_bytes": replicated_weights + distributed_weights,
        "activations_bytes": FLOAT32_BYTES * tokens * (per_token + TARGET_VOCAB),
    }
