"""Column storage on disk: the same columns as :class:`ColumnStorage`, memory-mapped ``.npy`` files.

Use it for buffers larger than RAM: the OS pages columns in and out, so resident memory stays
bounded by what is being touched. Each column is a standard ``.npy`` file (readable with
``np.load(..., mmap_mode="r")``) and ``storage.json`` in the same directory records the capacity and
the spec, so :meth:`MemmapColumnStorage.open` reopens the data after a restart.

The payload files hold whatever was last written to each slot; which slots hold live items is the
Table's metadata, persisted by ``Table.save`` (the checkpoint of a memmap table copies the live
rows, so it is self-contained).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..errors import CheckpointError
from .columns import ColumnStorage
from .spec import Field

_MANIFEST = "storage.json"


class MemmapColumnStorage(ColumnStorage):
    """Column storage whose arrays are memory-mapped files in ``directory``.

    Args:
        capacity: number of slots.
        directory: where the ``.npy`` column files and ``storage.json`` live (created if needed).
            Existing column files there are overwritten when the spec is adopted.
        spec: optional spec, as for :class:`ColumnStorage`.
    """

    kind = "memmap"

    def __init__(self, capacity: int, directory: str | os.PathLike, spec: Mapping | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, str] = {}
        super().__init__(capacity, spec)

    def _allocate(self, path: str, field: Field) -> np.ndarray:
        name = f"col{len(self._files):03d}.npy"
        self._files[path] = name
        arr = np.lib.format.open_memmap(
            self.directory / name, mode="w+", dtype=field.dtype, shape=(self.capacity, *field.shape)
        )
        return arr

    def _adopt(self, spec: dict[str, Field]) -> None:
        super()._adopt(spec)
        self._write_manifest()

    def _write_manifest(self) -> None:
        manifest = {
            "capacity": self.capacity,
            "spec": {p: f.to_json() for p, f in self.spec.items()},
            "files": self._files,
        }
        tmp = self.directory / (_MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp, self.directory / _MANIFEST)

    @classmethod
    def open(cls, directory: str | os.PathLike, mode: str = "r+") -> "MemmapColumnStorage":
        """Reopen a storage written earlier in ``directory`` (``mode="r"`` for read-only).

        Raises:
            CheckpointError: the manifest or a column file is missing or does not match it.
        """
        directory = Path(directory)
        try:
            manifest = json.loads((directory / _MANIFEST).read_text())
        except (OSError, ValueError) as e:
            raise CheckpointError(f"no readable {_MANIFEST} in {directory}: {e}") from None
        self = cls.__new__(cls)
        ColumnStorage.__init__(self, manifest["capacity"])  # spec adopted below, no allocation
        self.directory = directory
        self._files = dict(manifest["files"])
        self.spec = {p: Field.from_json(f) for p, f in manifest["spec"].items()}
        self._nested = any("/" in p for p in self.spec)
        for path, field in self.spec.items():
            try:
                arr = np.load(directory / self._files[path], mmap_mode=mode)
            except (OSError, ValueError, KeyError) as e:
                raise CheckpointError(f"column {path!r} in {directory} is unreadable: {e}") from None
            if arr.shape != (self.capacity, *field.shape) or arr.dtype != field.dtype:
                raise CheckpointError(
                    f"column {path!r} in {directory}: file has {arr.shape} {arr.dtype}, manifest says "
                    f"{(self.capacity, *field.shape)} {field.dtype}"
                )
            self.columns[path] = arr
        return self

    def describe(self) -> dict:
        """As :meth:`ColumnStorage.describe`, plus the directory."""
        d = super().describe()
        d["directory"] = str(self.directory)
        return d

    def flush(self) -> None:
        """Write dirty pages of every column to disk."""
        for col in self.columns.values():
            if isinstance(col, np.memmap):
                col.flush()

    def close(self) -> None:
        """Flush and drop the maps."""
        self.flush()
        self.columns = {}
