"""The modes of a Table for the conformance suite: one handle class per mode, same calls.

A handle wraps what a user holds in that mode (a Table, a SharedTable, a ReplayClient, a
ShardedClient, a LoggedTable) and answers the Table's calls by calling it exactly as a user
would; only ``stats`` (the served client returns the service's stats by table, the sharded
client ``{"shards", "total"}``), ``roundtrip`` (save, then load what was saved as Tables) and the
logged table's ``(result, lsn)`` are normalised here. A helper module, not a conftest.
"""

from __future__ import annotations

import functools
import os
import uuid
from typing import Any

import numpy as np

import replaystore as rs
from replaystore.table import contract

SPEC = {"obs": ((2,), np.float32), "id": ((), np.int64)}


def config(name: str) -> dict[str, Any]:
    """Fresh constructor arguments of the suite's table ``name`` (new selector objects each time)."""
    if name == "P":  # prioritized, staleness window
        return dict(capacity=100, sampler=rs.Prioritized(0.6, 0.4), spec=SPEC, max_staleness=2, seed=0)
    if name == "E":  # episodes
        return dict(capacity=64, sampler=rs.Uniform(), spec=SPEC, episodes=rs.Episodes(max_streams=16), seed=0)
    if name == "R":  # retirement after one sample
        return dict(capacity=10, sampler=rs.Uniform(), spec=SPEC, max_times_sampled=1, seed=0)
    raise KeyError(name)


CONFIGS = ("P", "E", "R")


def table(name: str) -> rs.Table:
    """An in-process Table of config ``name`` (the reference)."""
    kw = config(name)
    return rs.Table(kw.pop("capacity"), **kw)


def factory(name: str) -> Any:
    """A picklable zero-argument factory of config ``name`` (for services)."""
    kw = config(name)
    return functools.partial(rs.Table, kw.pop("capacity"), **kw)


class Handle:
    """A mode's table: attribute access reaches the wrapped object's methods."""

    mode = "table"

    def __init__(self, obj: Any, name: str) -> None:
        self.obj, self.name = obj, name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.obj, attr)

    def __len__(self) -> int:
        return len(self.obj)

    def __contains__(self, key: Any) -> bool:
        return key in self.obj

    def stats(self) -> dict[str, Any]:
        return self.obj.stats()

    def roundtrip(self, path: str) -> rs.Table:
        self.obj.save(path)
        return rs.Table.load(path)

    def close(self) -> None:
        self.obj.close()

    def cleanup(self) -> None:
        pass


class SharedHandle(Handle):
    mode = "shared"

    def cleanup(self) -> None:
        try:
            self.obj.unlink()
        except Exception:  # noqa: BLE001 - already gone
            pass


class ServedHandle(Handle):
    mode = "served"

    def stats(self) -> dict[str, Any]:
        return self.obj.stats()[self.obj.table_name]

    def roundtrip(self, path: str) -> rs.Table:
        self.obj.save(path)
        return rs.Table.load(os.path.join(path, self.obj.table_name))


class ShardedHandle(Handle):
    mode = "sharded"

    def stats(self) -> dict[str, Any]:
        return self.obj.stats()["total"]

    def roundtrip(self, path: str) -> list[rs.Table]:
        self.obj.save(path)
        return [
            rs.Table.load(os.path.join(path, f"shard-{i}", self.obj.table_name)) for i in range(self.obj.num_shards)
        ]


class LoggedHandle(Handle):
    """A LoggedTable: logged calls go through ``durable`` (acknowledged), the rest are its own."""

    mode = "logged"

    def __getattr__(self, attr: str) -> Any:
        call = contract.CALLS.get(attr)
        if call is not None and call.logged:
            return functools.partial(self.obj.durable, attr)
        return getattr(self.obj, attr)

    def stats(self) -> dict[str, Any]:
        return self.obj.table.stats()

    def roundtrip(self, path: str) -> rs.Table:
        self.obj.save(path)
        return rs.Table.load(path)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
