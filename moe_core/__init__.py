"""moe_core: a compact MoE/SPMD code base for measuring and simulating MoE communication.

Modules, one job each: ``config`` (schema and validation), ``gating`` (GShard routing),
``experts``, ``layer`` (the MoE layer), ``model`` (a small decoder transformer), ``data``
(synthetic learnable tokens), ``parallel`` (data x expert mesh), ``comm`` (differentiable
all-to-all), ``policies`` (when and how collectives run), ``timing``, ``results`` (records),
``tracking`` (W&B), ``workloads`` (traffic matrices), ``distributed`` (process-group start-up).
"""
