"""Where shared tables live: names, paths, the listing of a directory, and whose processes are alive.

A table ``name`` lives in ``<directory>/replaystore-<name>/`` (default directory: ``/dev/shm``,
else the temp directory). :func:`list_segments` reads every table there (size, the processes that
hold it, whether it is orphaned) for ``replaystore shm``; :func:`remove_dir` removes one (renamed
aside first, so that new attachers fail at once). The segment itself: :mod:`replaystore.shared.segment`.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

from ..errors import InvalidArgument
from .errors import LayoutMismatch, SharedTableExists
from .header import HEADER_BYTES, MAX_PIDS, PIDS, W_CREATOR, W_RECOVERIES, pid_max, read_config

PREFIX = "replaystore-"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


def default_directory() -> Path:
    """Where shared tables live by default: ``/dev/shm`` (memory), else the temp directory."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    import tempfile

    return Path(tempfile.gettempdir())


def check_name(name: str) -> str:
    """``name`` if it is a valid table name (letters, digits, ``_ . -``; at most 100), else InvalidArgument."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgument(
            f"a shared table name is 1-100 letters, digits, '_', '.' or '-' "
            f"(not starting with '.' or '-'), got {name!r}"
        )
    return name


def path_of(name: str, directory: str | os.PathLike | None) -> Path:
    """The directory of table ``name``."""
    root = Path(directory) if directory is not None else default_directory()
    return root / f"{PREFIX}{check_name(name)}"


_PID_MAX = pid_max()


def remove_dir(path: Path) -> bool:
    """Remove a table directory: renamed aside first (new attachers fail at once), then deleted."""
    tomb = path.parent / f".{path.name}.gone-{secrets.token_hex(4)}"
    try:
        os.rename(path, tomb)
    except FileNotFoundError:
        return False
    shutil.rmtree(tomb, ignore_errors=True)
    return True


def exists_error(path: Path) -> SharedTableExists:
    """The error for a table directory ``path`` that exists (naming an orphan as such)."""
    name = path.name[len(PREFIX) :]
    info = next((s for s in list_segments(path.parent) if s["name"] == name), None)
    if info is not None and info["orphaned"]:
        return SharedTableExists(
            f"shared table {name!r} exists in {path.parent}, left by processes that "
            f"are gone: attach to it, or remove it with `replaystore shm rm {name}`"
        )
    return SharedTableExists(
        f"shared table {name!r} exists in {path.parent} (open in another process); attach to it, or choose another name"
    )


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, killed but not yet reaped by its parent, does not).

    A number that cannot be a pid (``<= 0``, above ``pid_max``: a damaged word) is no process.
    """
    if not 0 < pid <= _PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True  # (no /proc here: the signal said it exists)
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


def list_segments(directory: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """The shared tables in ``directory`` (default ``/dev/shm``): name, path, bytes, held, pids, orphaned.

    ``bytes``: the segment's size; ``held``: the bytes the file system holds for it (less while
    the table's deferred regions are unreserved).
    ``orphaned``: no process has it open (a leftover of crashed runs, or a table kept on purpose).
    ``error``: set when the segment cannot be read (not a table of this layout). ``incomplete``:
    a hidden directory left by a creator that died before its table was published (or a removal
    that was cut short); ``replaystore shm rm --all`` deletes those too.
    """
    root = Path(directory) if directory is not None else default_directory()
    out: list[dict[str, Any]] = []
    try:
        entries = sorted(p for p in root.iterdir() if p.name.startswith(PREFIX) and p.is_dir())
        hidden = sorted(p for p in root.iterdir() if p.name.startswith("." + PREFIX) and p.is_dir())
    except FileNotFoundError:
        return out
    for path in hidden:  # a creation that never finished, or a removal cut short
        m = re.search(r"\.tmp-(\d+)-", path.name)
        if m is None or not alive(int(m.group(1))):
            out.append(
                {
                    "name": path.name,
                    "path": str(path),
                    "orphaned": True,
                    "incomplete": True,
                    "bytes": 0,
                    "pids": [],
                    "error": "incomplete: its creator died, or its removal was cut short",
                }
            )
    for path in entries:
        info: dict[str, Any] = {"name": path.name[len(PREFIX) :], "path": str(path)}
        try:
            fd = os.open(path / "segment", os.O_RDWR)
        except OSError as e:
            info.update(orphaned=True, error=str(e), bytes=0, pids=[])
            out.append(info)
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                info["orphaned"] = True
            except BlockingIOError:
                info["orphaned"] = False
            st = os.fstat(fd)
            size = st.st_size
            info["bytes"] = size
            info["held"] = st.st_blocks * 512  # (a ring-mode table's deferred regions are a hole)
            try:
                if size < HEADER_BYTES:
                    raise LayoutMismatch("too short")
                with mmap.mmap(fd, size) as mm:
                    config = read_config(mm, path, size)
                    words = memoryview(mm).cast("q")
                    pids = [words[i] for i in range(PIDS, PIDS + MAX_PIDS) if words[i]]
                    info["creator_pid"] = words[W_CREATOR]
                    info["recoveries"] = words[W_RECOVERIES]
                    words.release()
                info["pids"] = [p for p in pids if alive(p)]
                info["capacity"] = config["capacity"]
            except LayoutMismatch as e:
                info.update(error=str(e), pids=[])
        finally:
            os.close(fd)
        out.append(info)
    return out


__all__ = [
    "PREFIX",
    "alive",
    "check_name",
    "default_directory",
    "exists_error",
    "list_segments",
    "path_of",
    "remove_dir",
]
