"""CompressedColumnStorage: column storage whose large fields are kept zstd-compressed, per item.

Image observations dominate the memory of a pixel-based replay buffer and compress well. This
storage keeps every field whose item is at least ``min_bytes`` large (or the fields named in
``compress``) as one zstd frame per item, every other field as an ordinary NumPy column. Its
contract beyond :mod:`replaystore.storage.base` (``prepare`` validates as :class:`ColumnStorage`
and compresses nothing, ``write`` compresses, ``read`` decompresses into new writable arrays,
``export`` gives decompressed columns for checkpoints, ``release`` drops freed slots' bytes at
once) and why per item, not per chunk: docs/data.md "Compressed image storage".

Thread safety: like every storage, not thread-safe on its own (the Table calls it under its lock);
the zstd contexts are per thread. Needs ``zstandard`` (``pip install replaystore[compress]``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..errors import InvalidArgument, SpecError
from .columns import ColumnStorage
from .spec import SEP, Field, unflatten

DEFAULT_MIN_BYTES = 1024


def _zstd():
    try:
        import zstandard
    except ImportError as e:  # pragma: no cover - exercised only without zstandard
        raise ImportError("CompressedColumnStorage needs zstandard: pip install 'replaystore[compress]'") from e
    return zstandard


class CompressedColumnStorage(ColumnStorage):
    """Column storage that zstd-compresses large fields item by item.

    Args:
        capacity: number of slots.
        spec: optional nested spec (else inferred from the first item), as for :class:`ColumnStorage`.
        compress: flat paths (``"obs"``, ``"obs/image"``) of the fields to compress; ``None``
            compresses every field whose item is at least ``min_bytes`` bytes.
        min_bytes: the size threshold used when ``compress`` is ``None``.
        level: zstd compression level (1-22; 1-3 are fast, higher levels trade write speed for
            size; decompression speed barely depends on it).

    Raises:
        InvalidArgument: ``level`` outside 1-22 or ``min_bytes`` negative.
        SpecError: a path in ``compress`` is not a field of the spec (raised when the spec is
            known: at construction with ``spec``, else on the first write's ``prepare``).
    """

    kind = "compressed"

    def __init__(
        self,
        capacity: int,
        spec: Mapping | None = None,
        compress: Iterable[str] | None = None,
        min_bytes: int = DEFAULT_MIN_BYTES,
        level: int = 3,
    ) -> None:
        zstandard = _zstd()
        if not 1 <= int(level) <= 22:
            raise InvalidArgument(f"zstd level must be in 1..22, got {level}")
        if int(min_bytes) < 0:
            raise InvalidArgument(f"min_bytes must be >= 0, got {min_bytes}")
        self.level = int(level)
        self.min_bytes = int(min_bytes)
        self._compress_arg = None if compress is None else tuple(compress)
        self._zstd = zstandard
        self._local = threading.local()
        self.compressed: dict[str, Field] = {}
        self.blobs: dict[str, np.ndarray] = {}  # path -> object array of bytes (None: empty slot)
        self.blob_sizes: dict[str, np.ndarray] = {}  # path -> int64 compressed size per slot
        super().__init__(capacity, spec)

    # -- spec -------------------------------------------------------------------------------
    def _choose(self, spec: dict[str, Field]) -> dict[str, Field]:
        if self._compress_arg is None:
            return {p: f for p, f in spec.items() if math.prod(f.shape) * f.dtype.itemsize >= self.min_bytes}
        unknown = sorted(set(self._compress_arg) - spec.keys())
        if unknown:
            raise SpecError(f"compress names fields that are not in the spec: {unknown}; fields: {sorted(spec)}")
        return {p: spec[p] for p in self._compress_arg}

    def _adopt(self, spec: dict[str, Field]) -> None:
        chosen = self._choose(spec)
        self.spec = spec
        self._nested = any(SEP in p for p in spec)
        self.compressed = chosen
        self.columns = {p: self._allocate(p, f) for p, f in spec.items() if p not in chosen}
        self.blobs = {p: np.full(self.capacity, None, dtype=object) for p in chosen}
        self.blob_sizes = {p: np.zeros(self.capacity, dtype=np.int64) for p in chosen}

    def prepare(self, data: Any, batched: bool) -> tuple[tuple, int]:
        """Validate like :meth:`ColumnStorage.prepare` (no compression, no mutation).

        Raises:
            SpecError: bad data, or (first data only) ``compress`` names an unknown field.
        """
        prepared, n = super().prepare(data, batched)
        new_spec = prepared[1]
        if new_spec is not None:
            self._choose(new_spec)  # validates the compress paths against the inferred spec
        return prepared, n

    # -- zstd contexts (per thread: zstd contexts are not thread-safe) ------------------------------
    def _ctx(self, kind: str) -> Any:
        """The calling thread's zstd compressor (``kind="cctx"``) or decompressor (``"dctx"``)."""
        c = getattr(self._local, kind, None)
        if c is None:
            c = self._zstd.ZstdCompressor(level=self.level) if kind == "cctx" else self._zstd.ZstdDecompressor()
            setattr(self._local, kind, c)
        return c

    def _compress_rows(self, rows: np.ndarray, n: int, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """One zstd frame per item of ``rows`` (``n`` items, or one unbatched item)."""
        cctx = self._ctx("cctx")
        rows = np.ascontiguousarray(rows).reshape(n, math.prod(shape))
        frames = np.empty(n, dtype=object)
        sizes = np.empty(n, dtype=np.int64)
        for i in range(n):
            # zstd returns a bytes object shrunk from a worst-case-sized allocation; keeping those
            # leaves the heap fragmented (RSS ~12x the payload on 84x84 frames). A tight copy does not.
            b = bytes(memoryview(cctx.compress(rows[i])))
            frames[i] = b
            sizes[i] = len(b)
        return frames, sizes

    # -- Storage interface ----------------------------------------------------------------------
    def write(self, slots: slice | np.ndarray, prepared: tuple) -> None:
        """Store plain columns and compress the compressed fields into ``slots``."""
        super().write(slots, prepared)
        columns = prepared[0]
        if not self.compressed:
            return
        n = len(range(*slots.indices(self.capacity))) if isinstance(slots, slice) else len(slots)
        for path, field in self.compressed.items():
            frames, sizes = self._compress_rows(columns[path], n, field.shape)
            self.blobs[path][slots] = frames
            self.blob_sizes[path][slots] = sizes

    def _decompress(self, path: str, slots: np.ndarray) -> np.ndarray:
        field = self.compressed[path]
        out = np.empty((len(slots), *field.shape), dtype=field.dtype)
        if out.size == 0:
            return out
        flat = out.reshape(len(slots), -1).view(np.uint8)
        size = flat.shape[1]
        dctx = self._ctx("dctx")
        frames = self.blobs[path]
        for i, s in enumerate(slots.tolist()):
            flat[i] = np.frombuffer(dctx.decompress(frames[s], max_output_size=size), dtype=np.uint8)
        return out

    def read(self, slots: np.ndarray) -> dict[str, Any]:
        """Gather plain columns and decompress the compressed ones (new writable arrays)."""
        flat = self.export(slots)
        return unflatten(flat) if self._nested else flat

    def release(self, slots: np.ndarray) -> None:
        """Drop the compressed bytes of freed slots."""
        for path in self.compressed:
            self.blobs[path][slots] = None
            self.blob_sizes[path][slots] = 0

    def describe(self) -> dict:
        """Kind, capacity, spec, the compressed fields and the level."""
        d = super().describe()
        d.update(
            compress=sorted(self.compressed) if self.spec is not None else self._compress_arg,
            min_bytes=self.min_bytes,
            level=self.level,
        )
        return d

    def export(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Decompressed flat columns of ``slots`` (plain arrays: checkpoints need no zstd to read)."""
        slots = np.asarray(slots, dtype=np.int64)
        return {
            p: self._decompress(p, slots) if p in self.compressed else np.take(self.columns[p], slots, axis=0)
            for p in self.spec or ()
        }

    # -- accounting -----------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes of payload held: the plain columns plus the compressed frames (not Python overhead).

        Each stored frame also costs a Python ``bytes`` header (33 bytes) and an 8-byte pointer.
        """
        return int(sum(c.nbytes for c in self.columns.values()) + sum(s.sum() for s in self.blob_sizes.values()))

    def compressed_bytes(self, path: str) -> int:
        """Compressed bytes currently held for field ``path``."""
        return int(self.blob_sizes[path].sum())
