"""Fragment ids and the record format of a FragmentStore.

Fragment ids are strings ``"<time_ns hex>-<uuid4 hex>"``: unique, and their age is readable
(:func:`fragment_age`), which lets a service remove payloads nobody acknowledged. A record is a
value pickled with protocol 5, its large buffers (NumPy arrays) kept out of band and aligned, packed
into one byte string (:func:`encode`, :func:`decode`): reading a 30 MB fragment costs one copy.
Pickle runs code on load: decode only records your own processes wrote.
"""

from __future__ import annotations

import pickle
import struct
import time
import uuid
from typing import Any

__all__ = ["decode", "encode", "fragment_age", "new_fragment_id"]

_MAGIC = b"RSF1"
_ALIGN = 64
_HEADER = struct.Struct("<4sIQ")  # magic, number of buffers, length of the pickle
_LEN = struct.Struct("<Q")


# -- ids ------------------------------------------------------------------------------------------
def new_fragment_id() -> str:
    """A new unique fragment id, ``"<time_ns hex>-<uuid4 hex>"`` (sortable by creation time)."""
    return f"{time.time_ns():016x}-{uuid.uuid4().hex}"


def fragment_age(fragment_id: str, now: float | None = None) -> float:
    """Seconds since ``fragment_id`` was made by :func:`new_fragment_id` (``inf`` for other ids)."""
    head, sep, _ = fragment_id.partition("-")
    if not sep or len(head) != 16:
        return float("inf")
    try:
        t = int(head, 16) / 1e9
    except ValueError:
        return float("inf")
    return (time.time() if now is None else now) - t


# -- encoding -------------------------------------------------------------------------------------
def _pad(n: int) -> int:
    return (-n) % _ALIGN


def encode(value: Any) -> bytes:
    """Pack ``value`` into one record: header, pickle (protocol 5), aligned out-of-band buffers."""
    buffers: list[pickle.PickleBuffer] = []
    meta = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    head = _HEADER.size + _LEN.size * len(raws) + len(meta)
    parts: list[Any] = [_HEADER.pack(_MAGIC, len(raws), len(meta))]
    parts += [_LEN.pack(r.nbytes) for r in raws]
    parts += [meta, bytes(_pad(head))]
    for r in raws:
        parts += [r, bytes(_pad(r.nbytes))]
    return b"".join(parts)  # one copy of the payload, no zero-filling


def decode(record: bytes | bytearray | memoryview) -> Any:
    """Inverse of :func:`encode`. Arrays are views of ``record`` (writable if it is)."""
    view = memoryview(record)
    magic, nbuf, meta_len = _HEADER.unpack_from(view, 0)
    if magic != _MAGIC:
        raise ValueError("not a FragmentStore record")
    pos = _HEADER.size
    lens = [_LEN.unpack_from(view, pos + i * _LEN.size)[0] for i in range(nbuf)]
    pos += _LEN.size * nbuf
    meta = view[pos : pos + meta_len]
    off = pos + meta_len
    off += _pad(off)
    bufs = []
    for n in lens:
        bufs.append(view[off : off + n])
        off += n + _pad(n)
    return pickle.loads(meta, buffers=bufs)
