"""The Megatron-LM baseline AxoNN compares against (papers.md §3.1): its layout as its authors
configure GPT (Narayanan et al., SC'21); the time of its 1F1B pipeline schedule is the core's
(moe_core.sim.pipeline.pipeline_time_s). Pure functions, no torch.

The rule: tensor parallelism inside a node (NVLink), tp = devices_per_node (or the whole world when
it is smaller); the smallest pipeline depth pp, with n_layers % pp == 0 (powers of two first, then
the other divisors; pp must divide gpus / tp and the resulting dp the global batch), at which the
first stage fits in memory; data parallelism over the rest; micro-batches of one sequence.
"""

from __future__ import annotations

from moe_core.papers.axonn.comm_model import stored_activation_bytes
from moe_core.papers.axonn.models import GptModel, parameters
from moe_core.units import GB


def megatron_memory_bytes(
    model: GptModel, tp: int, pp: int, microbatches: int, bytes_per_param: int = 16, recompute: bool = True
) -> float:
    """Per-GPU memory of the first pipeline stage (the fullest under 1F1B).

    States: parameters / (tp x pp) x ``bytes_per_param`` (an average stage; mixed-precision Adam: 16).
    Activations (2-byte, one sequence per micro-batch): 1F1B keeps min(pp, microbatches) micro-batches
    in flight on the first stage, each with its n_layers / pp blocks' activations, the pairs' split over
    tp (comm_model.stored_activation_bytes; full recomputation by default, as Narayanan et al. train
    their large GPTs).
    """
    states = parameters(model) / (tp * pp) * bytes_per_param
    activations = stored_activation_bytes(
        model.seq_len, model.d_model, model.d_ff, model.n_layers // pp, tp, recompute, in_flight=min(pp, microbatches)
    )
    return states + activations


def _pipeline_candidates(n_layers: int) -> list[int]:
    """Pipeline depths that split the layers evenly: powers of two ascending, then the other divisors."""
    divisors = [k for k in range(1, n_layers + 1) if n_layers % k == 0]
    powers = [k for k in divisors if k & (k - 1) == 0]
    return powers + [k for k in divisors if k not in powers]


def megatron_layout(
    model: GptModel, gpus: int, hw, memory_GB: float, bytes_per_param: int = 16, recompute: bool = True
) -> dict:
    """Megatron-LM's layout of ``model`` on ``gpus`` GPUs of ``hw`` (the module's rule).

    Returns dict(tp, pp, dp, microbatches, micro_batch_sequences, memory_GB): microbatches per
    iteration per pipeline, memory_GB the first stage's (:func:`megatron_memory_bytes`). ValueError
    naming what to change when tp does not split the model or no pipeline depth fits.
    """
    tp = min(hw.devices_per_node, gpus)
    if gpus % tp or model.d_model % tp or model.n_heads % tp:
        raise ValueError(
            f"Megatron's tp = {tp} (hardware.devices_per_node) must divide gpus={gpus}, d_model={model.d_model} and "
            f"n_heads={model.n_heads}"
        )
    micro_batch_sequences = 1
    for pp in _pipeline_candidates(model.n_layers):
        dp = gpus // (tp * pp)
        if gpus % (tp * pp) or model.global_sequences % (dp * micro_batch_sequences):
            continue
        microbatches = model.global_sequences // (dp * micro_batch_sequences)
        memory = megatron_memory_bytes(model, tp, pp, microbatches, bytes_per_param, recompute)
        if memory <= memory_GB * GB:
            return {
                "tp": tp,
                "pp": pp,
                "dp": dp,
                "microbatches": microbatches,
                "micro_batch_sequences": micro_batch_sequences,
                "memory_GB": memory / GB,
            }
    raise ValueError(
        f"no Megatron layout of {model.name} on gpus={gpus} fits memory_GB={memory_GB}: pipeline depths dividing "
        f"n_layers={model.n_layers} and gpus / tp = {gpus // tp} were tried; add GPUs or memory"
    )
