"""Selectors: the samplers and removers a Table is built from (see :mod:`.base`)."""

from __future__ import annotations

from ..errors import InvalidArgument
from .base import Selector
from .heap import MaxHeap, MinHeap
from .order import Fifo, Lifo
from .prioritized import Prioritized
from .uniform import Uniform
from .without_replacement import WithoutReplacement

SELECTORS: dict[str, type[Selector]] = {
    cls.__name__: cls for cls in (Uniform, Prioritized, Fifo, Lifo, MinHeap, MaxHeap, WithoutReplacement)
}


def selector_from_config(config: dict) -> Selector:
    """Rebuild a selector from :meth:`Selector.config` output."""
    kwargs = dict(config)
    name = kwargs.pop("type")
    try:
        cls = SELECTORS[name]
    except KeyError:
        raise InvalidArgument(f"unknown selector type {name!r}; known: {sorted(SELECTORS)}") from None
    return cls(**kwargs)


__all__ = [
    "Fifo",
    "Lifo",
    "MaxHeap",
    "MinHeap",
    "Prioritized",
    "SELECTORS",
    "Selector",
    "Uniform",
    "WithoutReplacement",
    "selector_from_config",
]
