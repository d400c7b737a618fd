"""The work of each entry point: ``python -m experiments NAME`` (experiments/__main__.py) parses NAME's
command line by its line in experiments/entry_points.py, then imports ``experiments/impl/NAME.py``
and calls its ``run``, so ``--help`` and a bad option answer before torch, scipy or pandas are
imported."""
