"""The registry of published numbers (published.yaml): load it and check every entry.

A bad entry fails loudly here, naming the entry and the key, rather than turning into a silently wrong
comparison row later. Every entry leaves here with its ``testbed``: the hardware profiles that are the
paper's setting (the entry's own key, else the file's ``testbeds`` for its paper), so that
analysis.compare judges a number only where it was reproduced like for like.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

import yaml

REGISTRY_PATH = Path(__file__).with_name("published.yaml")
STATUSES = ("FT", "ABS", "CODE", "DER", "UNC")  # confirmation tags of shared/reference/papers.md
REQUIRED_KEYS = (
    "id",
    "paper",
    "figure",
    "metric",
    "setting",
    "value",
    "unit",
    "source",
    "status",
    "role",
    "role_evidence",
    "reproducer",
)
DEFAULTS = {"tolerance": 0.25, "testbed": None, "bound": None, "not_comparable": None, "across_testbeds": False}
BOUNDS = ("lower", "upper")  # the published value is a bound ("> 1.83x", ">= 16%"), not a point
# What a number is to the verdict (analysis.fit): a ``baseline`` measures the compared-against system or
# the testbed and is what the testbed fit reproduces; a ``claim`` is a gain of the paper's mechanism,
# predicted at the fit and never fitted to.
BASELINE, CLAIM = "baseline", "claim"
ROLES = (BASELINE, CLAIM)


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
    testbeds = data.get("testbeds") or {}
    if not isinstance(testbeds, dict):
        raise RegistryError(f"{path}: 'testbeds:' must map each paper to its hardware profiles")
    registry: dict[str, dict[str, Any]] = {}
    for i, entry in enumerate(entries, start=1):
        entry = _checked(entry, f"{path}: entry #{i}", testbeds)
        if entry["id"] in registry:
            raise RegistryError(f"{path}: entry #{i}: duplicate id {entry['id']!r}; ids must be unique")
        registry[entry["id"]] = entry
    return registry


def _checked(entry: Any, where: str, testbeds: dict[str, Any]) -> dict[str, Any]:
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
    if entry["role"] not in ROLES:
        raise RegistryError(f"{where}: key 'role' is {entry['role']!r}; use one of {list(ROLES)}")
    if not _is_text(entry["role_evidence"]):
        raise RegistryError(f"{where}: key 'role_evidence' must say why the number is a {entry['role']}")
    for key in ("value", "tolerance"):
        if not isinstance(entry[key], numbers.Real) or isinstance(entry[key], bool) or entry[key] <= 0:
            raise RegistryError(f"{where}: key {key!r} is {entry[key]!r}; it must be a positive number")
    if entry["reproducer"] is not None and not _is_text(entry["reproducer"]):
        raise RegistryError(f"{where}: key 'reproducer' must name a reproducer of analysis/papers/, or be null")
    if not isinstance(entry["across_testbeds"], bool):
        raise RegistryError(f"{where}: key 'across_testbeds' must be true or false")
    if entry["bound"] not in (None, *BOUNDS):
        raise RegistryError(f"{where}: key 'bound' is {entry['bound']!r}; use one of {list(BOUNDS)} or leave it out")
    if entry["not_comparable"] is not None and not _is_text(entry["not_comparable"]):
        raise RegistryError(f"{where}: key 'not_comparable' must say why no run of the suite is like for like")
    entry["testbed"] = entry["testbed"] or testbeds.get(entry["paper"])
    if not (isinstance(entry["testbed"], list) and entry["testbed"] and all(map(_is_text, entry["testbed"]))):
        raise RegistryError(
            f"{where}: no testbed; give the paper's hardware profiles as 'testbeds: {{{entry['paper']}: [...]}}' "
            f"at the top of the file, or as the entry's key 'testbed'"
        )
    return entry


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def published_value(registry: dict[str, dict[str, Any]], entry_id: str) -> float:
    """The published value of entry ``entry_id``."""
    if entry_id not in registry:
        raise RegistryError(f"the registry has no entry {entry_id!r}; restore it in analysis/published.yaml")
    return float(registry[entry_id]["value"])
