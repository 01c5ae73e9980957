"""Storages: where item payloads live. See :mod:`replaystore.storage.base` for the contract."""

from .base import Storage
from .columns import ColumnStorage
from .compressed import CompressedColumnStorage
from .frames import FrameStackStorage
from .memmap import MemmapColumnStorage
from .objects import ObjectStorage
from .spec import Field

__all__ = [
    "ColumnStorage",
    "CompressedColumnStorage",
    "Field",
    "FrameStackStorage",
    "MemmapColumnStorage",
    "ObjectStorage",
    "Storage",
]
