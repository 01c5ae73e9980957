r"""The write-ahead log's record format: encoding and decoding one record (no files, no Tables).

A segment file starts with the 8-byte magic ``b"RSWAL01\\n"``, followed by records::

    frame (20 bytes, little-endian u32): total_len  head_len  crc_head  crc_data  crc_frame
    head  (head_len bytes):  u64 lsn, u8 op, u32 json_len, json, raw bytes of the head arrays
    data  (total_len - head_len bytes): raw bytes of the data arrays

``crc_frame`` is the CRC32 of the first 16 bytes of the frame, ``crc_head`` and ``crc_data`` of the
head and data. Arrays are described in the JSON (``"_h"`` for the head's, ``"_d"`` for the data's:
``[name, dtype, shape, flag]``; dtype as ``np.dtype.str``, never an object dtype) and stored as raw
C-order bytes, like ``.npy``: nothing read from a log is ever unpickled. :func:`decode` treats its
input as untrusted: a malformed header or descriptor raises :class:`~replaystore.errors.WalCorrupt`.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidType, WalCorrupt

MAGIC = b"RSWAL01\n"
FRAME = struct.Struct("<IIIII")  # total_len, head_len, crc_head, crc_data, crc_frame
HEAD = struct.Struct("<QBI")  # lsn, op, json_len
MAX_RECORD = 1 << 31  # refuse to read a record claimed larger than this (untrusted lengths)
MAX_JSON = 1 << 20


@dataclass
class Record:
    """One decoded record.

    ``lsn``, ``op`` code, ``meta`` (the JSON header minus array descriptors), ``arrays`` (name ->
    read-only array: the data arrays), ``flags`` (name -> the data array's flag) and ``head``
    (name -> read-only array: the head arrays; a name may be in both).
    """

    lsn: int
    op: int
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]
    flags: dict[str, int] = field(default_factory=dict)
    head: dict[str, np.ndarray] = field(default_factory=dict)


def _plain(dtype: np.dtype) -> bool:
    """Whether a log may hold arrays of ``dtype`` (raw bytes: no objects, no structured dtypes)."""
    return not dtype.hasobject and dtype.fields is None and dtype.kind in "biufcSUVMm"


def _check_dtype(arr: np.ndarray, name: str) -> None:
    if not _plain(arr.dtype):
        raise InvalidType(f"array {name!r} has dtype {arr.dtype}: a log holds only plain (non-object) arrays")


def check_arrays(arrays: Mapping[str, np.ndarray]) -> None:
    """Raise ``TypeError`` unless every array can go into a log record (no object dtypes)."""
    for name, arr in arrays.items():
        _check_dtype(np.asarray(arr), name)


class Payload:
    """Arrays ready to write: their descriptors, their buffers and the CRC32 of those buffers.

    Args:
        arrays: name -> array (not an object dtype); the arrays must not change until the record is
            written (the caller waits for it).
        flags: optional small int per array, given back on reading.
    """

    __slots__ = ("descs", "buffers", "nbytes", "crc")

    def __init__(self, arrays: Mapping[str, np.ndarray] | None = None, flags: Mapping[str, int] | None = None) -> None:
        self.descs: list[list] = []
        self.buffers: list[memoryview] = []
        self.nbytes = 0
        crc = 0
        for name, arr in (arrays or {}).items():
            arr = np.asarray(arr)
            _check_dtype(arr, name)
            buf = memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
            self.descs.append([name, arr.dtype.str, list(arr.shape), int((flags or {}).get(name, 0))])
            self.buffers.append(buf)
            self.nbytes += buf.nbytes
            crc = zlib.crc32(buf, crc)
        self.crc = crc


EMPTY = Payload()


def encode(
    lsn: int,
    op: int,
    meta: Mapping[str, Any] | None = None,
    head_arrays: Mapping[str, np.ndarray] | None = None,
    data: Payload = EMPTY,
) -> tuple[list, int]:
    """The buffers of one record and their total size (``head_arrays`` go in the head)."""
    head = Payload(head_arrays)
    doc = dict(meta or {})
    doc["_h"] = head.descs
    doc["_d"] = data.descs
    js = json.dumps(doc, separators=(",", ":")).encode()
    head_prefix = HEAD.pack(lsn, op, len(js)) + js
    head_len = len(head_prefix) + head.nbytes
    crc_head = zlib.crc32(head_prefix)
    for b in head.buffers:
        crc_head = zlib.crc32(b, crc_head)
    total = head_len + data.nbytes
    frame16 = struct.pack("<IIII", total, head_len, crc_head, data.crc)
    frame = frame16 + struct.pack("<I", zlib.crc32(frame16))
    return [frame + head_prefix, *head.buffers, *data.buffers], FRAME.size + total


def _decode_arrays(descs: Any, buf: memoryview, where: str) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    if not isinstance(descs, list):
        raise WalCorrupt(f"{where}: malformed array list")
    arrays: dict[str, np.ndarray] = {}
    flags: dict[str, int] = {}
    pos = 0
    for d in descs:
        try:
            name, dtype_str, shape, flag = d
            dtype = np.dtype(str(dtype_str))
            if not _plain(dtype):
                raise ValueError(f"dtype {dtype_str!r} is not allowed in a log")
            shape = tuple(int(s) for s in shape)
            if any(s < 0 for s in shape) or len(shape) > 32 or not isinstance(name, str):
                raise ValueError(f"bad shape {shape} or name {name!r}")
            count = int(np.prod(shape, dtype=np.int64)) if shape else 1
            nbytes = count * dtype.itemsize
        except (TypeError, ValueError, OverflowError) as e:
            raise WalCorrupt(f"{where}: malformed array descriptor {d!r}: {e}") from None
        if name in arrays:
            raise WalCorrupt(f"{where}: array {name!r} listed twice")
        if nbytes < 0 or pos + nbytes > len(buf):
            raise WalCorrupt(f"{where}: array {name!r} overruns its record")
        arrays[name] = np.frombuffer(buf[pos : pos + nbytes], dtype=dtype).reshape(shape)
        flags[name] = int(flag)
        pos += nbytes
    if pos != len(buf):
        raise WalCorrupt(f"{where}: {len(buf) - pos} bytes after the last array")
    return arrays, flags


def decode(head: bytes, data: bytes, where: str) -> Record:
    """Parse a record's head and data (checksums already verified); :class:`WalCorrupt` if malformed."""
    if len(head) < HEAD.size:
        raise WalCorrupt(f"{where}: record head too short")
    lsn, op, json_len = HEAD.unpack_from(head)
    if json_len > min(MAX_JSON, len(head) - HEAD.size):
        raise WalCorrupt(f"{where}: record header length {json_len} is out of bounds")
    try:
        doc = json.loads(bytes(head[HEAD.size : HEAD.size + json_len]))
    except ValueError as e:
        raise WalCorrupt(f"{where}: record header is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise WalCorrupt(f"{where}: record header is not a JSON object")
    hview = memoryview(head)[HEAD.size + json_len :]
    harrays, _ = _decode_arrays(doc.pop("_h", []), hview, where)
    arrays, flags = _decode_arrays(doc.pop("_d", []), memoryview(data), where)
    return Record(lsn, op, doc, arrays, flags, harrays)
