"""moe_core: a compact MoE/SPMD code base for measuring and simulating MoE communication.

The paper-neutral core, grouped by role; one job per module (each package's docstring lists its
modules):

* ``config/``: the schema, its checks and loading, sweep points, the registries papers add to
  (``python -m moe_core.config`` checks a config);
* ``model/``: the MoE model (GShard gating, capacity, experts, the MoE layer, a small decoder
  transformer, synthetic tokens);
* ``parallel/``: named mesh axes and process groups, expert, tensor and 3D-grid parallelism applied
  from outside the model;
* ``comm/``: the all-to-alls (differentiable, hierarchical, ordered point-to-point rounds), their
  transmission schedules and traffic matrices;
* ``dispatch/``: the token dispatchers, one class per exchange, their registry, a training step's
  exchange and the dispatcher study;
* ``schedule/``: the communication plan both executors follow, the policy registry, the measured
  executor;
* ``runtime/``: process-group start-up and failing ranks, phase timers, host noise, the
  microbenchmark skeleton, kernel profiles, the emulated multi-node testbed, the host's time
  slicing of ranks that outnumber its cores;
* ``records/``: records and their schema, the step metrics both executors define, W&B, units;
* ``sim/``: the network and step simulator (topology, engine, collectives, compute, kernels: a
  step's compute ops priced, step, dag: a step's operations, timeline: its metrics, grid_ops,
  forward: an inference pass, calibrate, time_slicing: ranks waiting for each other's slices on a
  CPU host); it reads plans, never paper names.

``papers/<paper>/`` holds each paper's config section, decisions, measured policy and system model
(gshard, lina, aurora, monta, axonn); importing ``moe_core.papers`` registers them with the core.
A package's ``__init__`` imports nothing, so importing one module never loads its neighbours.
"""
