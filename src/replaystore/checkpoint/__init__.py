"""Checkpoints: a Table as a directory of ``.npy`` arrays plus a checksummed JSON manifest.

The contract is docs/durability.md, "Checkpoints and the trust model": the directory's layout;
saving (:func:`save_snapshot` writes a hidden sibling ``.<name>.tmp-<id>``, moves the previous
checkpoint aside to ``.<name>.old-<id>`` and renames the new one into place, fsyncing as it goes,
so at every instant the previous or the new checkpoint loads; a missing ``path`` loads from the
newest complete side copy, which the next save puts back; one saving process per path); loading
as untrusted input (the checks: :mod:`.verify`; every problem a
:class:`~replaystore.CheckpointError` naming it; a failed load into ``memmap_dir`` leaves nothing
there); and what ``allow_pickle=True`` opens (an object storage's ``objects.pkl`` is unpickled,
which runs code chosen by whoever wrote it: pass it only for checkpoints you trust).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pickle
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..episodes.consistency import check_index_arrays
from ..errors import CheckpointError, DiskFull, InvalidArgument, ReplayError, StorageError
from ..rows import TIMES_SAMPLED_MAX, VERSION_MAX, VERSION_MIN
from ..snapshot import TableSnapshot
from ..storage import Storage
from ..storage.describe import from_description
from .verify import (
    CHECKSUM,
    EPISODE_ROWS,
    FORMAT,
    MANIFEST,
    META,
    VERSION,
    check_array,
    check_memory,
    load_npy,
    manifest_field,
    read_verified_manifest,
)

T = TypeVar("T")


def _at(point: str) -> None:
    """A named point of :func:`save_snapshot` (a no-op; crash tests replace it to kill the process there).

    Points: ``"file:<name>"`` (that file written and fsynced), ``"manifest"`` (manifest and
    checksum written), ``"synced"`` (temporary directory fsynced), ``"old-aside"`` (previous
    checkpoint renamed aside), ``"in-place"`` (new checkpoint renamed into place), ``"done"``.
    """


# -- writing ---------------------------------------------------------------------------------------
class _HashingWriter:
    """A write-only file wrapper that hashes (SHA-256) and counts what passes through it."""

    def __init__(self, f: io.BufferedWriter) -> None:
        self.f, self.sha, self.bytes = f, hashlib.sha256(), 0

    def write(self, b: bytes | memoryview) -> int:
        self.sha.update(b)
        n = self.f.write(b)
        self.bytes += n
        return n

    def flush(self) -> None:
        self.f.flush()


def _write_file(path: Path, write: Any) -> dict:
    """Create ``path``, let ``write(file)`` fill it, fsync it; return its ``{"bytes", "sha256"}``."""
    with open(path, "xb") as f:
        w = _HashingWriter(f)
        write(w)
        f.flush()
        os.fsync(f.fileno())
    _at(f"file:{path.name}")
    return {"bytes": w.bytes, "sha256": w.sha.hexdigest()}


def fsync_dir(path: str | os.PathLike) -> None:
    """``fsync`` a directory (so that a file created, renamed or deleted in it is durable)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _side_copies(path: Path) -> tuple[list[Path], list[Path]]:
    """The ``.tmp-`` and ``.old-`` siblings that interrupted saves to ``path`` may have left."""
    parent, name = path.parent, path.name
    if not parent.is_dir():
        return [], []
    tmp, old, siblings = f".{name}.tmp-", f".{name}.old-", list(parent.iterdir())
    return [p for p in siblings if p.name.startswith(tmp)], [p for p in siblings if p.name.startswith(old)]


def _recover(path: Path) -> None:
    """Prepare ``path`` for a save: put back the copy an interrupted save left, delete leftovers.

    If ``path`` is missing, the copy :func:`load_table` would read is renamed into place first, so
    there is never a moment without a loadable checkpoint.
    """
    if not (path.exists() or path.is_symlink()):
        found = _locate(path, required=False)
        if found is not None and found[0] != path:
            os.replace(found[0], path)
            fsync_dir(path.parent)
    tmps, olds = _side_copies(path)
    for p in tmps + olds:
        shutil.rmtree(p, ignore_errors=True)


def save_snapshot(snapshot: TableSnapshot, path: str | os.PathLike) -> None:
    """Write ``snapshot`` to the directory ``path``, replacing any checkpoint there (see the module doc).

    Raises:
        InvalidArgument: ``path`` is a file or a non-empty directory that is not a checkpoint.
        DiskFull: the file system is full (``path``, and the bytes the checkpoint needs, roughly).
        StorageError: any other I/O error while writing (on every error the previous checkpoint
            is in place and loadable, and no temporary copy is left behind).
    """
    path = Path(path)
    meta, payload, episodes = snapshot.meta, snapshot.payload, snapshot.episodes
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "saved_ns": time.time_ns(),
        "table": {**snapshot.config, **snapshot.state},
        "storage": snapshot.storage,
        "sampler": snapshot.sampler,
        "remover": snapshot.remover,
        "rate_limiter": snapshot.rate_limiter,
        "size": snapshot.size,
    }
    if episodes is not None:
        manifest["episodes"] = {"config": episodes["config"], "streams": episodes["streams"]}
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise InvalidArgument(f"cannot save a checkpoint to {path}: it exists and is not a directory")
    if path.is_dir() and not (path / MANIFEST).exists() and any(path.iterdir()):
        raise InvalidArgument(f"refusing to replace {path}: a non-empty directory that is not a checkpoint")
    path.parent.mkdir(parents=True, exist_ok=True)
    _recover(path)
    sid = uuid.uuid4().hex[:12]
    tmp = path.parent / f".{path.name}.tmp-{sid}"
    old = path.parent / f".{path.name}.old-{sid}"
    tmp.mkdir()
    moved_aside = False
    try:
        arrays = {f"meta_{name}.npy": arr for name, arr in meta.items()}
        arrays.update({f"episodes_{name}.npy": arr for name, arr in (episodes or {}).get("rows", {}).items()})
        objects = snapshot.storage["kind"] == "objects"
        manifest["columns"] = None if objects else {col: f"col{i:03d}.npy" for i, col in enumerate(payload)}
        if not objects:
            arrays.update({manifest["columns"][col]: arr for col, arr in payload.items()})
        files = {n: _write_file(tmp / n, lambda f, a=a: np.save(f, a, allow_pickle=False)) for n, a in arrays.items()}
        if objects:
            files["objects.pkl"] = _write_file(
                tmp / "objects.pkl", lambda f: pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
            )
        manifest["files"] = files
        raw = json.dumps(manifest, indent=1).encode()
        _write_file(tmp / MANIFEST, lambda f: f.write(raw))
        _write_file(tmp / CHECKSUM, lambda f: f.write(f"{hashlib.sha256(raw).hexdigest()}  {MANIFEST}\n".encode()))
        _at("manifest")
        fsync_dir(tmp)
        _at("synced")
        if path.exists():
            os.replace(path, old)
            moved_aside = True
            fsync_dir(path.parent)
            _at("old-aside")
        os.replace(tmp, path)
        fsync_dir(path.parent)
        _at("in-place")
    except BaseException as e:
        if moved_aside and not path.exists():
            os.replace(old, path)  # the new copy never arrived: put the previous one back
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and not isinstance(e, ReplayError):
            wanted = _estimate_bytes(meta, payload)
            cls = DiskFull if e.errno in (errno.ENOSPC, errno.EDQUOT) else StorageError
            raise cls(
                f"saving a checkpoint to {path} failed ({e.strerror or e}); it needs about {wanted:,} "
                "bytes; the previous checkpoint is unchanged",
                path=str(path),
                wanted=wanted,
            ) from e
        raise
    if moved_aside:
        shutil.rmtree(old, ignore_errors=True)
    _at("done")


def _estimate_bytes(meta: dict, payload: Any) -> int:
    """Bytes a checkpoint of these arrays needs, roughly (object payloads: not counted)."""
    arrays = list(meta.values()) + (list(payload.values()) if isinstance(payload, dict) else [])
    return int(sum(a.nbytes for a in arrays)) + 64 * 1024


def _locate(path: Path, required: bool = True) -> tuple[Path, dict] | None:
    """The directory to load for ``path`` and its verified manifest (see the module doc)."""
    if path.exists() or path.is_symlink():
        return path, read_verified_manifest(path)
    tmps, olds = _side_copies(path)
    found = []
    for p in tmps:  # the newest complete save that was not yet renamed into place
        try:
            m = read_verified_manifest(p)
        except CheckpointError:
            continue
        found.append((m.get("saved_ns", 0), p, m))
    if found:
        _, p, m = max(found, key=lambda x: (x[0], x[1].name))
        return p, m
    for p in sorted(olds):
        try:
            return p, read_verified_manifest(p)
        except CheckpointError:
            continue
    if required:
        raise CheckpointError(f"no checkpoint directory at {path}")
    return None


def open_checkpoint(path: str | os.PathLike) -> tuple[Path, dict]:
    """The directory that holds the checkpoint of ``path`` and its verified manifest.

    That is ``path`` itself, or the side copy an interrupted save left (see the module doc).
    Raises :class:`CheckpointError` as :func:`load_table` does.
    """
    return _locate(Path(path))


def checkpoint_exists(path: str | os.PathLike) -> bool:
    """Whether ``path`` (or a copy an interrupted save left beside it) holds a checkpoint to load.

    A cheap test of presence (the manifest of ``path``, or of a side copy), not a verification.
    """
    path = Path(path)
    if path.exists():
        return (path / MANIFEST).is_file()
    tmps, olds = _side_copies(path)
    return any((p / CHECKSUM).is_file() for p in tmps) or any((p / MANIFEST).is_file() for p in olds)


# -- loading --------------------------------------------------------------------------------------------
def load_snapshot(
    path: str | os.PathLike,
    build: Callable[[TableSnapshot, Storage], T],
    allow_pickle: bool = False,
    memmap_dir: str | None = None,
) -> T:
    """Read the checkpoint at ``path`` into a :class:`~replaystore.TableSnapshot`; return ``build(snapshot, storage)``.

    ``build`` makes the table (``Table.from_snapshot``); ``storage`` is a new, empty storage like
    the saved one. :meth:`Table.load` is the usual way in.

    Args:
        path: the checkpoint directory.
        build: makes the table from the snapshot and the storage.
        allow_pickle: required to load an object storage (its items are pickled; see the module doc).
        memmap_dir: for a checkpoint of a memmap table, the directory of the new memmap storage
            (absent or empty); without it the columns are loaded into RAM.

    Raises:
        CheckpointError: no checkpoint, or anything wrong with it (named in the message), including
            a configuration ``build`` refuses. On any error, ``memmap_dir`` is left as it was.
    """
    root, m = _locate(Path(path))
    if memmap_dir is None:
        return _build(root, m, build, allow_pickle, None)
    mdir = Path(memmap_dir)
    existed = mdir.exists()
    if existed and (not mdir.is_dir() or any(mdir.iterdir())):
        raise CheckpointError(f"memmap_dir {mdir} must be absent or an empty directory")
    try:
        return _build(root, m, build, allow_pickle, mdir)
    except BaseException:
        if existed:
            for p in mdir.iterdir():
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        else:
            shutil.rmtree(mdir, ignore_errors=True)
        raise


def _build(
    path: Path, m: dict, build: Callable[[TableSnapshot, Storage], T], allow_pickle: bool, memmap_dir: Path | None
) -> T:
    t = m["table"]
    n = m["size"]
    capacity = t["capacity"]
    meta = {name: load_npy(path, f"meta_{name}.npy") for name in META}
    for name, dtype in META.items():
        check_array(meta[name], f"meta_{name}.npy", dtype, (n,))
    keys = meta["keys"]
    if n and (keys[0] < 0 or (n > 1 and not bool((keys[1:] > keys[:-1]).all()))):
        raise CheckpointError(f"{path}: meta_keys.npy is not a list of distinct keys >= 0, oldest first")
    if n and t["next_key"] <= int(keys[-1]):
        raise CheckpointError(
            f"{path}: manifest field table.next_key ({t['next_key']}) is not above the "
            f"largest stored key ({int(keys[-1])}): new keys would collide"
        )
    if not np.isfinite(meta["priorities"]).all():
        raise CheckpointError(f"{path}: meta_priorities.npy holds NaN or infinite priorities")
    if n and meta["times_sampled"].min() < 0:
        raise CheckpointError(f"{path}: meta_times_sampled.npy holds negative counts")
    if n and meta["times_sampled"].max() > TIMES_SAMPLED_MAX:  # (int32 in the metadata row)
        raise CheckpointError(f"{path}: meta_times_sampled.npy holds counts above {TIMES_SAMPLED_MAX} (int32)")
    if n and (meta["versions"].min() < VERSION_MIN or meta["versions"].max() > VERSION_MAX):
        raise CheckpointError(f"{path}: meta_versions.npy holds versions outside int32 (the metadata row's)")
    desc = m["storage"]
    kind = desc["kind"]
    if kind == "objects":
        if not allow_pickle:
            raise CheckpointError(f"{path} holds pickled Python objects; pass allow_pickle=True only if you trust it")
        try:
            with open(path / "objects.pkl", "rb") as f:
                payload = pickle.load(f)
        except Exception as e:  # noqa: BLE001 - any unpickling failure is a bad checkpoint
            raise CheckpointError(f"{path / 'objects.pkl'} is unreadable: {e}") from None
        if not isinstance(payload, list) or len(payload) != n:
            raise CheckpointError(f"{path / 'objects.pkl'} does not hold a list of {n} items")
    else:
        flat = desc["spec"] or {}
        payload = {}
        for col, fname in (m["columns"] or {}).items():
            arr = load_npy(path, fname)
            field = flat[col]
            check_array(arr, fname, field["dtype"], (n, *field["shape"]))
            payload[col] = arr
    episodes = None
    if "episodes" in m:
        # the episode arrays: dtype and shape, then that they form one consistent history
        rows = {name: load_npy(path, f"episodes_{name}.npy") for name in EPISODE_ROWS}
        for name, dtype in EPISODE_ROWS.items():
            check_array(rows[name], f"episodes_{name}.npy", dtype, (n,))
        ep = manifest_field(m, "episodes", dict, "")
        episodes = {
            "config": manifest_field(ep, "config", dict, "episodes"),
            "streams": ep.get("streams"),
            "rows": rows,
        }
        check_index_arrays(rows, ep.get("streams"), where=str(path))
    check_memory(path, capacity, desc, in_ram=not (kind == "memmap" and memmap_dir is not None))
    lim = m["rate_limiter"]["state"]
    for key in ("inserts", "samples", "deletes"):
        if manifest_field(lim, key, int, "rate_limiter.state") < 0:
            raise CheckpointError(f"{path}: manifest field rate_limiter.state.{key} is negative")
    # (inserts - deletes is not compared with the item count: a limiter object shared by two
    # tables, a misuse but a harmless one, counts both, and its checkpoints must still load)
    config_keys = ("name", "capacity", "max_times_sampled", "max_staleness", "default_timeout", "seed")
    snapshot = TableSnapshot(
        config={k: t[k] for k in config_keys},
        state={k: v for k, v in t.items() if k not in config_keys},
        sampler=m["sampler"],
        remover=m["remover"],
        rate_limiter=m["rate_limiter"],
        storage=desc,
        meta=meta,
        payload=payload,
        episodes=episodes,
    )
    try:
        storage = from_description(desc, capacity, memmap_dir)
        return build(snapshot, storage)
    except CheckpointError as e:  # the state does not fit together
        raise CheckpointError(f"{path}: {e}") from None
    except (ReplayError, KeyError, TypeError, ValueError, OverflowError, MemoryError) as e:
        raise CheckpointError(f"{path}: manifest has an invalid table configuration: {e!r}") from None
