"""Checkpoints: a Table as a directory of ``.npy`` arrays plus a checksummed JSON manifest.

Layout of ``path/``::

    manifest.json      format, table config, sampler/remover/limiter config and state, counters,
                       RNG state, and for every other file its size and SHA-256
    manifest.sha256    the SHA-256 of manifest.json's bytes (so the manifest is verified too)
    meta_keys.npy      int64 keys of the live items, oldest first
    meta_priorities.npy, meta_times_sampled.npy, meta_versions.npy
    col000.npy ...     one file per storage column (live rows, same order), or
    objects.pkl        the items of an object storage (pickle: see below)

**Saving** (:func:`save_table`) never leaves a moment where neither the previous checkpoint nor
the new one can be loaded. It writes and fsyncs every file into a hidden sibling
``.<name>.tmp-<id>`` (the manifest and its checksum last, then the directory), moves the previous
checkpoint aside to ``.<name>.old-<id>``, renames the new one into place, fsyncs the parent
directory after each rename, and only then deletes the old copy. :func:`load_table` reads ``path``
when it exists; when it does not (a save was killed between its two renames) it loads the newest
complete side copy instead (a complete ``.tmp-`` copy is the new checkpoint, else an ``.old-``
copy is the previous one). The next :func:`save_table` to the same path first puts such a copy
back in place and deletes leftovers. One process saves to a given path at a time.

**Loading treats the directory as untrusted input.** The manifest must match its checksum and
have the expected structure and types; every file it names must be listed with its size and
SHA-256, be a regular file (not a symlink) and resolve inside the checkpoint directory (no
``..``, no absolute paths); every array must have the dtype and shape the manifest implies
(``size`` rows, the spec's field shapes); keys must be unique, increasing and below
``next_key``; selector and limiter types must be known and their states consistent with the
items. Any problem raises :class:`~replaystore.CheckpointError` naming it, and a failed load
into ``memmap_dir`` leaves nothing behind there.

Arrays always load with ``allow_pickle=False``. The one exception is an object storage's
``objects.pkl``, unpickled only when the caller passes ``allow_pickle=True``: unpickling runs
arbitrary code chosen by whoever wrote the file, so checksums do not make it safe (anyone who
can write the file can write matching checksums). Pass ``allow_pickle=True`` only for
checkpoints you wrote yourself or otherwise trust.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import math
import os
import pickle
import re
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from .episodes.consistency import check_index_arrays
from .errors import CheckpointError, DiskFull, InvalidArgument, ReplayError, StorageError
from .snapshot import META_DTYPES, TableSnapshot
from .storage import Storage
from .storage.describe import from_description

T = TypeVar("T")

FORMAT = "replaystore-checkpoint"
VERSION = 2  # 2: manifest.sha256, fsync'd files, recoverable side copies; 1 (read only): no manifest checksum
MANIFEST = "manifest.json"
CHECKSUM = "manifest.sha256"
_META = META_DTYPES
# per-step episode structure of an episodic table (see replaystore.episodes.index)
_EPISODE_ROWS = {"stream": np.int64, "t": np.int64, "episode": np.int64, "pos": np.int64, "flags": np.uint8}
_KINDS = ("columns", "memmap", "frames", "compressed", "objects")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _at(point: str) -> None:
    """A named point of :func:`save_table` (a no-op; crash tests replace it to kill the process there).

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


def _fsync_dir(path: Path) -> None:
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
    tmps, olds = [], []
    for p in parent.iterdir():
        if p.name.startswith(f".{name}.tmp-"):
            tmps.append(p)
        elif p.name.startswith(f".{name}.old-"):
            olds.append(p)
    return tmps, olds


def _recover(path: Path) -> None:
    """Prepare ``path`` for a save: put back the copy an interrupted save left, delete leftovers.

    If ``path`` is missing, the copy :func:`load_table` would read is renamed into place first, so
    there is never a moment without a loadable checkpoint.
    """
    if not (path.exists() or path.is_symlink()):
        found = _locate(path, required=False)
        if found is not None and found[0] != path:
            os.replace(found[0], path)
            _fsync_dir(path.parent)
    tmps, olds = _side_copies(path)
    for p in tmps + olds:
        shutil.rmtree(p, ignore_errors=True)


def save_table(table: Any, path: str | os.PathLike) -> None:
    """Write ``table`` (anything with a ``snapshot()``, i.e. a Table) to ``path``: see :func:`save_snapshot`."""
    save_snapshot(table.snapshot(), path)


def save_snapshot(snapshot: TableSnapshot, path: str | os.PathLike) -> None:
    """Write ``snapshot`` to the directory ``path``, replacing any checkpoint there (see the module doc).

    Raises:
        InvalidArgument: ``path`` is a file or a non-empty directory that is not a checkpoint.
        DiskFull: the file system is full (``path``, and the bytes the checkpoint needs, roughly).
        StorageError: any other I/O error while writing.
        On every error the previous checkpoint is in place and loadable, and no temporary copy
        is left behind.
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
        files: dict[str, dict] = {}
        for name, arr in meta.items():
            fname = f"meta_{name}.npy"
            files[fname] = _write_file(tmp / fname, lambda f, a=arr: np.save(f, a, allow_pickle=False))
        for name, arr in (episodes or {}).get("rows", {}).items():
            fname = f"episodes_{name}.npy"
            files[fname] = _write_file(tmp / fname, lambda f, a=arr: np.save(f, a, allow_pickle=False))
        if snapshot.storage["kind"] == "objects":
            files["objects.pkl"] = _write_file(
                tmp / "objects.pkl", lambda f: pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL))
            manifest["columns"] = None
        else:
            columns = {}
            for i, (col_path, arr) in enumerate(payload.items()):
                fname = f"col{i:03d}.npy"
                files[fname] = _write_file(tmp / fname, lambda f, a=arr: np.save(f, a, allow_pickle=False))
                columns[col_path] = fname
            manifest["columns"] = columns
        manifest["files"] = files
        raw = json.dumps(manifest, indent=1).encode()
        _write_file(tmp / MANIFEST, lambda f: f.write(raw))
        _write_file(tmp / CHECKSUM, lambda f: f.write(f"{hashlib.sha256(raw).hexdigest()}  {MANIFEST}\n".encode()))
        _at("manifest")
        _fsync_dir(tmp)
        _at("synced")
        if path.exists():
            os.replace(path, old)
            moved_aside = True
            _fsync_dir(path.parent)
            _at("old-aside")
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        _at("in-place")
    except BaseException as e:
        if moved_aside and not path.exists():
            os.replace(old, path)  # the new copy never arrived: put the previous one back
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and not isinstance(e, ReplayError):
            wanted = _estimate_bytes(meta, payload)
            cls = DiskFull if e.errno in (errno.ENOSPC, errno.EDQUOT) else StorageError
            raise cls(f"saving a checkpoint to {path} failed ({e.strerror or e}); it needs about {wanted:,} "
                      "bytes; the previous checkpoint is unchanged", path=str(path), wanted=wanted) from e
        raise
    if moved_aside:
        shutil.rmtree(old, ignore_errors=True)
    _at("done")


def _estimate_bytes(meta: dict, payload: Any) -> int:
    """Bytes a checkpoint of these arrays needs, roughly (object payloads: not counted)."""
    arrays = list(meta.values()) + (list(payload.values()) if isinstance(payload, dict) else [])
    return int(sum(a.nbytes for a in arrays)) + 64 * 1024


# -- validating --------------------------------------------------------------------------------------
def _type_name(kind: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", dict: "an object", list: "a list",
             type(None): "null"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _is(value: Any, kind: Any) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    for k in kinds:
        if k is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if k is float and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return True
        if k not in (int, float) and isinstance(value, k):
            return True
    return False


def _field(obj: Any, key: str, kind: Any, where: str) -> Any:
    """``obj[key]``, checked to be a ``kind``; else a :class:`CheckpointError` naming it."""
    if not isinstance(obj, dict):
        raise CheckpointError(f"manifest field {where or '<top>'} must be an object, got {type(obj).__name__}")
    name = f"{where}.{key}" if where else key
    if key not in obj:
        raise CheckpointError(f"manifest field {name} is missing")
    value = obj[key]
    if not _is(value, kind):
        raise CheckpointError(f"manifest field {name} must be {_type_name(kind)}, got {str(value)[:60]!r}")
    return value


def _inside(root: Path, name: Any, what: str) -> Path:
    """The file ``root/name`` after checking ``name`` is a plain file name that stays inside ``root``."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name \
            or "\x00" in name or os.path.isabs(name):
        raise CheckpointError(f"{what}: {name!r} is not a plain file name inside the checkpoint directory")
    f = root / name
    if f.is_symlink():
        raise CheckpointError(f"{what}: {f} is a symbolic link; a checkpoint holds only regular files")
    if not f.resolve().is_relative_to(root.resolve()):
        raise CheckpointError(f"{what}: {f} resolves outside the checkpoint directory")
    return f


def _digest(path: Path) -> tuple[int, str]:
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            n += len(block)
    return n, h.hexdigest()


def _read_manifest(path: Path) -> dict:
    """The manifest of the checkpoint directory ``path``, verified (checksum, structure, every file)."""
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint directory at {path}")
    mpath = path / MANIFEST
    if mpath.is_symlink() or not mpath.is_file():
        raise CheckpointError(f"{path} has no {MANIFEST}: not a replaystore checkpoint")
    try:
        raw = mpath.read_bytes()
        manifest = json.loads(raw)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{mpath} is unreadable or corrupted: {e}") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{mpath} must hold a JSON object, got {type(manifest).__name__}")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{mpath} is not a replaystore checkpoint (format {manifest.get('format')!r})")
    cpath = path / CHECKSUM
    if cpath.exists() or cpath.is_symlink():
        if cpath.is_symlink():
            raise CheckpointError(f"{cpath} is a symbolic link; a checkpoint holds only regular files")
        try:
            want = cpath.read_text().split()[0]
        except (OSError, ValueError, IndexError):
            want = ""
        if want != hashlib.sha256(raw).hexdigest():
            raise CheckpointError(f"{mpath} is corrupted or altered: its SHA-256 does not match {CHECKSUM}")
    elif manifest.get("version") != 1:
        raise CheckpointError(f"{path} has no {CHECKSUM}: the manifest cannot be verified")
    if manifest.get("version") not in (1, VERSION):
        raise CheckpointError(f"{mpath} has format version {manifest.get('version')!r}, "
                              f"this reader knows 1 and {VERSION}")
    _check_structure(manifest)
    files = manifest["files"]
    for name, info in files.items():
        f = _inside(path, name, "manifest field files")
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path} is missing {name}")
        size = f.stat().st_size
        if size != info["bytes"]:
            raise CheckpointError(f"{f} is truncated or altered: {size} bytes, manifest says {info['bytes']}")
        if _digest(f)[1] != info["sha256"]:
            raise CheckpointError(f"{f} is corrupted: its SHA-256 does not match the manifest")
    # every file the loader will open must be one of the verified ones
    needed = [f"meta_{n}.npy" for n in _META]
    if "episodes" in manifest:
        needed += [f"episodes_{n}.npy" for n in _EPISODE_ROWS]
    if manifest["storage"]["kind"] == "objects":
        needed.append("objects.pkl")
    else:
        needed += list((manifest["columns"] or {}).values())
    for name in needed:
        if name not in files:
            raise CheckpointError(f"checkpoint {path}: {name!r} is used but not listed (with its checksum) "
                                  "in the manifest's files")
    return manifest


def _check_structure(m: dict) -> None:
    """Raise :class:`CheckpointError` unless the manifest has the keys and types a loader reads."""
    files = _field(m, "files", dict, "")
    for name, info in files.items():
        _field(info, "bytes", int, f"files[{name!r}]")
        if info["bytes"] < 0:
            raise CheckpointError(f"manifest field files[{name!r}].bytes is negative")
        if not _SHA256.fullmatch(_field(info, "sha256", str, f"files[{name!r}]")):
            raise CheckpointError(f"manifest field files[{name!r}].sha256 is not a SHA-256 hex digest")
    size = _field(m, "size", int, "")
    t = _field(m, "table", dict, "")
    _field(t, "name", str, "table")
    capacity = _field(t, "capacity", int, "table")
    if capacity < 1:
        raise CheckpointError(f"manifest field table.capacity must be >= 1, got {capacity}")
    if not 0 <= size <= capacity:
        raise CheckpointError(f"manifest field size {size} is not within 0..capacity ({capacity})")
    for key, kind in (("max_times_sampled", int), ("max_staleness", (int, type(None))),
                      ("default_timeout", (float, type(None))), ("seed", (int, type(None))),
                      ("next_key", int), ("model_version", int), ("max_priority", float),
                      ("counters", dict), ("blocked", dict), ("rng", dict)):
        _field(t, key, kind, "table")
    if t["next_key"] < size:
        raise CheckpointError(f"manifest field table.next_key ({t['next_key']}) is smaller than the item count")
    for name in t["counters"]:
        _field(t["counters"], name, int, "table.counters")
    for name in t["blocked"]:
        _field(t["blocked"], name, float, "table.blocked")
    st = _field(m, "storage", dict, "")
    kind = _field(st, "kind", str, "storage")
    if kind not in _KINDS:
        raise CheckpointError(f"manifest field storage.kind {kind!r} is unknown; known: {list(_KINDS)}")
    spec = st.get("spec")
    if kind == "objects":
        if _field(m, "columns", type(None), "") is not None or spec is not None:
            raise CheckpointError("manifest of an object storage must have no columns and no spec")
    else:
        columns = _field(m, "columns", dict, "")
        if spec is None:
            if columns or size:
                raise CheckpointError("manifest has columns or items but no storage.spec")
        else:
            _field(st, "spec", dict, "storage")
            for p, f in spec.items():
                shape = _field(f, "shape", list, f"storage.spec[{p!r}]")
                if not all(_is(d, int) and d >= 0 for d in shape):
                    raise CheckpointError(f"manifest field storage.spec[{p!r}].shape must list integers >= 0")
                name = _field(f, "dtype", str, f"storage.spec[{p!r}]")
                try:
                    dt = np.dtype(name)
                except Exception:  # noqa: BLE001 - NumPy raises TypeError, ValueError, even SyntaxError
                    raise CheckpointError(f"manifest field storage.spec[{p!r}].dtype is not a NumPy dtype") from None
                if dt.hasobject:
                    raise CheckpointError(f"manifest field storage.spec[{p!r}].dtype is an object dtype")
            if set(columns) != set(spec):
                raise CheckpointError(f"manifest columns {sorted(columns)} do not match storage.spec "
                                      f"{sorted(spec)}")
            for p in columns:
                _field(columns, p, str, "columns")
    for part in ("sampler", "remover", "rate_limiter"):
        d = _field(m, part, dict, "")
        _field(_field(d, "config", dict, part), "type", str, f"{part}.config")
        _field(d, "state", dict, part)


def _load_npy(path: Path, name: str) -> np.ndarray:
    try:
        return np.load(path / name, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise CheckpointError(f"{path / name} is unreadable: {e}") from None


def _check_array(arr: np.ndarray, name: str, dtype: Any, shape: tuple) -> None:
    if arr.dtype != np.dtype(dtype) or arr.shape != shape:
        raise CheckpointError(f"{name} holds {arr.dtype} {arr.shape}, the manifest implies {np.dtype(dtype)} {shape}")


def _locate(path: Path, required: bool = True) -> tuple[Path, dict] | None:
    """The directory to load for ``path`` and its verified manifest (see the module doc)."""
    if path.exists() or path.is_symlink():
        return path, _read_manifest(path)
    tmps, olds = _side_copies(path)
    found = []
    for p in tmps:  # the newest complete save that was not yet renamed into place
        try:
            m = _read_manifest(p)
        except CheckpointError:
            continue
        found.append((m.get("saved_ns", 0), p, m))
    if found:
        _, p, m = max(found, key=lambda x: (x[0], x[1].name))
        return p, m
    for p in sorted(olds):
        try:
            return p, _read_manifest(p)
        except CheckpointError:
            continue
    if required:
        raise CheckpointError(f"no checkpoint directory at {path}")
    return None


def read_manifest(path: str | os.PathLike) -> dict:
    """The verified manifest of the checkpoint at ``path`` (for ``replaystore inspect``)."""
    return _locate(Path(path))[1]


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
def load_snapshot(path: str | os.PathLike, build: Callable[[TableSnapshot, Storage], T], allow_pickle: bool = False,
                  memmap_dir: str | None = None) -> T:
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


def _build(path: Path, m: dict, build: Callable[[TableSnapshot, Storage], T], allow_pickle: bool,
           memmap_dir: Path | None) -> T:
    t = m["table"]
    n = m["size"]
    capacity = t["capacity"]
    meta = {name: _load_npy(path, f"meta_{name}.npy") for name in _META}
    for name, dtype in _META.items():
        _check_array(meta[name], f"meta_{name}.npy", dtype, (n,))
    keys = meta["keys"]
    if n and (keys[0] < 0 or (n > 1 and not bool((keys[1:] > keys[:-1]).all()))):
        raise CheckpointError(f"{path}: meta_keys.npy is not a list of distinct keys >= 0, oldest first")
    if n and t["next_key"] <= int(keys[-1]):
        raise CheckpointError(f"{path}: manifest field table.next_key ({t['next_key']}) is not above the "
                              f"largest stored key ({int(keys[-1])}): new keys would collide")
    if not np.isfinite(meta["priorities"]).all():
        raise CheckpointError(f"{path}: meta_priorities.npy holds NaN or infinite priorities")
    if n and meta["times_sampled"].min() < 0:
        raise CheckpointError(f"{path}: meta_times_sampled.npy holds negative counts")
    desc = m["storage"]
    kind = desc["kind"]
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
        if not isinstance(payload, list) or len(payload) != n:
            raise CheckpointError(f"{path / 'objects.pkl'} does not hold a list of {n} items")
    else:
        flat = desc["spec"] or {}
        payload = {}
        for col, fname in (m["columns"] or {}).items():
            arr = _load_npy(path, fname)
            field = flat[col]
            _check_array(arr, fname, field["dtype"], (n, *field["shape"]))
            payload[col] = arr
    episodes = None
    if "episodes" in m:
        # the episode arrays: dtype and shape, then that they form one consistent history
        rows = {name: _load_npy(path, f"episodes_{name}.npy") for name in _EPISODE_ROWS}
        for name, dtype in _EPISODE_ROWS.items():
            _check_array(rows[name], f"episodes_{name}.npy", dtype, (n,))
        ep = _field(m, "episodes", dict, "")
        episodes = {"config": _field(ep, "config", dict, "episodes"), "streams": ep.get("streams"), "rows": rows}
        check_index_arrays(rows, ep.get("streams"), where=str(path))
    _check_memory(path, capacity, desc, in_ram=not (kind == "memmap" and memmap_dir is not None))
    lim = m["rate_limiter"]["state"]
    for key in ("inserts", "samples", "deletes"):
        if _field(lim, key, int, "rate_limiter.state") < 0:
            raise CheckpointError(f"{path}: manifest field rate_limiter.state.{key} is negative")
    # (inserts - deletes is not compared with the item count: a limiter object shared by two
    # tables, a misuse but a harmless one, counts both, and its checkpoints must still load)
    config_keys = ("name", "capacity", "max_times_sampled", "max_staleness", "default_timeout", "seed")
    snapshot = TableSnapshot(
        config={k: t[k] for k in config_keys},
        state={k: v for k, v in t.items() if k not in config_keys},
        sampler=m["sampler"], remover=m["remover"], rate_limiter=m["rate_limiter"], storage=desc,
        meta=meta, payload=payload, episodes=episodes,
    )
    try:
        storage = from_description(desc, capacity, memmap_dir)
        return build(snapshot, storage)
    except CheckpointError as e:  # the state does not fit together
        raise CheckpointError(f"{path}: {e}") from None
    except (ReplayError, KeyError, TypeError, ValueError, OverflowError, MemoryError) as e:
        raise CheckpointError(f"{path}: manifest has an invalid table configuration: {e!r}") from None


def _check_memory(path: Path, capacity: int, desc: dict, in_ram: bool) -> None:
    """Refuse a capacity whose preallocated table could not fit in this machine's memory.

    A table preallocates per-slot metadata, the key index, selector trees and (in RAM) one row per
    field: a tampered ``capacity`` must raise, not exhaust memory or swap.
    """
    row = 96  # metadata row, free-slot stack, key-index ring, selector trees (bytes per slot)
    if in_ram:
        for f in (desc.get("spec") or {}).values():
            row += int(np.prod(f["shape"], dtype=np.float64) * np.dtype(f["dtype"]).itemsize)
    need = capacity * row
    frames, obs = desc.get("frame_capacity"), (desc.get("spec") or {}).get(desc.get("obs_key"))
    if desc["kind"] == "frames" and _is(frames, int) and obs is not None and obs["shape"]:
        need += int(frames * np.prod(obs["shape"][1:], dtype=np.float64) * np.dtype(obs["dtype"]).itemsize)
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return
    if need > total:
        raise CheckpointError(f"{path}: manifest fields table.capacity ({capacity:,}) and the storage's need "
                              f"about {need:,} bytes of memory, more than this machine has ({total:,})")
