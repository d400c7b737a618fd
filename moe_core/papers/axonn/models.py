"""The GPT models of AxoNN's weak-scaling study (papers.md §3.4: roughly 5B to 80B parameters on 64 to
1024 GPUs of Perlmutter) and a ~2B model for the overlap ablation.

Where the dimensions come from. 2305.13525's exact model dimensions and batch sizes are not in
reference/papers.md, which marks its figures [UNC]; only the 80B-on-1024-GPUs point is confirmed
[ABS]. The models here follow the shape rules of the Megatron-LM scaling table (Narayanan et al.,
SC'21): parameters ~ 12 L d^2, head dimension 128 (n_heads = d / 128), FFN 4 d, GPT-2's padded
vocabulary of 51200 and 2048-token sequences. Each doubles the parameters and the GPUs of the one
before (weak scaling).

The global batch is not stated either: a model here carries one sequence per GPU, and a run trains it
on ``axonn.sequences_per_gpu`` (:func:`with_batch`; the value and its range: config.py, UNSTATED).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

VOCAB_SIZE = 51200  # GPT-2's 50257 padded to a multiple of 1024 (Megatron-LM)
SEQ_LEN = 2048
HEAD_DIM = 128


@dataclass(frozen=True)
class GptModel:
    """A dense GPT and the run it is trained in."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    d_ff: int
    vocab_size: int
    seq_len: int
    gpus: int
    global_sequences: int  # sequences per iteration, all GPUs together


def gpt(name: str, n_layers: int, d_model: int, gpus: int) -> GptModel:
    """A model by the shape rules above (head dim 128, FFN 4 d), one sequence per GPU."""
    return GptModel(name, n_layers, d_model, d_model // HEAD_DIM, 4 * d_model, VOCAB_SIZE, SEQ_LEN, gpus, gpus)


def with_batch(model: GptModel, sequences_per_gpu: int) -> GptModel:
    """``model`` trained on ``sequences_per_gpu`` sequences per GPU per iteration (weak scaling: the
    same per GPU at every size)."""
    return replace(model, global_sequences=sequences_per_gpu * model.gpus)


def parameters(model: GptModel) -> int:
    """The standard GPT count: 12 L d^2 (the blocks' weights, FFN 4 d) + 13 L d (their biases and layer
    norms) + vocab x d (embeddings, tied to the head) + seq x d (position embeddings)."""
    L, d = model.n_layers, model.d_model
    return 12 * L * d * d + 13 * L * d + model.vocab_size * d + model.seq_len * d


WEAK_SCALING = (
    gpt("5B", 24, 4096, 64),
    gpt("10B", 32, 5120, 128),
    gpt("20B", 44, 6144, 256),
    gpt("40B", 48, 8192, 512),
    gpt("80B", 64, 10240, 1024),
)
# ~2.0B (1.89B in the blocks, 0.14B embeddings). Its GPU count is an assumption (the ablation's is not
# in reference/): the weak-scaling study's smallest.
TWO_B = gpt("2B", 24, 2560, 64)
