"""One kind of registry for every name-keyed extension point of the suite.

Communication policies (moe_core.schedule.policies), token dispatchers (moe_core.dispatch), transmission
orders (moe_core.comm.transmission) and config sections (moe_core.schema.sections) are each a :class:`Registry`:
a dict whose entries are added once, by name, and whose lookups fail with the names a user may
choose from. Imports nothing of the suite, so every registry module can use it without a cycle.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(dict[str, T], Generic[T]):
    """Things of one ``kind`` ("communication policy", "token dispatcher", ...) by name."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, name: str, item: T) -> T:
        """Add ``item`` under ``name``; a name is registered once."""
        if not name or name in self:
            raise ValueError(f"{self.kind} '{name}' has no name or is registered twice")
        self[name] = item
        return item

    def lookup(self, name: str) -> T:
        """The entry ``name``; a ValueError naming the registered ones when there is none."""
        if name not in self:
            raise ValueError(f"unknown {self.kind} '{name}'; allowed: {sorted(self)}")
        return self[name]
