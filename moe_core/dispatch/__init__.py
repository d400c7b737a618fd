"""The token dispatchers: every way an MoE layer's tokens reach their experts' ranks, by name.

One class per exchange (moe_core.dispatch.base.Dispatcher), registered here or from a paper's
folder (MoNTA's pipelined drop-gather). The registry is what the rest enumerates: the dispatcher
study's measured and simulated paths (moe_core.dispatch_study), the allowed values of
``comm.tp_dispatch`` and its chunk decision (moe_core.schedule.policies.tp_exchange_chunks). A new
exchange is a class and one :func:`register_dispatcher` line.

A training step's plan carries its exchange as one object with its parameters (``step``:
moe_core.dispatch.step.StepExchange's classes): the library's all-to-all (the ``capacity``, ``hierarchical``
and ``duplicate`` dispatchers' exchange, optionally in a transmission order), Lina's pipelined
micro-ops, and the drop-and-all-gather the tensor-parallel dispatchers' chunk decision builds.
"""

from __future__ import annotations

from moe_core.dispatch.base import Dispatcher, StudyGroups
from moe_core.dispatch.exchanges import AllGather, Capacity, Dropless, Hierarchical
from moe_core.dispatch.tensor_parallel import DropGather, Duplicate, TensorParallelDispatcher
from moe_core.registry import Registry

DISPATCHERS: Registry[Dispatcher] = Registry("token dispatcher")


def register_dispatcher(dispatcher: Dispatcher) -> Dispatcher:
    return DISPATCHERS.register(dispatcher.name, dispatcher)


def dispatcher(name: str) -> Dispatcher:
    return DISPATCHERS.lookup(name)


def tensor_parallel_dispatchers() -> dict[str, TensorParallelDispatcher]:
    """The dispatchers of tokens shared by "tp" ranks: the values ``comm.tp_dispatch`` allows."""
    return {name: d for name, d in DISPATCHERS.items() if d.tensor_parallel}


for _dispatcher in (Capacity(), Hierarchical(), Dropless(), AllGather(), Duplicate(), DropGather()):
    register_dispatcher(_dispatcher)

__all__ = ["DISPATCHERS", "Dispatcher", "StudyGroups", "TensorParallelDispatcher", "dispatcher", "register_dispatcher"]
