"""Keys that state a decision the way Megatron-Core users name it, expanded into the keys the code reads.

* ``moe.dispatcher`` (``--moe-token-dispatcher-type``): a registered token dispatcher
  (moe_core.dispatch) sets the keys a training step runs it by, its ``step_keys``: ``capacity`` and
  ``hierarchical`` the capacity all-to-all, flat or in two phases (``comm.a2a_algorithm``),
  ``dropless`` ``moe.dropless=true``, and with experts split over "tp" the tensor-parallel ones
  ``comm.tp_dispatch``. A dispatcher only the dispatcher study runs (``allgather``) is refused, and so
  is a tensor-parallel one without experts split over "tp", or the reverse.
* ``parallel.expert_parallel`` (``--expert-model-parallel-size``): ``moe.experts_per_rank =
  moe.num_experts / expert_parallel``.

The latest layer that states a decision wins, as with any key: an alias, or one of the keys it sets.
A layer that sets an alias and contradicts it in one of those keys is refused, naming both. A later
layer that sets such a key itself (a paper's model, ``moe.experts_per_rank=1``) clears the alias.
:func:`expansion` is the one place this happens, for a loaded config (moe_core.config.load) and a
derived one (moe_core.schema.derive) alike.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from moe_core.model.capacity import expert_tensor_parallel
from moe_core.schema.sections import ConfigError, layer_sets

UNSET = {"moe.dispatcher": "", "parallel.expert_parallel": 0}


def expansion(cfg: DictConfig, layers: list) -> DictConfig | None:
    """The keys ``cfg``'s aliases set, or the aliases cleared, as one layer to merge over ``cfg``
    (None: nothing to change). ``layers``: the layers merged into ``cfg`` after whatever it was
    built on, oldest first (a loaded config's user layers; a derived config's overrides)."""
    changes: dict = {}
    for alias, (keys_of, sets) in ALIASES.items():
        if OmegaConf.select(cfg, alias) == UNSET[alias]:
            continue
        stated = [layer for layer in layers if layer_sets(layer, alias) or any(layer_sets(layer, k) for k in keys_of())]
        latest = stated[-1] if stated else None
        if latest is not None and not layer_sets(latest, alias):
            changes[alias] = UNSET[alias]  # a later layer states the decision by its own keys
            continue
        keys = sets(cfg)
        for key, value in keys.items():
            given = OmegaConf.select(latest, key) if latest is not None else None
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


def _dispatcher_keys(cfg: DictConfig) -> dict:
    from moe_core.dispatch import DISPATCHERS

    name = cfg.moe.dispatcher
    if name not in DISPATCHERS:
        raise ConfigError(f"config key 'moe.dispatcher': unknown dispatcher {name!r}; allowed: {sorted(DISPATCHERS)}")
    chosen = DISPATCHERS[name]
    if chosen.step_keys is None:
        raise ConfigError(
            f"config key 'moe.dispatcher': {name!r} is timed by the dispatcher study (experiments/dispatchers.py), "
            "not run in a training step"
        )
    split = expert_tensor_parallel(cfg) > 1
    if chosen.tensor_parallel != split:
        wanted = "a tensor-parallel one" if split else "one whose ranks hold their own tokens"
        kinds = sorted(n for n, d in DISPATCHERS.items() if d.tensor_parallel == split and d.step_keys)
        raise ConfigError(
            f"config key 'moe.dispatcher': experts are {'' if split else 'not '}split over \"tp\" "
            f"(expert tensor parallel {expert_tensor_parallel(cfg)}), so the dispatcher must be {wanted}: {kinds}"
        )
    return dict(chosen.step_keys)


def _expert_parallel_keys(cfg: DictConfig) -> dict:
    ep, experts = cfg.parallel.expert_parallel, cfg.moe.num_experts
    if ep < 0 or experts % ep:
        raise ConfigError(
            f"config key 'parallel.expert_parallel': {ep} must divide moe.num_experts={experts} "
            "(whole experts per rank)"
        )
    return {"moe.experts_per_rank": experts // ep}


def _dispatcher_step_keys() -> set[str]:
    """Every key a registered dispatcher sets."""
    from moe_core.dispatch import DISPATCHERS

    return {key for d in DISPATCHERS.values() if d.step_keys for key in d.step_keys}


# alias -> (the keys it may set, the keys it sets in a config)
ALIASES = {
    "moe.dispatcher": (_dispatcher_step_keys, _dispatcher_keys),
    "parallel.expert_parallel": (lambda: {"moe.experts_per_rank"}, _expert_parallel_keys),
}
