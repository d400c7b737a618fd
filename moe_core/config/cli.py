"""The command line every config-driven entry point shares: ``[--config FILE]... [key=value]...``.

Imports nothing but argparse: an entry point builds its parser and answers ``--help`` before the
schema, the papers or torch are imported (experiments/README.md, "Entry points"), so the help names
the config keys an entry point reads as plain strings, checked against the schema by the tests.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

PRINT_COMMAND = "python -m moe_core.config --config FILE ... --print SECTION"


def config_arg_parser(doc: str, reads: Sequence[str] = ()) -> argparse.ArgumentParser:
    """A parser with ``doc``'s first paragraph as its description, ``--config`` and ``key=value``
    overrides; its help names ``reads``, the config sections and keys the entry point reads."""
    epilog = "config: schema defaults <- each --config file in order <- key=value overrides"
    if reads:
        epilog += f"\nreads: {', '.join(reads)}\nthe keys and values of a section: {PRINT_COMMAND}"
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", action="append", default=[], metavar="FILE", help="YAML config file (repeatable)")
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides, e.g. moe.num_experts=8 comm.policy=overlap"
    )
    return parser
