"""Column storage on disk: the same columns as :class:`ColumnStorage`, memory-mapped ``.npy`` files.

Use it for buffers larger than RAM: the OS pages columns in and out, so resident memory stays
bounded by what is being touched. Each column is a standard ``.npy`` file (readable with
``np.load(..., mmap_mode="r")``) and ``storage.json`` in the same directory records the capacity and
the spec, so :meth:`MemmapColumnStorage.open` reopens the data after a restart.

Full disks: every column file's blocks are allocated when it is created or reopened, so a full
file system raises :class:`~replaystore.errors.DiskFull` there, never ``SIGBUS`` later, and a
storage whose columns could not all be reserved keeps none of them (docs/durability.md "Full disks").

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
from .diskspace import allocated_bytes, atomic_write, reserve
from .spec import Field

_MANIFEST = "storage.json"


def _reserve_file(file: Path) -> None:
    """Allocate every block of ``file`` (``DiskFull`` if the file system cannot hold it)."""
    fd = os.open(file, os.O_RDWR)
    try:
        reserve(fd, 0, os.fstat(fd).st_size, file)
    finally:
        os.close(fd)


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
        file = self.directory / name
        arr = np.lib.format.open_memmap(file, mode="w+", dtype=field.dtype, shape=(self.capacity, *field.shape))
        try:
            _reserve_file(file)
        except BaseException:
            del arr
            file.unlink(missing_ok=True)
            raise
        self._files[path] = name
        return arr

    def _adopt(self, spec: dict[str, Field]) -> None:
        """Create and reserve every column file; on failure (``DiskFull``) keep none of them."""
        try:
            super()._adopt(spec)
            self._write_manifest()
        except BaseException:
            for name in self._files.values():
                (self.directory / name).unlink(missing_ok=True)
            self.columns, self._files, self.spec, self._nested, self._rows = {}, {}, None, False, ()
            raise

    def _write_manifest(self) -> None:
        manifest = {
            "capacity": self.capacity,
            "spec": {p: f.to_json() for p, f in self.spec.items()},
            "files": self._files,
        }
        atomic_write(self.directory / _MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1).encode()))

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
                file = directory / self._files[path]
                arr = np.load(file, mmap_mode=mode)
            except (OSError, ValueError, KeyError) as e:
                raise CheckpointError(f"column {path!r} in {directory} is unreadable: {e}") from None
            if arr.shape != (self.capacity, *field.shape) or arr.dtype != field.dtype:
                raise CheckpointError(
                    f"column {path!r} in {directory}: file has {arr.shape} {arr.dtype}, manifest says "
                    f"{(self.capacity, *field.shape)} {field.dtype}"
                )
            if mode != "r":
                _reserve_file(file)  # a file written by an older version may be sparse
            self.columns[path] = arr
        self._index_rows()
        return self

    def describe(self) -> dict:
        """As :meth:`ColumnStorage.describe`, plus the directory."""
        d = super().describe()
        d["directory"] = str(self.directory)
        return d

    def disk_usage(self) -> int:
        """Bytes the file system holds for the column files (all reserved up front)."""
        return allocated_bytes(self.directory / name for name in self._files.values())

    def flush(self) -> None:
        """Write dirty pages of every column to disk."""
        for col in self.columns.values():
            if isinstance(col, np.memmap):
                col.flush()

    def close(self) -> None:
        """Flush and drop the maps."""
        self.flush()
        self.columns = {}
