"""Lina (ATC'23): its reproducers and figures (results/figures/lina/), a module per part of the paper.

Training: the all-to-all's share of the step and its slowdown under a concurrent all-reduce (Table 1,
Figs 2-4: contention, contention_figures), measured on this machine (gshard/train_step,
common/collectives) or simulated on Lina's testbed; Lina's policies' speedups (Figs 10-14: speedups,
speedup_figures) and micro-op size (Fig 15: partition_sweep, at the run's size: run_partition).
Inference: the placement policies' time and tail (Figs 16-18: inference, inference_figures) and the
single statistics of its runs (Figs 6, 9, §5.2: inference_statistics). testbed: what they share.
"""

# isort: off
# The order below is the order the figures are registered in, which the workflow's rules and the
# report list them in (analysis.registry).
from analysis.papers.lina import contention, contention_figures  # noqa: F401
from analysis.papers.lina import speedups, speedup_figures, partition_sweep  # noqa: F401
from analysis.papers.lina import inference, inference_statistics, inference_figures  # noqa: F401
# isort: on
