"""Configs read and derived: YAML files and ``key=value`` overrides merged into checked layers, a
hardware profile read once, a config derived from a checked one (a point's, a paper's model), and a
config's content digest. Every failure raises :class:`ConfigError` naming the key or the file.
Imports no paper, so papers, run checks and the simulator derive configs with it without a cycle.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from moe_core.dispatch import AUTO, suits
from moe_core.model.capacity import expert_tensor_parallel
from moe_core.schema.aliases import expansion
from moe_core.schema.core import HardwareConfig
from moe_core.schema.sections import (
    CONFIG_DIR,
    SAFE_NAME,
    ConfigError,
    layer_sets,
    require,
    require_name,
)
from moe_core.schema.validation import validate, validate_hardware


@functools.cache
def hardware_profile(name: str) -> DictConfig:
    """The hardware profile ``name`` (configs/hardware/<name>.yaml, or a YAML path) as a checked,
    read-only section, as a config loaded on it holds it; read once per process: simulated studies
    price hundreds of points on a few profiles."""
    hardware = _merge([OmegaConf.structured(HardwareConfig), _load_hardware(name)])
    require_name(hardware.name, "hardware.name")
    validate_hardware(hardware)
    OmegaConf.set_readonly(hardware, True)
    return hardware


def derive_config(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """``cfg`` (a checked run's config) with ``overrides`` applied, checked as a config (a point's,
    a paper's model): what load_config(data=cfg, overrides=overrides) gives without the run's own
    checks, and without rebuilding the whole config (points are derived by the hundred at load).
    The run's dispatcher holds where it suits the derived layout (tokens shared over "tp" or not);
    elsewhere, unless ``overrides`` name one, the derived layout's default does.

    A run at a setting of a paper's unstated parameters (``unstated``: a sensitivity run's, or the
    testbed fitted to the paper's baseline) keeps that setting in every config derived from it: it is
    applied again after ``overrides``, so a point that loads another hardware profile does not reset
    a fitted link rate to the profile's."""
    layer = _dotlist(overrides)
    setting = layer.get("unstated", cfg.unstated)
    if setting:
        layer = _dotlist([*overrides, *setting.split(",")])
    profile = layer.get("hardware_profile", cfg.hardware_profile)
    derived = _merge([cfg, layer])  # one copy of cfg: merge copies its first layer
    OmegaConf.set_readonly(derived, False)
    if profile != cfg.hardware_profile:  # the new profile's section replaces the old one's entirely,
        # then the layer's own hardware keys apply to it; the schema class is cfg's own
        # (``python -m moe_core.config`` imports this module twice)
        section = _profile_section(OmegaConf.get_type(cfg.hardware), profile)
        derived.hardware = _merge([section, layer.get("hardware", {})])  # merge copies the cached section
    expanded = expansion(derived, [layer])
    if expanded is not None:
        derived = _merge([derived, expanded])
    split = expert_tensor_parallel(derived) > 1
    if not layer_sets(layer, "moe.dispatcher") and not suits(derived.moe.dispatcher, split):
        derived.moe.dispatcher = AUTO  # the run's is for the other kind of layout: the point's default
    OmegaConf.set_readonly(derived, True)
    validate(derived)
    return derived


@functools.cache
def _profile_section(schema: type, profile: str) -> DictConfig:
    """Profile ``profile`` merged onto the hardware schema ``schema``, unchecked: read once per
    process, since the points a run derives by the hundred switch between a few profiles."""
    return _merge([OmegaConf.structured(schema), _load_hardware(profile)])


def _dotlist(overrides: list[str]) -> DictConfig:
    """``key=value`` overrides as one layer; ConfigError naming a malformed one."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value (e.g. moe.num_experts=8)")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except (OmegaConfBaseException, yaml.YAMLError) as err:
        raise ConfigError(f"overrides {list(overrides)}: {str(err).splitlines()[0]}") from None


# What a config file may hold, checked before it is parsed into objects (_check_size_and_depth): the
# largest file of configs/ (a resolved config included) is under 10 KB and 4 levels deep, while parsing
# and merging are recursive pure Python at about 10 s per MB. Aliases are OmegaConf's to limit:
# OmegaConf.load refuses a document they expand past 10,000 nodes or 100 times the nodes written.
MAX_CONFIG_BYTES = 2**20
MAX_CONFIG_DEPTH = 32  # nested collections; OmegaConf's recursion overflows Python's stack at about 75
# libyaml's event parser where PyYAML has it (a C state machine: no recursion, whatever the nesting)
_YAML_EVENTS_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _check_size_and_depth(path: Path) -> None:
    """Raise ConfigError naming YAML file ``path`` if it is over MAX_CONFIG_BYTES or nests collections
    deeper than MAX_CONFIG_DEPTH. Reads its size, then its event stream, never building its objects:
    every reader that builds them (the YAML composer, OmegaConf) recurses per level, and a deep
    enough nesting overflows the stack (a segmentation fault in libyaml's composer)."""
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"config file '{path}' is {size / 2**20:.1f} MiB, over the {MAX_CONFIG_BYTES // 2**20} MiB a "
            f"config file may hold; pass the keys you set, not data"
        )
    depth = 0
    with open(path, "rb") as f:
        for event in yaml.parse(f, Loader=_YAML_EVENTS_LOADER):
            depth += isinstance(event, yaml.CollectionStartEvent) - isinstance(event, yaml.CollectionEndEvent)
            if depth > MAX_CONFIG_DEPTH:
                raise ConfigError(
                    f"config file '{path}' line {event.start_mark.line + 1}: nests lists and mappings deeper "
                    f"than {MAX_CONFIG_DEPTH} levels; a config is sections of keys, a few levels deep"
                )


def load_yaml(path: Path) -> DictConfig:
    """A YAML config file; ConfigError naming the file (and line) if it is missing, malformed or
    over the loader's limits: its size and nesting (checked first, _check_size_and_depth) and the
    values its aliases expand to (OmegaConf's own limits)."""
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist; pass an existing YAML file (see configs/)")
    try:
        _check_size_and_depth(path)
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"config file '{path}'{where}: not valid YAML ({problem})") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"config file '{path}': must hold a mapping of keys (e.g. 'moe: {{num_experts: 8}}')")
    return loaded


def _merge(layers: list) -> DictConfig:
    try:
        merged = OmegaConf.merge(*layers)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or getattr(err, "key", None) or _root_key(layers)
        msg = str(err).splitlines()[0]
        if isinstance(err, ConfigKeyError):
            parent = key.rsplit(".", 1)[0] if "." in str(key) else ""
            node = OmegaConf.select(layers[0], parent) if parent else layers[0]
            if isinstance(node, DictConfig):
                msg += f"; valid keys{' of ' + repr(parent) if parent else ''}: {sorted(node.keys())}"
        raise ConfigError(f"config key '{key}': {msg}") from None
    nested = _nested_in_scalar_list(merged)
    if nested:
        raise ConfigError(f"config key '{nested}': a list of values, not of lists or mappings")
    return merged


def _nested_in_scalar_list(node: DictConfig | ListConfig, key: str = "") -> str | None:
    """The first key under ``node`` whose schema types it as a list of values (``list[int]``) but that
    holds a list or a mapping: OmegaConf merges ``[[4]]`` into ``list[int]`` unchecked, and a check
    comparing its values with numbers then fails with a TypeError."""
    if node._is_none() or node._is_missing():
        return None
    if isinstance(node, ListConfig):
        children = [(f"{key}[{i}]", node._get_node(i)) for i in range(len(node))]
        if node._metadata.element_type in (int, float, str, bool) and any(
            isinstance(child, DictConfig | ListConfig) for _, child in children
        ):
            return key
    else:
        children = [(f"{key}.{k}" if key else str(k), node._get_node(k)) for k in node]
    for child_key, child in children:
        if isinstance(child, DictConfig | ListConfig):
            found = _nested_in_scalar_list(child, child_key)
            if found:
                return found
    return None


def _root_key(layers: list) -> str:
    """The root of a layer that is not a mapping of sections (e.g. ``sweep=[1, 2]``): its first key."""
    for layer in layers[1:]:
        if isinstance(layer, DictConfig):
            for key in layer:
                if not isinstance(layer[key], DictConfig) and isinstance(getattr(layers[0], key, None), DictConfig):
                    return str(key)
    return "?"


def _load_hardware(profile: str) -> DictConfig:
    """A profile name from configs/hardware/, or the path of a YAML file (e.g. a calibrated profile).
    A profile names itself (``name:``); one that does not, or names itself "", is named after its
    file: records of a cluster are filed under the profile's name, never under the schema's default."""
    path = Path(profile) if profile.endswith((".yaml", ".yml")) else CONFIG_DIR / "hardware" / f"{profile}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (CONFIG_DIR / "hardware").glob("*.yaml"))
        raise ConfigError(
            f"config key 'hardware_profile': '{profile}' is neither a YAML file nor a profile "
            f"in configs/hardware/; allowed: {known} or a path to a .yaml file"
        )
    layer = load_yaml(path)
    if not layer.get("name"):
        require(
            bool(SAFE_NAME.match(path.stem)),
            "hardware.name",
            f"profile '{path}' sets none and its file name {path.stem!r} is not a plain name; "
            f"add one to the profile (name: <letters, digits, '_', '-', '.', '+'>)",
        )
        layer.name = path.stem
    return layer


def config_digest(cfg: DictConfig) -> str:
    """A short name for ``cfg``'s content (what save_config writes): equal configs, equal digests. The
    W&B group is left out: it is named after this digest (:func:`run_group`), and a config reads the same
    whether its group was filled in or not."""
    content = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    content["wandb"]["group"] = ""
    return hashlib.sha256(json.dumps(content).encode()).hexdigest()[:12]


def run_group(cfg: DictConfig) -> str:
    """The W&B group of ``cfg``'s runs: its sweep, its digest and the hardware it runs on, e.g.
    ``default-1a2b3c4d5e6f@local-cpu``, so runs of another config or on other hardware never share one."""
    return f"{cfg.sweep.name}-{config_digest(cfg)}@{cfg.hardware.name}"


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)
