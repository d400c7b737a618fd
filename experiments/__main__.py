"""The runner of every entry point: ``python -m experiments NAME [ARGS]...``.

    python -m experiments --help                       # the entry points, one line each
    python -m experiments simulate --help              # one entry point's command line
    torchrun --standalone --nproc-per-node=4 -m experiments train_step --config configs/default.yaml

NAME's line in experiments.entry_points builds its parser; the description is the first paragraph
of the work module's docstring, read from its source, not imported. Only once the command line is
parsed (and checked) is the module imported and its ``run`` called, so ``--help`` and a bad option
answer in a fraction of a second, before torch, scipy or pandas are imported. The process ends
through moe_core.host.processes.exit_process with what ``run`` returned; an unknown NAME exits 2
naming the entry points.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import sys
import textwrap
from pathlib import Path

from experiments.entry_points import ENTRY_POINTS, EntryPoint
from moe_core.config.cli import config_arg_parser
from moe_core.host.processes import exit_process

PROG = "python -m experiments"
HERE = Path(__file__).resolve().parent  # experiments/: each entry point NAME is its module NAME.py


def docstring(name: str) -> str:
    """The docstring of entry point ``name``'s module, read from its source without importing it."""
    return ast.get_docstring(ast.parse((HERE / f"{name}.py").read_text())) or ""


def first_paragraph(text: str) -> str:
    return text.split("\n\n")[0]


def entry_parser(entry: EntryPoint) -> argparse.ArgumentParser:
    """``entry``'s parser: the config's command line and the keys it reads, or one of its own; then
    its options."""
    doc = docstring(entry.name)
    if entry.config_keys is None:
        parser = argparse.ArgumentParser(description=first_paragraph(doc))
    else:
        parser = config_arg_parser(doc, entry.config_keys)
    parser.prog = f"{PROG} {entry.name}"
    if entry.options:
        entry.options(parser)
    return parser


def parse_entry_args(entry: EntryPoint, argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed and checked as ``entry``'s command line: exit 0 after ``--help``, 2 on a bad
    option. The config's ``key=value`` overrides may come between the options."""
    parser = entry_parser(entry)
    args = parser.parse_args(argv) if entry.config_keys is None else parser.parse_intermixed_args(argv)
    if entry.check:
        entry.check(parser, args)
    return args


def runner_parser() -> argparse.ArgumentParser:
    """The runner's own help: its usage and every entry point with its docstring's first paragraph."""
    lines = []
    for name in ENTRY_POINTS:
        summary = " ".join(first_paragraph(docstring(name)).split())
        lines += textwrap.wrap(summary, 100, initial_indent=f"  {name:<24}", subsequent_indent=" " * 26)
    return argparse.ArgumentParser(
        prog=PROG,
        usage="%(prog)s NAME [ARGS]...  (NAME --help: its command line)",
        description=first_paragraph(__doc__),
        epilog="entry points:\n" + "\n".join(lines),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: list[str] | None = None) -> int | None:
    """Run the entry point ``argv`` names with the rest of ``argv``; what its ``run`` returns."""
    argv = sys.argv[1:] if argv is None else argv
    name = argv[0] if argv else None
    if name in ("-h", "--help"):
        runner_parser().print_help()
        return 0
    if name not in ENTRY_POINTS:
        what = f"unknown entry point '{name}'" if name else "no entry point named"
        runner_parser().error(f"{what}; the entry points: {', '.join(ENTRY_POINTS)}")
    entry = ENTRY_POINTS[name]
    args = parse_entry_args(entry, argv[1:])
    module = importlib.import_module(f"experiments.{name}")  # torch, scipy, pandas: once parsed
    if entry.world_size_key:
        return module.run(args, entry.world_size_key)
    return module.run(args)


if __name__ == "__main__":
    exit_process(main())
