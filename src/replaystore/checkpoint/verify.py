"""Checks of a checkpoint directory read as untrusted input: the manifest, its files, their arrays.

:func:`read_verified_manifest` verifies a manifest (its checksum, its structure and types, every
file it lists: a regular file inside the directory with the listed size and SHA-256);
:func:`load_npy`, :func:`check_array` and :func:`check_memory` check what the loader then reads.
Each problem is a :class:`~replaystore.CheckpointError` naming it. See the package doc.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError
from ..rows import VERSION_MAX, VERSION_MIN
from ..snapshot import META_DTYPES

FORMAT = "replaystore-checkpoint"
VERSION = 2  # 2: manifest.sha256, fsync'd files, recoverable side copies; 1 (read only): no manifest checksum
MANIFEST = "manifest.json"
CHECKSUM = "manifest.sha256"
META = META_DTYPES
# per-step episode structure of an episodic table (see replaystore.episodes.index)
EPISODE_ROWS = {"stream": np.int64, "t": np.int64, "episode": np.int64, "pos": np.int64, "flags": np.uint8}
KINDS = ("columns", "memmap", "frames", "compressed", "objects")
SHA256 = re.compile(r"[0-9a-f]{64}")


def type_name(kind: Any) -> str:
    """How a manifest error names a JSON type (or a tuple of them)."""
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        dict: "an object",
        list: "a list",
        type(None): "null",
    }
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def is_a(value: Any, kind: Any) -> bool:
    """Whether a JSON value is a ``kind`` (ints are not bools; numbers are finite)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    for k in kinds:
        if k is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if k is float and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return True
        if k not in (int, float) and isinstance(value, k):
            return True
    return False


def manifest_field(obj: Any, key: str, kind: Any, where: str) -> Any:
    """``obj[key]``, checked to be a ``kind``; else a :class:`CheckpointError` naming it."""
    if not isinstance(obj, dict):
        raise CheckpointError(f"manifest field {where or '<top>'} must be an object, got {type(obj).__name__}")
    name = f"{where}.{key}" if where else key
    if key not in obj:
        raise CheckpointError(f"manifest field {name} is missing")
    value = obj[key]
    if not is_a(value, kind):
        raise CheckpointError(f"manifest field {name} must be {type_name(kind)}, got {str(value)[:60]!r}")
    return value


def inside(root: Path, name: Any, what: str) -> Path:
    """The file ``root/name`` after checking ``name`` is a plain file name that stays inside ``root``."""
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\x00" in name
        or os.path.isabs(name)
    ):
        raise CheckpointError(f"{what}: {name!r} is not a plain file name inside the checkpoint directory")
    f = root / name
    if f.is_symlink():
        raise CheckpointError(f"{what}: {f} is a symbolic link; a checkpoint holds only regular files")
    if not f.resolve().is_relative_to(root.resolve()):
        raise CheckpointError(f"{what}: {f} resolves outside the checkpoint directory")
    return f


def digest(path: Path) -> tuple[int, str]:
    """``(bytes, SHA-256 hex)`` of the file ``path``."""
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            n += len(block)
    return n, h.hexdigest()


def read_verified_manifest(path: Path) -> dict:
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
        raise CheckpointError(
            f"{mpath} has format version {manifest.get('version')!r}, this reader knows 1 and {VERSION}"
        )
    check_structure(manifest)
    files = manifest["files"]
    for name, info in files.items():
        f = inside(path, name, "manifest field files")
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path} is missing {name}")
        size = f.stat().st_size
        if size != info["bytes"]:
            raise CheckpointError(f"{f} is truncated or altered: {size} bytes, manifest says {info['bytes']}")
        if digest(f)[1] != info["sha256"]:
            raise CheckpointError(f"{f} is corrupted: its SHA-256 does not match the manifest")
    # every file the loader will open must be one of the verified ones
    needed = [f"meta_{n}.npy" for n in META]
    if "episodes" in manifest:
        needed += [f"episodes_{n}.npy" for n in EPISODE_ROWS]
    if manifest["storage"]["kind"] == "objects":
        needed.append("objects.pkl")
    else:
        needed += list((manifest["columns"] or {}).values())
    for name in needed:
        if name not in files:
            raise CheckpointError(
                f"checkpoint {path}: {name!r} is used but not listed (with its checksum) in the manifest's files"
            )
    return manifest


#: the largest magnitude a manifest's integer counters may have (int64, with headroom for arithmetic)
INT_LIMIT = 2**62


def check_structure(m: dict) -> None:
    """Raise :class:`CheckpointError` unless the manifest has the keys and types a loader reads."""
    files = manifest_field(m, "files", dict, "")
    for name, info in files.items():
        manifest_field(info, "bytes", int, f"files[{name!r}]")
        if info["bytes"] < 0:
            raise CheckpointError(f"manifest field files[{name!r}].bytes is negative")
        if not SHA256.fullmatch(manifest_field(info, "sha256", str, f"files[{name!r}]")):
            raise CheckpointError(f"manifest field files[{name!r}].sha256 is not a SHA-256 hex digest")
    size = manifest_field(m, "size", int, "")
    t = manifest_field(m, "table", dict, "")
    manifest_field(t, "name", str, "table")
    capacity = manifest_field(t, "capacity", int, "table")
    if capacity < 1:
        raise CheckpointError(f"manifest field table.capacity must be >= 1, got {capacity}")
    if not 0 <= size <= capacity:
        raise CheckpointError(f"manifest field size {size} is not within 0..capacity ({capacity})")
    for key, kind in (
        ("max_times_sampled", int),
        ("max_staleness", (int, type(None))),
        ("default_timeout", (float, type(None))),
        ("seed", (int, type(None))),
        ("next_key", int),
        ("model_version", int),
        ("max_priority", float),
        ("counters", dict),
        ("blocked", dict),
        ("rng", dict),
    ):
        manifest_field(t, key, kind, "table")
    if t["next_key"] < size:
        raise CheckpointError(f"manifest field table.next_key ({t['next_key']}) is smaller than the item count")
    # keys, versions and counters are int64 in the table: leave room for the inserts still to come
    if t["next_key"] > INT_LIMIT:
        raise CheckpointError(f"manifest field table.next_key ({t['next_key']}) leaves no room for int64 keys")
    if not VERSION_MIN <= t["model_version"] <= VERSION_MAX:  # (the metadata row keeps versions as int32)
        raise CheckpointError(f"manifest field table.model_version ({t['model_version']}) is outside int32 range")
    for name in t["counters"]:
        if not -INT_LIMIT <= manifest_field(t["counters"], name, int, "table.counters") <= INT_LIMIT:
            raise CheckpointError(f"manifest field table.counters[{name!r}] is outside int64 range")
    for name in t["blocked"]:
        manifest_field(t["blocked"], name, float, "table.blocked")
    st = manifest_field(m, "storage", dict, "")
    kind = manifest_field(st, "kind", str, "storage")
    if kind not in KINDS:
        raise CheckpointError(f"manifest field storage.kind {kind!r} is unknown; known: {list(KINDS)}")
    spec = st.get("spec")
    if kind == "objects":
        if manifest_field(m, "columns", type(None), "") is not None or spec is not None:
            raise CheckpointError("manifest of an object storage must have no columns and no spec")
    else:
        columns = manifest_field(m, "columns", dict, "")
        if spec is None:
            if columns or size:
                raise CheckpointError("manifest has columns or items but no storage.spec")
        else:
            manifest_field(st, "spec", dict, "storage")
            for p, f in spec.items():
                shape = manifest_field(f, "shape", list, f"storage.spec[{p!r}]")
                if not all(is_a(d, int) and d >= 0 for d in shape):
                    raise CheckpointError(f"manifest field storage.spec[{p!r}].shape must list integers >= 0")
                name = manifest_field(f, "dtype", str, f"storage.spec[{p!r}]")
                try:
                    dt = np.dtype(name)
                except Exception:  # noqa: BLE001 - NumPy raises TypeError, ValueError, even SyntaxError
                    raise CheckpointError(f"manifest field storage.spec[{p!r}].dtype is not a NumPy dtype") from None
                if dt.hasobject:
                    raise CheckpointError(f"manifest field storage.spec[{p!r}].dtype is an object dtype")
            if set(columns) != set(spec):
                raise CheckpointError(f"manifest columns {sorted(columns)} do not match storage.spec {sorted(spec)}")
            for p in columns:
                manifest_field(columns, p, str, "columns")
    for part in ("sampler", "remover", "rate_limiter"):
        d = manifest_field(m, part, dict, "")
        manifest_field(manifest_field(d, "config", dict, part), "type", str, f"{part}.config")
        manifest_field(d, "state", dict, part)


def load_npy(path: Path, name: str) -> np.ndarray:
    """The array in ``path / name`` (no pickles), or :class:`CheckpointError`."""
    try:
        return np.load(path / name, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise CheckpointError(f"{path / name} is unreadable: {e}") from None


def check_array(arr: np.ndarray, name: str, dtype: Any, shape: tuple) -> None:
    """:class:`CheckpointError` unless ``arr`` has exactly ``dtype`` and ``shape``."""
    if arr.dtype != np.dtype(dtype) or arr.shape != shape:
        raise CheckpointError(f"{name} holds {arr.dtype} {arr.shape}, the manifest implies {np.dtype(dtype)} {shape}")


def check_memory(path: Path, capacity: int, desc: dict, in_ram: bool) -> None:
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
    if desc["kind"] == "frames" and is_a(frames, int) and obs is not None and obs["shape"]:
        need += int(frames * np.prod(obs["shape"][1:], dtype=np.float64) * np.dtype(obs["dtype"]).itemsize)
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return
    if need > total:
        raise CheckpointError(
            f"{path}: manifest fields table.capacity ({capacity:,}) and the storage's need "
            f"about {need:,} bytes of memory, more than this machine has ({total:,})"
        )
