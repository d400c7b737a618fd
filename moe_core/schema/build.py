"""Building a config from its layers: the merge, the hardware profile, the aliases, the checks.

:func:`build_config` assembles the schema's root from the sections registered when it is called.
Entry points, the workflow and the tests call it through moe_core.config.load.load_config, which
imports every registering module first (the dispatcher study, then the papers, so the sections
keep their order, the resolved config's and its digest's). A paper's study that derives a config
from its run's (an already loaded one, so every section is registered) calls it here, without
climbing above the papers to the loader.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf, read_write

from moe_core.schema.aliases import expansion
from moe_core.schema.core import _root_schema
from moe_core.schema.derive import _dotlist, _load_hardware, _merge, load_yaml, run_group
from moe_core.schema.run_checks import check_run
from moe_core.schema.sections import ERROR_KEY, SECTIONS, ConfigError, layer_sets
from moe_core.schema.validation import validate

# The root dataclass per set of registered sections (building it takes a dataclass and a schema walk).
_ROOTS: dict[tuple[str, ...], type] = {}


def root_schema() -> type:
    """The root dataclass: run identity, the core's sections, then every section registered so far."""
    names = tuple(SECTIONS)
    if names not in _ROOTS:
        _ROOTS[names] = _root_schema()
    return _ROOTS[names]


def build_config(
    files: list[str | Path] = (), overrides: list[str] = (), data: dict | None = None, whole_run: bool = True
) -> DictConfig:
    """Build, validate and freeze a config: schema <- ``files`` <- ``data`` <- ``overrides``, the
    schema's root assembled from the sections registered so far (:func:`root_schema`).

    Raises ConfigError naming the key the user set for unknown keys, bad types or values, impossible
    layouts and missing or malformed files. With ``whole_run`` (every entry point, the launcher, the
    workflow) also what the run derives from the config: its override lists, every measured point and
    its size (moe_core.schema.run_checks); a config derived from a checked one (a point's) passes False.
    """
    saved_layers = [load_yaml(Path(path)) for path in files]
    if data:
        saved_layers.append(OmegaConf.create(data))
    user_layers = list(saved_layers)
    if overrides:
        user_layers.append(_dotlist(overrides))
    schema = OmegaConf.structured(root_schema())
    profile = _merge([schema, *user_layers]).hardware_profile
    # The profile sits between the schema and the user's layers, so `hardware.x=...` still wins;
    # a file's (or data's) hardware section that names another profile (e.g. a saved resolved config,
    # then hardware_profile=...) belongs to that profile and is dropped. Command-line overrides
    # always apply (e.g. the launcher's hardware.name=<profile>-loopback-fallback).
    for layer in saved_layers:
        name = OmegaConf.select(layer, "hardware.name") if isinstance(layer, DictConfig) else None
        if name is not None and name != profile:
            layer.pop("hardware")
    cfg = _merge([schema, {"hardware": _load_hardware(profile)}, *user_layers])
    try:
        expanded = expansion(cfg, user_layers)
    except ConfigError as err:
        raise _blame_set_key(err, user_layers) from None
    if expanded is not None:
        cfg = _merge([cfg, expanded])
    OmegaConf.set_readonly(cfg, True)
    try:
        validate(cfg)
        if whole_run:
            check_run(cfg)
    except ConfigError as err:
        raise _blame_set_key(err, user_layers) from None
    if not cfg.wandb.group:
        with read_write(cfg):
            cfg.wandb.group = run_group(cfg)
    return cfg


# Keys one check reads together (e.g. the layout: experts over ranks): when it fails, the message
# names the one the user set last, not the one the check happens to test (moe.num_experts=3 on 4
# ranks is a wrong expert count, not a wrong world size).
LINKED_KEYS = (
    ("moe.num_experts", "moe.experts_per_rank", "parallel.tensor_parallel", "parallel.grid", "parallel.world_size"),
)


def _blame_set_key(err: ConfigError, layers: list) -> ConfigError:
    """``err`` with its key replaced by a linked key (LINKED_KEYS) the latest layer sets, if that
    layer sets linked keys but not the one named."""
    match = ERROR_KEY.match(str(err))
    group = next((g for g in LINKED_KEYS if match and match[1] in g), None)
    if group is None:
        return err
    for layer in reversed(layers):
        set_keys = [key for key in group if layer_sets(layer, key)]
        if match[1] in set_keys:
            return err
        if set_keys:
            return ConfigError(f"config key '{set_keys[0]}': {str(err)[match.end() :]}")
    return err
