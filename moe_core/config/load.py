"""One structured configuration for every entry point, the workflow and the tests.

Merge order: schema defaults <- YAML files (in the order given) <- command-line ``key=value``
overrides. The schema is the single source of truth: the core's sections (moe_core.schema.core) plus the
sections papers register (moe_core.schema.sections, from moe_core/papers/<paper>/config.py); this module
imports the papers' registry first, then assembles the root from both. OmegaConf checks every
key and type against it, and :func:`validate` (moe_core.schema.validation) adds the checks a type
cannot express (ranges, layouts, names that must exist), then moe_core.schema.run_checks what the
run derives from the config (its override lists, points and sizes). Every failure raises
:class:`ConfigError` whose message names the key the user set, what was wrong and what is allowed,
before any process is started.

The hardware profile is loaded from ``configs/hardware/<hardware_profile>.yaml`` into
``cfg.hardware``. Check a config without running anything (Snakemake parses its own
``--configfile`` before the workflow and names no line of a malformed file; this does):

    python -m moe_core.config --config configs/default.yaml --config my.yaml [key=value ...]
"""

from __future__ import annotations

import sys
from contextlib import suppress
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

import moe_core.dispatch_study  # noqa: F401  (its section first: the sections' order is the resolved config's and its digest's)
from moe_core import papers  # noqa: F401  (the registry: every paper registers its config section, policies and orders)
from moe_core.config.cli import config_arg_parser
from moe_core.schema.build import build_config
from moe_core.schema.core import CommConfig, HardwareConfig  # noqa: F401
from moe_core.schema.derive import (  # noqa: F401  (the names every entry point imports from here)
    MAX_CONFIG_BYTES,
    _dotlist,
    _load_hardware,
    _merge,
    config_digest,
    derive_config,
    hardware_profile,
    load_yaml,
    to_container,
)
from moe_core.schema.sections import CONFIG_DIR, ERROR_KEY, REPO_ROOT, ConfigError, layer_sets  # noqa: F401  (re-exported)
from moe_core.schema.validation import (  # noqa: F401
    COMPUTE_PHASES,
    micro_batch_config,
    pipeline_chunk_blocks,
    validate,
    validate_measured,
)


def load_config(
    files: list[str | Path] = (), overrides: list[str] = (), data: dict | None = None, whole_run: bool = True
) -> DictConfig:
    """Build, validate and freeze a config: schema <- ``files`` <- ``data`` <- ``overrides``, every
    section registered (this module imports the registering modules first).

    Raises ConfigError naming the key the user set for unknown keys, bad types or values, impossible
    layouts and missing or malformed files. With ``whole_run`` (every entry point, the launcher, the
    workflow) also what the run derives from the config: its override lists, every measured point and
    its size (moe_core.schema.run_checks); a config derived from a checked one (a point's) passes False.
    """
    return build_config(files, overrides, data, whole_run)


def save_config(cfg: DictConfig, path: str | Path) -> bool:
    """Write the resolved config as YAML (entry points load it back with ``--config``), unless
    ``path`` already holds exactly that; returns whether it wrote. So the file changes, and its
    modification time moves, only when the config does: what was made from an older config is
    older than the file, which is how the workflow knows to redo it."""
    path = Path(path)
    text = OmegaConf.to_yaml(cfg, resolve=True)
    if path.exists() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomic: a reader never sees half a config
    return True


def refuse_templates(paths: list[str | Path]) -> None:
    """Raise ConfigError for a config file that is a YTE template (``__use_yte__: true``): Snakemake
    runs its Python when it reads the file, so config files are trusted code, and this suite takes
    plain YAML only (a template's output can differ between the workflow and its jobs)."""
    for path in paths or ():
        with suppress(OSError), open(path) as f:
            if any(line.split("#")[0].strip().startswith("__use_yte__") for line in f):
                raise ConfigError(
                    f"config file {path} is a YTE template (__use_yte__), which Snakemake has already "
                    f"evaluated as Python; config files must be plain YAML: render it yourself and pass the result"
                )


def main(argv: list[str] | None = None) -> int:
    """Validate a config (files and overrides as every entry point takes them); exit 2 on an error.
    ``--print`` writes the resolved config as YAML (``--print SECTION``: that section only)."""
    parser = config_arg_parser(__doc__)
    parser.prog = "python -m moe_core.config"
    parser.add_argument(
        "--print",
        nargs="?",
        const="",
        metavar="SECTION",
        dest="section",
        help="print the resolved config as YAML (or one section of it, e.g. hardware or moe)",
    )
    args = parser.parse_intermixed_args(argv)
    if args.section and "=" in args.section:  # ``--print key=value``: an override, not a section
        args.overrides.insert(0, args.section)
        args.section = ""
    try:
        cfg = load_config(args.config, args.overrides)
        if args.section and args.section not in cfg:
            raise ConfigError(f"--print {args.section}: no such section; sections: {', '.join(cfg)}")
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.section is not None:
        print(OmegaConf.to_yaml(cfg[args.section] if args.section else cfg), end="")
        return 0
    print(f"valid: paper {cfg.paper}, hardware {cfg.hardware.name}, policy {cfg.comm.policy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
