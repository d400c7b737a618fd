"""What every config section is built from: the error a user sees, the check helpers, and the
registry through which papers add their sections to the schema (moe_core.config.load assembles it).

A section is a dataclass of typed defaults (OmegaConf checks keys and types against it) plus a
``validate(cfg)`` function for what a type cannot express (ranges, names that must exist). Papers
register theirs from moe_core/papers/<paper>/config.py with :func:`register_section`; this module
imports nothing of the suite but moe_core.registry, so a paper's section can be imported anywhere
without a cycle.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from moe_core.registry import Registry

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "configs"
COLLECTIVE_CURVES_DIR = CONFIG_DIR / "collective_curves"  # measured collective efficiency curves
# Names that become path components (papers, sweep names): no separators, no shell metacharacters.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*\Z")  # \Z: "$" would let a final newline through


def layer_sets(layer, key: str) -> bool:
    """Whether a user's config layer (a file, the overrides) sets ``key``: a dotted key, or a
    section of it."""
    try:
        return isinstance(layer, DictConfig) and OmegaConf.select(layer, key, throw_on_missing=False) is not None
    except OmegaConfBaseException:
        return False


class ConfigError(ValueError):
    """A configuration a user wrote is wrong; the message says which key and how to fix it."""


# The key a ConfigError's message names first (:func:`require` writes "config key '<key>': ...").
ERROR_KEY = re.compile(r"^config key '([^']+)': ")


def require(ok: bool, key: str, message: str) -> None:
    """Raise ConfigError naming ``key`` with ``message`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"config key '{key}': {message}")


def require_at_least(section: DictConfig, prefix: str, minimum: int | float, keys: tuple[str, ...]) -> None:
    """Each of ``keys`` of ``section`` (full key ``prefix.key``) is a finite number >= ``minimum``."""
    for key in keys:
        value = section[key]
        require(math.isfinite(value) and value >= minimum, f"{prefix}.{key}", f"must be >= {minimum}, got {value}")


def require_positive(section: DictConfig, prefix: str, keys: tuple[str, ...]) -> None:
    """Each of ``keys`` of ``section`` (full key ``prefix.key``) is a finite number > 0 (rates,
    sizes, factors: inf or nan would overflow or poison every time computed from them)."""
    for key in keys:
        value = section[key]
        require(math.isfinite(value) and value > 0, f"{prefix}.{key}", f"must be a finite number > 0, got {value}")


def require_name(value: str, key: str) -> None:
    """``value`` is a plain name: it becomes a path component or a command-line word."""
    require(
        bool(SAFE_NAME.match(value)),
        key,
        f"{value!r} must be a plain name (letters, digits, '_', '-', '.', '+'; no '/', spaces or quotes)",
    )


MAX_SEED = 2**32 - 1  # numpy's and torch's seeds both take this range


def require_seed(value: int, key: str) -> None:
    """A random seed every generator of the suite accepts."""
    require(0 <= value <= MAX_SEED, key, f"must be a seed in [0, {MAX_SEED}], got {value}")


def hardware_profiles() -> list[str]:
    """The profile names configs/hardware/ holds."""
    return sorted(p.stem for p in (CONFIG_DIR / "hardware").glob("*.yaml"))


def require_profile(name: str, key: str) -> None:
    """``name`` is a profile of configs/hardware/."""
    known = hardware_profiles()
    require(name in known, key, f"'{name}' has no configs/hardware/{name}.yaml; allowed: {known}")


def require_model_profile(value: str, key: str) -> None:
    """``value`` names the profile a model prices measured points on: '' (the run's own), a profile
    of configs/hardware/ or an existing .yaml file (the workflow passes a testbed's calibrated one)."""
    is_yaml_file = value.endswith((".yaml", ".yml")) and Path(value).is_file()
    require(
        value in ("", *hardware_profiles()) or is_yaml_file,
        key,
        f"{value!r} is neither '' (the run's profile), a profile of {CONFIG_DIR.name}/hardware/ "
        "nor an existing .yaml file",
    )


def require_choices(values, allowed, key: str) -> None:
    """Every value of ``values`` is one of ``allowed``."""
    for value in values:
        require(value in allowed, key, f"invalid value '{value}', expected one of {sorted(allowed)}")


@dataclass(frozen=True)
class Section:
    """A top-level config section: its schema dataclass and its validation (given the whole config)."""

    name: str
    schema: type
    validate: Callable[[DictConfig], None]


SECTIONS: Registry[Section] = Registry("config section")
PAPER_NAMES: list[str] = []  # the values of the config key ``paper``, registered by moe_core.papers


def register_papers(names: tuple[str, ...]) -> None:
    """Make ``names`` the papers a config may name (``paper``, ``sim_sweep.paper``)."""
    PAPER_NAMES[:] = names


def register_section(name: str, schema: type, validate: Callable[[DictConfig], None]) -> None:
    """Add section ``name`` (a key of the config's root) to the schema."""
    SECTIONS.register(name, Section(name, schema, validate))
