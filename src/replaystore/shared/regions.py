"""How a shared table's arrays get their place: a recorder learns the layout, a placer hands it out.

Creating a shared table builds its :class:`~replaystore.Table` twice through the allocation hook
of :mod:`replaystore.placement`: first with :func:`recorder`, which notes every array the parts
ask for (name, shape, dtype, scalar fill) and returns zero-byte stand-ins, so that the segment can
be sized and laid out; then, in every process that opens the segment, with :func:`placer`, which
hands out the segment's regions (checked against what the table asks for: a mismatch is
:class:`~replaystore.shared.errors.LayoutMismatch`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidState
from .errors import LayoutMismatch

if TYPE_CHECKING:
    from .segment import Segment


def recorder(regions: list, fills: dict) -> Any:
    """An allocator that notes each request (and its scalar fill) and returns a zero-byte stand-in."""

    def record(name: str, shape: tuple, dtype: np.dtype, fill: Any) -> np.ndarray:
        if any(r[0] == name for r in regions):
            raise InvalidState(f"two parts of a shared table allocate a region named {name!r}")
        regions.append((name, shape, dtype))
        if np.isscalar(fill):
            fills[name] = fill.item() if isinstance(fill, np.generic) else fill
        return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape, (0,) * len(shape))

    return record


def placer(seg: Segment, fill: bool) -> Any:
    """An allocator handing out the segment's regions (filled when the segment is new)."""

    def place(name: str, shape: tuple, dtype: np.dtype, value: Any) -> np.ndarray:
        if name not in seg.regions:
            raise LayoutMismatch(f"segment {seg.path} has no region {name!r}")
        offset, rshape, rdtype = seg.regions[name]
        if rshape != shape or rdtype != dtype:
            raise LayoutMismatch(
                f"segment {seg.path}: region {name!r} is {rshape} {rdtype}, this table needs {shape} {dtype}"
            )
        arr = seg.view(name)
        # (a new segment is zeros already; a deferred region is filled when it is reserved)
        if fill and not (np.isscalar(value) and value == 0) and name not in seg.config["deferred"]["fill"]:
            arr[...] = value
        return arr

    return place


__all__ = ["placer", "recorder"]
