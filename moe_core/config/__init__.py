"""Configuration: the schema, its checks, and what a run derives from it.

``load`` (the loader: imports the papers' registry, assembles the schema's root, loads and saves;
``python -m moe_core.config`` checks a config), ``schema`` (the core's sections as dataclasses),
``validation`` (the checks a type cannot express), ``derive`` (reading, merging and deriving
configs), ``sections`` (the error type, the check helpers and the registries papers add their
config sections and names to), ``registry`` (the name -> object registries), ``points`` (sweep
points and their names), ``run_checks`` (what a whole run derives, checked before it starts),
``aliases`` (Megatron's names for two decisions, ``moe.dispatcher`` and ``parallel.expert_parallel``,
expanded into the keys the code reads), ``cli`` (the entry points' ``--config``/``key=value`` command
line, importable alone).
"""
