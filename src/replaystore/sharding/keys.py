"""Keys of a sharded table: each key carries its table's tag and its shard.

A shard is an ordinary Table whose keys count ``0, 1, 2, ...``. The sharded client hands out
*global* keys that say which table and which shard an item lives in, so ``update_priorities``,
``delete``, ``get`` and ``info`` go straight to the owner without a directory::

    bit 63      0 (keys stay non-negative int64)
    bits 48-62  the table's tag (15 bits, never 0; from the sharded table's name)
    bits 40-47  the shard (up to 256 shards)
    bits 0-39   the shard's own key (2**40 items per shard)

A key whose tag is not the table's (a key of another sharded table, or of a plain Table, whose
tag is 0) raises :class:`ForeignKey` before anything is sent.
"""

from __future__ import annotations

import zlib

import numpy as np

from ..errors import InvalidArgument

LOCAL_BITS = 40
SHARD_BITS = 8
TAG_BITS = 15
MAX_SHARDS = 1 << SHARD_BITS
LOCAL_MASK = (1 << LOCAL_BITS) - 1
SHARD_MASK = MAX_SHARDS - 1
TAG_SHIFT = LOCAL_BITS + SHARD_BITS


class ForeignKey(InvalidArgument):
    """A key that does not belong to this sharded table (another table's key, or a plain Table's)."""


def tag_for(name: str, namespace: str | None = None) -> int:
    """The 15-bit tag of the sharded table ``name`` (stable across processes and restarts; never 0)."""
    tag = zlib.crc32(f"{namespace or ''}/{name}".encode()) & ((1 << TAG_BITS) - 1)
    return tag or 1


def encode(tag: int, shard: int, local: np.ndarray) -> np.ndarray:
    """Global keys of the shard's ``local`` keys (int64; ``-1`` stays ``-1``)."""
    local = np.asarray(local, dtype=np.int64)
    if local.size and int(local.max()) > LOCAL_MASK:
        raise InvalidArgument(f"shard {shard} passed 2**{LOCAL_BITS} keys: the sharded key space is exhausted")
    out = local | np.int64((tag << TAG_SHIFT) | (shard << LOCAL_BITS))
    return np.where(local < 0, np.int64(-1), out)


def decode(tag: int, keys: np.ndarray, num_shards: int) -> tuple[np.ndarray, np.ndarray]:
    """``(shard, local)`` of global ``keys``.

    Raises:
        ForeignKey: a key has another table's tag or a shard this table does not have (the
            message names the first such key and its tag).
    """
    keys = np.asarray(keys, dtype=np.int64).reshape(-1)
    tags = keys >> TAG_SHIFT
    shards = (keys >> LOCAL_BITS) & SHARD_MASK
    bad = (tags != tag) | (shards >= num_shards)
    if bad.any():
        k = int(keys[np.flatnonzero(bad)[0]])
        raise ForeignKey(
            f"key {k} does not belong to this sharded table (tag {k >> TAG_SHIFT if k >= 0 else '-'},"
            f" shard {(k >> LOCAL_BITS) & SHARD_MASK if k >= 0 else '-'}; this table: tag {tag}, "
            f"{num_shards} shards): a key of another table, or of a plain Table"
        )
    return shards, keys & LOCAL_MASK


def group(shards: np.ndarray, num_shards: int) -> list[np.ndarray]:
    """Positions of each shard's entries, shard by shard (stable order within a shard)."""
    order = np.argsort(shards, kind="stable")
    bounds = np.searchsorted(shards[order], np.arange(num_shards + 1))
    return [order[bounds[s] : bounds[s + 1]] for s in range(num_shards)]
