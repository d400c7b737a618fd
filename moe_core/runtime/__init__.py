"""Running measured jobs: ``distributed`` (process-group start-up, failing ranks), ``benchmark``
(the measured microbenchmarks' skeleton), ``profiling`` (kernel-level profiles of training steps).
What they measure with lives below, in moe_core.host."""
