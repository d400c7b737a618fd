"""The token dispatchers: every way an MoE layer's tokens reach their experts' ranks, by name.

One class per exchange (moe_core.dispatch.base.Dispatcher), registered here or from a paper's
folder (MoNTA's pipelined drop-gather). The registry is what the rest enumerates: ``moe.dispatcher``'s
values (:func:`configured`: the one a training step runs, measured and simulated), the dispatcher
study's measured and simulated paths (moe_core.dispatch_study), ``advise``'s ranking, and the
figures' colours (analysis.style, by registry order). A new exchange is a class and one
:func:`register_dispatcher` line; the process groups its study round trip needs are named in
moe_core.dispatch.groups.
"""

from __future__ import annotations

from moe_core.dispatch.base import Dispatcher, StudyGroups
from moe_core.dispatch.direct_sends import DirectSends
from moe_core.dispatch.exchanges import AllGather, Capacity, Dropless, Hierarchical
from moe_core.dispatch.node_forwarding import NodeForwarding
from moe_core.dispatch.tensor_parallel import DropGather, Duplicate
from moe_core.model.capacity import expert_tensor_parallel
from moe_core.registry import Registry

DISPATCHERS: Registry[Dispatcher] = Registry("token dispatcher")

# ``moe.dispatcher``'s default: DeepSpeed's choice for the layout (drop the "tp" duplicates and
# all-gather them where experts are split over "tp", else the capacity all-to-all)
AUTO = "auto"


def register_dispatcher(dispatcher: Dispatcher) -> Dispatcher:
    return DISPATCHERS.register(dispatcher.name, dispatcher)


def dispatcher(name: str) -> Dispatcher:
    return DISPATCHERS.lookup(name)


def configured_name(cfg) -> str:
    """The registered dispatcher ``moe.dispatcher`` names for ``cfg`` (``auto`` resolved)."""
    if cfg.moe.dispatcher != AUTO:
        return cfg.moe.dispatcher
    return "drop-gather" if expert_tensor_parallel(cfg) > 1 else "capacity"


def configured(cfg) -> Dispatcher:
    """The dispatcher a training step of ``cfg`` runs, as it runs it (its chunk count decided)."""
    return dispatcher(configured_name(cfg)).for_step(cfg)


def routes_dropless(cfg) -> bool:
    """Whether a training step of ``cfg`` routes its tokens without capacity: its dispatcher drops
    none (the model's MoE layers take this, moe_core.model.transformer.MoETransformer)."""
    return not configured(cfg).drops


def suits(name: str, split: bool) -> bool:
    """Whether ``moe.dispatcher=name`` is for a layout whose experts are ``split`` over "tp" (``auto``
    and unknown names are: the one resolves per layout, the other is refused by name)."""
    return name == AUTO or name not in DISPATCHERS or DISPATCHERS[name].tensor_parallel == split


def configuration_refusal(cfg) -> str | None:
    """Why ``moe.dispatcher`` cannot run a training step of ``cfg`` (None where it can): an unknown
    name, a dispatcher for the other kind of layout (tokens shared over "tp" or not), or the
    dispatcher's own refusal."""
    name = configured_name(cfg)
    if name not in DISPATCHERS:
        return f"unknown dispatcher {name!r}; allowed: {sorted(DISPATCHERS)} or {AUTO}"
    split = expert_tensor_parallel(cfg) > 1
    if not suits(name, split):
        wanted = "a tensor-parallel one" if split else "one whose ranks hold their own tokens"
        kinds = sorted(n for n, d in DISPATCHERS.items() if d.tensor_parallel == split)
        return (
            f'experts are {"" if split else "not "}split over "tp" (expert tensor parallel '
            f"{expert_tensor_parallel(cfg)}), so the dispatcher must be {wanted}: {kinds}"
        )
    return configured(cfg).refusal(cfg)


def exchange_chunks(cfg) -> int | None:
    """The pipelined chunks in which a training step of ``cfg`` drops the tokens the "tp" ranks
    share and all-gathers them; None where it sends them all or shares none."""
    chosen = configured(cfg)
    return chosen.step_chunks(cfg) if chosen.tensor_parallel else None


def tensor_parallel_dispatchers() -> dict[str, Dispatcher]:
    """The dispatchers of tokens shared by "tp" ranks."""
    return {name: d for name, d in DISPATCHERS.items() if d.tensor_parallel}


for _dispatcher in (Capacity(), Hierarchical(), Dropless(), AllGather(), Duplicate(), DropGather()):
    register_dispatcher(_dispatcher)
register_dispatcher(NodeForwarding())
register_dispatcher(DirectSends())

__all__ = [
    "AUTO",
    "DISPATCHERS",
    "Dispatcher",
    "StudyGroups",
    "configuration_refusal",
    "configured",
    "configured_name",
    "dispatcher",
    "exchange_chunks",
    "register_dispatcher",
    "routes_dropless",
    "suits",
    "tensor_parallel_dispatchers",
]
