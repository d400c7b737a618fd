"""moe_core: a compact MoE/SPMD code base for measuring and simulating MoE communication.

The paper-neutral core, in floors: a module imports only from its own package and the floors
below it (tests/test_architecture.py checks that no import, a function's or a registration's,
climbs back up). One job per module; each package's docstring lists its modules. Bottom to top:

* ``registry``, ``units``: the name -> object registries every extension point is, byte units;
* ``host/``: what one host does and measures: phase timers, host noise, process facts, the
  emulated multi-node testbed, the time slicing of ranks that outnumber the cores;
* ``records/``: records written atomically, the step metrics both executors define, W&B, console tables;
* ``model/``: the MoE model (GShard gating, capacity, attention heads, experts, the MoE layer, a small
  decoder transformer, synthetic tokens);
* ``comm/``: the all-to-alls (differentiable, hierarchical, ordered point-to-point rounds), their
  transmission schedules and synthetic traffic matrices;
* ``parallel/``: named mesh axes and process groups, expert, tensor and 3D-grid parallelism applied
  from outside the model;
* ``dispatch/``: the token dispatchers, one class family (a training step's exchange, measured and
  simulated, the study's round trip, the bytes it moves), their registry, the policies' schedules
  of them, and the study's process groups;
* ``schedule/``: the communication plan both executors follow, a rank's gradient tensors, the
  policy registry, the measured executor;
* ``schema/``: the config's schema, its checks, sweep points, the registries papers add to;
* ``sim/``: the network and step simulator (topology, engine, collectives, compute, kernels: a
  step's compute ops priced, step, dag: a step's operations, timeline: its metrics, grid_ops,
  forward: an inference pass, calibrate, time_slicing: ranks waiting for each other's slices on a
  CPU host); it reads plans, never paper names;
* ``runtime/``: process-group start-up and failing ranks, kernel profiles;
* ``dispatch_study``: which dispatcher when, measured and simulated under routing skew;
* ``papers/<paper>/``: each paper's config section, decisions, measured policy, system model and
  study (gshard, lina, aurora, monta, axonn); importing ``moe_core.papers`` registers them;
* ``config/``: the loader, which imports every registering module and builds a config from them
  (``python -m moe_core.config`` checks a config), and the entry points' command line.

A package's ``__init__`` imports nothing, so importing one module never loads its neighbours.
"""
