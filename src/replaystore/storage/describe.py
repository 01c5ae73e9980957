"""A storage from its ``describe()`` output: the inverse that checkpoints and snapshots need."""

from __future__ import annotations

from pathlib import Path

from .base import Storage
from .columns import ColumnStorage
from .compressed import CompressedColumnStorage
from .frames import FrameStackStorage
from .memmap import MemmapColumnStorage
from .objects import ObjectStorage
from .spec import unflatten


def from_description(desc: dict, capacity: int, memmap_dir: str | Path | None = None) -> Storage:
    """A new, empty storage of ``capacity`` slots like the one ``desc`` describes.

    A memory-mapped storage is rebuilt in ``memmap_dir`` (absent or empty), or in RAM without it.
    Raises ``KeyError``/``TypeError``/``ValueError`` (or a ``ReplayError``) on a bad description.
    """
    kind = desc["kind"]
    if kind == "objects":
        return ObjectStorage(capacity)
    flat = desc.get("spec")
    spec = None if flat is None else unflatten({p: (f["shape"], f["dtype"]) for p, f in flat.items()})
    if kind == "frames":
        keys = (desc["obs_key"], desc["next_obs_key"], desc["end_keys"])
        return FrameStackStorage(capacity, *keys, spec=spec, frame_capacity=desc.get("frame_capacity"))
    if kind == "compressed":
        return CompressedColumnStorage(
            capacity,
            spec,
            compress=desc.get("compress"),
            min_bytes=desc.get("min_bytes", 1024),
            level=desc.get("level", 3),
        )
    if kind == "memmap" and memmap_dir is not None:
        return MemmapColumnStorage(capacity, memmap_dir, spec)
    return ColumnStorage(capacity, spec)
