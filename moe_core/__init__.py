"""moe_core: a compact MoE/SPMD code base for measuring and simulating MoE communication.

The paper-neutral core, one job per module:

* configuration: ``config`` (the loader: imports the papers' registry, assembles the schema's root,
  loads and saves), ``schema`` (the core's sections as dataclasses), ``validation`` (the checks a
  type cannot express), ``derive`` (reading, merging and deriving configs; these three import no paper),
  ``sections`` (the error type, the check helpers and the registries papers add their config
  sections and names to), ``points`` (sweep points and their names);
* the MoE model: ``gating`` (GShard routing by sorting), ``capacity`` (buffer sizes, no torch),
  ``experts``, ``layer`` (the MoE layer),
  ``model`` (a small decoder transformer), ``data`` (synthetic learnable tokens);
* parallelism and communication: ``layout`` (named mesh axes), ``parallel`` (DeviceMesh, process
  groups, expert and tensor sharding), ``tensor_parallel`` (Megatron's column/row-parallel split of
  the dense layers and experts), ``grid`` (3D tensor parallelism on a data x depth x row x col grid:
  each linear's split and its collectives; no torch), ``grid_parallel`` (the grid's linear layers,
  their collectives and overlaps), ``comm`` (differentiable, pipelined, ordered and tensor-parallel
  drop/all-gather all-to-alls), ``hierarchical_a2a`` (the two-phase all-to-all),
  ``transmission`` (all-to-all transmission schedules and their time models), ``ordered_a2a``
  (a schedule run as point-to-point rounds), ``plan`` (the communication plan both executors
  follow), ``policies`` (the policy registry and the baselines' decisions; no torch), ``dispatch/``
  (the token dispatchers, one class per exchange, and their registry; ``dispatch/step``: a training
  step's exchange, the plan's ``exchange``, run measured and simulated by the same object), ``executor`` (the measured
  executor of a plan);
* running and recording: ``distributed`` (process-group start-up, failing ranks), ``processes``
  (exit codes and /proc facts the launcher shares with the ranks), ``timing`` (phase timers),
  ``step_metrics`` (the step's terms, one definition for both executors), ``units`` (byte units),
  ``results`` (records), ``benchmark`` (the measured microbenchmarks' skeleton), ``tracking``
  (W&B), ``testbed`` (an emulated multi-node cluster), ``workloads`` (traffic matrices),
  ``dispatch_study`` (which dispatcher when: skewed routing and its section);
* ``sim/``: the network and step simulator (topology, engine, collectives, compute, kernels: a
  step's compute ops priced, step, dag: a step's operations, timeline: its metrics, grid_ops,
  forward: an inference pass, calibrate); it reads plans, never paper names.

``papers/<paper>/`` holds each paper's config section, decisions, measured policy and system model
(gshard, lina, aurora, monta, axonn); importing ``moe_core.papers`` registers them with the core.
"""
