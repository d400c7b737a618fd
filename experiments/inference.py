"""Measured MoE inference with Lina's dynamic expert placement: every policy in one run, under torchrun.

    torchrun --standalone --nproc-per-node=4 -m experiments.inference --config configs/default.yaml \\
        parallel.world_size=4 moe.num_experts=4 model.n_layers=8 model.moe_every=1 train.data_zipf=1.5 \\
        inference.batches=30 --checkpoint results/checkpoints/lina_inference_e4.pt

1. Rank 0 trains the model for ``inference.train_steps`` steps on MarkovTokens (``train.data_zipf`` > 1
   skews token, hence expert, popularity; the skew comes from the model's own gate) or loads
   ``--checkpoint``, and sends the weights to every rank.
2. Rank 0 profiles the expert paths (top-``inference.top_k`` gate, path length ``inference.path_length``) on
   ``inference.profile_batches`` further batches and sends the profile to every rank.
3. ``inference.warmup_batches`` + ``inference.batches`` inference batches: every rank draws its own
batch, and every policy
   runs on the same tokens, in an order rotated per batch so that machine drift hits all alike.
   Each forward starts after a barrier; the MoE layers' phases are timed per rank, the worst rank
   kept per batch (moe_core.host.timing).
4. Rank 0 writes one record per policy (paper ``lina``, experiment ``inference``): per batch, the
   whole forward's time ``forward_ms`` (Lina Fig 16's inference time), the MoE layers' time
   ``moe_layer_ms`` (Fig 17) and the same normalised to the median of ``ideal``, per-phase times,
   each MoE layer's all-to-all time ``a2a_layer<i>_ms`` (Fig 18), load imbalance, nll (equal for
   every policy but ``ideal``: placement never changes the math); the profiled model's expert
   popularity ratio (Fig 6) and path top-k shares (Fig 9); and for Lina's policies the estimation
   accuracy and re-plan rate (overall and per layer) and the scheduler's host time per decision and
   per phase-2 check (§5.2).

Its settings are the config's ``inference`` keys (moe_core/papers/lina/config.py, InferenceConfig).
``inference.a2a_policy=aurora`` (or ``aurora-sjf``, ``aurora-rcs``) runs every token all-to-all as
Aurora's ordered point-to-point rounds instead of ``all_to_all_single``; the records then carry the
policy in their params and a ``_a2a-<policy>`` suffix in their point names.
Layout keys: ``parallel.world_size`` is the number of devices N; ``moe.experts_per_rank`` only has
to satisfy the config's layout check (the placement, not the training layout, decides where
experts run). ``parallel.timeout_s`` must exceed rank 0's time for HEARTBEAT_STEPS training steps.
"""

from __future__ import annotations

from moe_core.config.cli import config_arg_parser
from moe_core.host.processes import exit_process

# The config key of this entry point's world size: experiments.launch checks --nproc against it.
WORLD_SIZE_KEY = "parallel.world_size"
# What it reads of the config (named by --help).
CONFIG_KEYS = (
    "inference",
    "model",
    "moe",
    "train",
    "parallel",
    "hardware_profile",
    "results_dir",
    "sweep.name",
    "wandb",
)


def main(argv: list[str] | None = None) -> int:
    parser = config_arg_parser(__doc__, CONFIG_KEYS)
    parser.add_argument("--checkpoint", help="load trained weights from here, or train and save here")
    parser.add_argument("--out-dir", help="record directory (default: results/raw/lina/inference)")
    args = parser.parse_intermixed_args(argv)
    from experiments.impl.inference import run  # torch: once the command line is parsed

    return run(args, WORLD_SIZE_KEY)


if __name__ == "__main__":
    exit_process(main())
