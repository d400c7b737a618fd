"""The work of each entry point: ``experiments/<name>.py`` is its command line (the docstring, the
parser and ``main``), and its ``main`` imports ``experiments/impl/<name>.py`` only once the command
line is parsed, so ``--help`` and a bad option answer before torch, scipy or pandas are imported."""
