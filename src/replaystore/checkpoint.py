"""Checkpoints: a Table as a directory of ``.npy`` arrays plus a JSON manifest.

Layout of ``path/``::

    manifest.json      format, table config, sampler/remover/limiter config and state, counters,
                       RNG state, and for every file its size and SHA-256
    meta_keys.npy      int64 keys of the live items, oldest first
    meta_priorities.npy, meta_times_sampled.npy, meta_versions.npy
    col000.npy ...     one file per storage column (live rows, same order), or
    objects.pkl        the items of an object storage (pickle: see below)

Writing goes to a temporary sibling directory that is renamed into place, so a crash never leaves
a half-written checkpoint under ``path``; an existing checkpoint there is replaced. The table's
lock is held only while the live rows are copied out, not while files are written.

Loading checks every file's size and checksum before using it and raises
:class:`~replaystore.CheckpointError` naming the problem. Arrays load with
``allow_pickle=False``; only an object storage's ``objects.pkl`` is unpickled, and only when the
caller passes ``allow_pickle=True`` (unpickling runs code from the file: load only checkpoints you
trust).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .errors import CheckpointError
from .limiters import limiter_from_config
from .samplers import selector_from_config
from .storage import ColumnStorage, FrameStackStorage, MemmapColumnStorage, ObjectStorage
from .storage.spec import normalize_spec, unflatten

if TYPE_CHECKING:
    from .table import Table

FORMAT = "replaystore-checkpoint"
VERSION = 1
_META = ("keys", "priorities", "times_sampled", "versions")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_table(table: "Table", path: str | os.PathLike) -> None:
    """Write ``table`` to the directory ``path`` atomically (see the module doc)."""
    path = Path(path)
    with table._cond:
        table._flush_pending()
        slots = table._index.live_slots()
        keys = table._index.key_of_slot[slots]
        meta = {
            "keys": keys,
            "priorities": table._priority[slots].copy(),
            "times_sampled": table._times_sampled[slots].copy(),
            "versions": table._version[slots].copy(),
        }
        payload = table.storage.export(slots)
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "table": {
                "name": table.name,
                "capacity": table.capacity,
                "max_times_sampled": table.max_times_sampled,
                "max_staleness": table.max_staleness,
                "default_timeout": table.default_timeout,
                "seed": table.seed,
                "next_key": table._next_key,
                "model_version": table.version,
                "max_priority": table.max_priority,
                "counters": dict(table._counters),
                "blocked": dict(table._blocked),
                "rng": table.rng.bit_generator.state,
            },
            "storage": table.storage.describe(),
            "sampler": {"config": table.sampler.config(),
                        "state": table.sampler.export_state(table._index.key_of_slot)},
            "remover": {"config": table.remover.config(),
                        "state": table.remover.export_state(table._index.key_of_slot)},
            "rate_limiter": {"config": table.rate_limiter.config(), "state": table.rate_limiter.state()},
            "size": len(slots),
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        files: dict[str, str] = {}
        for name, arr in meta.items():
            files[f"meta_{name}.npy"] = name
            np.save(tmp / f"meta_{name}.npy", arr, allow_pickle=False)
        if isinstance(table.storage, ObjectStorage):
            with open(tmp / "objects.pkl", "wb") as f:
                pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
            manifest["columns"] = None
        else:
            columns = {}
            for i, (col_path, arr) in enumerate(payload.items()):
                fname = f"col{i:03d}.npy"
                np.save(tmp / fname, arr, allow_pickle=False)
                columns[col_path] = fname
            manifest["columns"] = columns
        manifest["files"] = {
            f.name: {"bytes": f.stat().st_size, "sha256": _digest(f)} for f in sorted(tmp.iterdir())
        }
        with open(tmp / "manifest.json", "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _read_manifest(path: Path) -> dict:
    mpath = path / "manifest.json"
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint directory at {path}")
    try:
        manifest = json.loads(mpath.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} has no manifest.json: not a replaystore checkpoint") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{mpath} is unreadable or corrupted: {e}") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{mpath} is not a replaystore checkpoint (format {manifest.get('format')!r})")
    if manifest.get("version") != VERSION:
        raise CheckpointError(f"{mpath} has format version {manifest.get('version')}, this reader knows {VERSION}")
    for name, info in manifest.get("files", {}).items():
        f = path / name
        if not f.exists():
            raise CheckpointError(f"checkpoint {path} is missing {name}")
        size = f.stat().st_size
        if size != info["bytes"]:
            raise CheckpointError(f"{f} is truncated or altered: {size} bytes, manifest says {info['bytes']}")
        if _digest(f) != info["sha256"]:
            raise CheckpointError(f"{f} is corrupted: its SHA-256 does not match the manifest")
    return manifest


def read_manifest(path: str | os.PathLike) -> dict:
    """The verified manifest of the checkpoint at ``path`` (for ``replaystore inspect``)."""
    return _read_manifest(Path(path))


def load_table(path: str | os.PathLike, allow_pickle: bool = False, memmap_dir: str | None = None) -> "Table":
    """Rebuild the table saved at ``path``.

    Args:
        path: the checkpoint directory.
        allow_pickle: required to load an object storage (its items are pickled).
        memmap_dir: for a checkpoint of a memmap table, the directory of the new memmap storage;
            without it the columns are loaded into RAM.
    """
    from .table import Table

    path = Path(path)
    m = _read_manifest(path)
    t = m["table"]

    def load_npy(name: str) -> np.ndarray:
        try:
            return np.load(path / name, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{path / name} is unreadable: {e}") from None

    meta = {name: load_npy(f"meta_{name}.npy") for name in _META}
    kind = m["storage"]["kind"]
    capacity = int(t["capacity"])
    if kind == "objects":
        if not allow_pickle:
            raise CheckpointError(
                f"{path} holds pickled Python objects; pass allow_pickle=True only if you trust it"
            )
        try:
            with open(path / "objects.pkl", "rb") as f:
                payload = pickle.load(f)
        except Exception as e:  # noqa: BLE001 - any unpickling failure is a bad checkpoint
            raise CheckpointError(f"{path / 'objects.pkl'} is unreadable: {e}") from None
        storage = ObjectStorage(capacity)
    else:
        payload = {col: load_npy(fname) for col, fname in (m.get("columns") or {}).items()}
        spec = m["storage"].get("spec")
        spec = None if spec is None else unflatten({p: (f["shape"], f["dtype"]) for p, f in spec.items()})
        if kind == "frames":
            desc = m["storage"]
            storage = FrameStackStorage(capacity, desc["obs_key"], desc["next_obs_key"], desc["end_keys"],
                                        frame_capacity=desc.get("frame_capacity"))
            if spec is not None:
                storage._adopt(normalize_spec(spec))
        elif kind == "compressed":
            from .storage.compressed import CompressedColumnStorage

            desc = m["storage"]
            try:
                storage = CompressedColumnStorage(capacity, spec, compress=desc.get("compress"),
                                                  min_bytes=desc.get("min_bytes", 1024), level=desc.get("level", 3))
            except (TypeError, ValueError) as e:
                raise CheckpointError(f"{path}: manifest has an invalid compressed storage: {e}") from None
        elif kind == "memmap" and memmap_dir is not None:
            storage = MemmapColumnStorage(capacity, memmap_dir, spec)
        else:
            storage = ColumnStorage(capacity, spec)
    n = int(m["size"])
    rows = len(payload) if isinstance(payload, list) else {len(a) for a in payload.values()}
    if len(meta["keys"]) != n or (rows != n if isinstance(rows, int) else rows - {n}):
        raise CheckpointError(f"{path}: item counts in the files do not match the manifest size {n}")

    try:
        table = Table(
            capacity,
            sampler=selector_from_config(m["sampler"]["config"]),
            remover=selector_from_config(m["remover"]["config"]),
            rate_limiter=limiter_from_config(m["rate_limiter"]["config"]),
            max_times_sampled=t["max_times_sampled"],
            max_staleness=t["max_staleness"],
            storage=storage,
            seed=t["seed"],
            default_timeout=t["default_timeout"],
            name=t["name"],
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: manifest has an invalid table configuration: {e}") from None
    table._restore(payload, n, meta, m)
    return table
