"""The suite's entry points, one module each, run by one runner: ``python -m experiments NAME``
(experiments/__main__.py, their registry experiments/entry_points.py); their shared skeleton
(benchmark), the launcher (launch, rank_watch) and the workflow's rules (rules/).

An entry point's module defines its work and runs nothing itself, so ``python -m experiments.NAME``
(the spelling before the runner, also under ``torchrun -m``) would exit 0 having done nothing: it
exits 2 here instead, naming the runner's spelling.
"""

import sys

from experiments.entry_points import ENTRY_POINTS


def _refuse_an_entry_module_run_as_main() -> None:
    argv = sys.orig_argv
    module = next((argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "-m"), "")
    name = module.removeprefix("experiments.")
    if module.startswith("experiments.") and name in ENTRY_POINTS:
        runner = f"python -m experiments {name}"
        print(f"error: `-m {module}` runs nothing; run the entry point as `{runner}`", file=sys.stderr)
        sys.exit(2)


_refuse_an_entry_module_run_as_main()
