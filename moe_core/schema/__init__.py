"""The configuration's schema and rules, above the mechanisms it checks and below the simulator,
the studies and the papers that read it.

``core`` (the core's sections as dataclasses), ``sections`` (the error type, the check helpers and
the registries papers add their config sections and names to), ``derive`` (reading, merging and
deriving configs), ``validation`` (the checks a type cannot express), ``points`` (sweep points and
their names), ``run_checks`` (what a whole run derives, checked before it starts), ``aliases``
(Megatron's names for two decisions, ``moe.dispatcher`` and ``parallel.expert_parallel``, expanded
into the keys the code reads), ``build`` (a config from its layers, from the sections registered so
far; moe_core.config.load registers them all first).
"""
