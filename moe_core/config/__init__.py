"""The configuration as entry points, the workflow and the tests load it: the top of the core.

``load`` (:func:`~moe_core.config.load.load_config`: imports every module that registers a config
section, the dispatcher study first and then the papers, and builds the config from them; saves
resolved configs; ``python -m moe_core.config`` checks a config), ``cli`` (the entry points'
``--config``/``key=value`` command line, importable alone). The schema, its checks and what a run
derives from it live one floor below every paper, in moe_core.schema.
"""
