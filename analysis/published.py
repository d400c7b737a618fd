"""The registry of published numbers (published.yaml): load it and check every entry.

A bad entry fails loudly here, naming the entry and the key, rather than turning into a silently wrong
comparison row later.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

import yaml

REGISTRY_PATH = Path(__file__).with_name("published.yaml")
STATUSES = ("FT", "ABS", "CODE", "DER", "UNC")  # confirmation tags of shared/reference/papers.md
REQUIRED_KEYS = ("id", "paper", "figure", "metric", "setting", "value", "unit", "source", "status", "reproducer")
DEFAULTS = {"tolerance": 0.25}


class RegistryError(ValueError):
    """published.yaml (or another registry file) has a bad entry."""


def load_registry(path: str | Path = REGISTRY_PATH) -> dict[str, dict[str, Any]]:
    """Entries keyed by id, in file order, with defaults filled in."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as err:
        raise RegistryError(f"{path}: cannot read the registry ({err})") from err
    entries = data.get("numbers") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise RegistryError(f"{path}: expected a top-level 'numbers:' list of entries")
    registry: dict[str, dict[str, Any]] = {}
    for i, entry in enumerate(entries, start=1):
        entry = _checked(entry, f"{path}: entry #{i}")
        if entry["id"] in registry:
            raise RegistryError(f"{path}: entry #{i}: duplicate id {entry['id']!r}; ids must be unique")
        registry[entry["id"]] = entry
    return registry


def _checked(entry: Any, where: str) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise RegistryError(f"{where} is not a mapping of key: value")
    if entry.get("id"):
        where = f"{where} ({entry['id']!r})"
    for key in REQUIRED_KEYS:
        if key not in entry:
            raise RegistryError(f"{where}: missing key {key!r}; every entry needs {list(REQUIRED_KEYS)}")
    for key in entry:
        if key not in REQUIRED_KEYS and key not in DEFAULTS:
            raise RegistryError(f"{where}: unknown key {key!r}; allowed: {[*REQUIRED_KEYS, *DEFAULTS]}")
    entry = {**DEFAULTS, **entry}
    if entry["status"] not in STATUSES:
        raise RegistryError(f"{where}: key 'status' is {entry['status']!r}; use one of {list(STATUSES)}")
    for key in ("value", "tolerance"):
        if not isinstance(entry[key], numbers.Real) or isinstance(entry[key], bool) or entry[key] <= 0:
            raise RegistryError(f"{where}: key {key!r} is {entry[key]!r}; it must be a positive number")
    if entry["reproducer"] is not None and not (isinstance(entry["reproducer"], str) and entry["reproducer"]):
        raise RegistryError(f"{where}: key 'reproducer' must name a reproducer of analysis/papers/, or be null")
    return entry


def published_value(registry: dict[str, dict[str, Any]], entry_id: str) -> float:
    """The published value of entry ``entry_id``."""
    if entry_id not in registry:
        raise RegistryError(f"the registry has no entry {entry_id!r}; restore it in analysis/published.yaml")
    return float(registry[entry_id]["value"])
