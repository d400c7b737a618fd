"""Running measured jobs: ``distributed`` (process-group start-up, failing ranks), ``profiling``
(kernel-level profiles of training steps). What they measure with lives below, in moe_core.host;
the entry points' shared skeleton is experiments/benchmark.py."""
