"""Step-level external validation: the simulator's training step against published GPU training steps.

    python -m experiments.external_steps --config configs/default.yaml

analysis/external_steps.yaml lists published end-to-end training throughputs on real GPU clusters with their
settings. Each entry is either priced or carries ``excluded: "<why>"`` (a mechanism the simulator lacks). A
priced entry is mapped to the suite's own config (a dense GPT: d_model, layers, heads and key/value heads,
d_ff and FFN activation, vocab, sequence; bfloat16; tensor, pipeline (1F1B, interleaved when the source says
so) and data parallelism as the source states them; the per-rank batch global_batch / dp in micro-batches of
the source's size; the source's activation recomputation (every block, or the first ``recompute_layers`` of
each stage); the linear layers in FP8 where the source trains in FP8 (``precision`` fp8-delayed or
fp8-current: Transformer Engine's scaling recipes); FSDP as full data sharding, Megatron's distributed
optimizer as optimizer sharding)
and, for an MoE entry, Megatron's MoE: every layer's FFN top-k experts over ``ep`` ranks, whole (etp 1) or split
as the dense blocks, dropless (routing priced as balanced) or at the stated capacity) and simulated by
``moe_core.sim.pipeline.simulate_step`` on the entry's hardware profile as it is (spec-sheet
values; nothing is fitted to these rows, they are held out). A GELU FFN is priced as the suite's ReLU FFN:
the same two GEMMs and one elementwise kernel per pass; SwiGLU as SwiGLU.

The error is on step time: ``step_error = predicted step / published step - 1``, the published step derived
from the published metric with the source's own definition (``tokens_per_s_per_gpu``: global_batch x seq_len /
(step x GPUs); ``model_tflops_per_gpu``: the iteration's model FLOPs by the source's formula (``flops_formula``:
Megatron-LM's, experiments.impl.external_steps.megatron_flops) / (step x GPUs); ``step_s``: the step
itself). The records also carry the metric predicted the same way.

Records: ``results/raw/common/external_steps/<id>.json`` (mode simulated, backend sim) with metrics
``published``, ``predicted``, ``published_step_s``, ``predicted_step_s``, ``step_error`` and the simulated
step's exposed communication ``exposed_comm_ms``.
"""

from __future__ import annotations

import sys

from moe_core.config.cli import config_arg_parser

# What it reads of the config (named by --help).
CONFIG_KEYS = ("results_dir", "sweep.name", "wandb")


def main(argv: list[str] | None = None) -> int:
    args = config_arg_parser(__doc__, CONFIG_KEYS).parse_intermixed_args(argv)
    from experiments.impl.external_steps import run  # the models and the simulator: once the command line is parsed

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
