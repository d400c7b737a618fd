"""Keys that state a decision another way than the keys the code reads, expanded into those keys.

* ``parallel.expert_parallel`` (Megatron's ``--expert-model-parallel-size``): ``moe.experts_per_rank =
  moe.num_experts / expert_parallel``.
* Retired keys, each now a value of ``moe.dispatcher`` (the token dispatcher a step runs,
  moe_core.dispatch): ``moe.dropless=true`` is ``moe.dispatcher=dropless``;
  ``comm.a2a_algorithm=hierarchical`` is ``moe.dispatcher=hierarchical`` (``flat``: the default);
  ``comm.tp_dispatch=NAME`` is ``moe.dispatcher=NAME`` where experts are split over "tp" (without it,
  the key never applied). A config that sets one still loads, with a warning that says what to write
  instead; the retired key is then cleared, so a resolved config states the dispatcher once.

The latest layer that states a decision wins, as with any key: an alias, or one of the keys it sets.
A layer that sets an alias and contradicts it in one of those keys is refused, naming both. A later
layer that sets such a key itself (a paper's model, ``moe.experts_per_rank=1``) clears the alias.
:func:`expansion` is the one place this happens, for a loaded config (moe_core.config.load) and a
derived one (moe_core.schema.derive) alike.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf

from moe_core.model.capacity import expert_tensor_parallel
from moe_core.schema.sections import ConfigError, layer_sets

DISPATCHER = "moe.dispatcher"


def expansion(cfg: DictConfig, layers: list) -> DictConfig | None:
    """The keys ``cfg``'s aliases set, or the aliases cleared, as one layer to merge over ``cfg``
    (None: nothing to change). ``layers``: the layers merged into ``cfg`` after whatever it was
    built on, oldest first (a loaded config's user layers; a derived config's overrides)."""
    changes: dict = {}
    for alias, (unset, keys_of, sets) in ALIASES.items():
        if OmegaConf.select(cfg, alias) == unset:
            continue
        stated = [layer for layer in layers if layer_sets(layer, alias) or any(layer_sets(layer, k) for k in keys_of)]
        latest = stated[-1] if stated else None
        if latest is not None and not layer_sets(latest, alias):
            changes[alias] = unset  # a later layer states the decision by its own keys
            continue
        keys = sets(cfg)
        for key, value in keys.items():
            given = OmegaConf.select(latest, key) if latest is not None and key != alias else None
            if given is not None and given != value:
                raise ConfigError(
                    f"config key '{alias}': {alias}={OmegaConf.select(cfg, alias)} sets {key}={value}, "
                    f"but {key}={given} is set beside it; set one of them"
                )
        changes.update(keys)
    if not changes:
        return None
    layer = OmegaConf.create()
    for key, value in changes.items():
        OmegaConf.update(layer, key, value)
    return layer


def _expert_parallel_keys(cfg: DictConfig) -> dict:
    ep, experts = cfg.parallel.expert_parallel, cfg.moe.num_experts
    if ep < 0 or experts % ep:
        raise ConfigError(
            f"config key 'parallel.expert_parallel': {ep} must divide moe.num_experts={experts} "
            "(whole experts per rank)"
        )
    return {"moe.experts_per_rank": experts // ep}


def _retired(key: str, unset, dispatcher_for: Callable[[DictConfig, object], str | None]):
    """A retired key's entry: it sets ``moe.dispatcher`` to ``dispatcher_for(cfg, value)`` (None:
    leaves it as it is), clears itself, and warns naming what to write instead."""

    def sets(cfg: DictConfig) -> dict:
        value = OmegaConf.select(cfg, key)
        name = dispatcher_for(cfg, value)
        instead = (
            f"{DISPATCHER}={name}" if name is not None else f"nothing (it does not apply here; {DISPATCHER} decides)"
        )
        warnings.warn(
            f"config key '{key}' is retired: write {instead} instead of {key}={value}", FutureWarning, stacklevel=2
        )
        return {key: unset, **({DISPATCHER: name} if name is not None else {})}

    return unset, {DISPATCHER}, sets


def _from_dropless(cfg: DictConfig, value) -> str | None:
    if value:
        return "dropless"
    return "auto" if cfg.moe.dispatcher == "dropless" else None


def _from_a2a_algorithm(cfg: DictConfig, value) -> str | None:
    if value not in ("flat", "hierarchical"):
        raise ConfigError(f"config key 'comm.a2a_algorithm': invalid value {value!r}; write {DISPATCHER} instead")
    if value == "hierarchical":
        return "hierarchical"
    return "auto" if cfg.moe.dispatcher == "hierarchical" else None


def _from_tp_dispatch(cfg: DictConfig, value) -> str | None:
    return value if expert_tensor_parallel(cfg) > 1 else None


# alias -> (its unset value, the keys it may set, the keys it sets in a config)
ALIASES = {
    "parallel.expert_parallel": (0, {"moe.experts_per_rank"}, _expert_parallel_keys),
    "moe.dropless": _retired("moe.dropless", None, _from_dropless),
    "comm.a2a_algorithm": _retired("comm.a2a_algorithm", "", _from_a2a_algorithm),
    "comm.tp_dispatch": _retired("comm.tp_dispatch", "", _from_tp_dispatch),
}
