"""Test configuration: keep any Ray instance on loopback, and shared helpers."""

import itertools
import os
import subprocess

# Ray binds to the machine's external address unless this is set before `import ray`.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


def transitions(n: int, start: int = 0) -> dict:
    """A batch of small transitions whose ``id`` field identifies each row."""
    ids = np.arange(start, start + n, dtype=np.int64)
    return {
        "obs": np.repeat(ids[:, None].astype(np.float32), 4, axis=1),
        "action": (ids % 3).astype(np.int64),
        "reward": ids.astype(np.float32) * 0.5,
        "id": ids,
    }


@pytest.fixture
def batch():
    return transitions


@pytest.fixture
def tmpfs_factory(tmp_path):
    """Mount small tmpfs file systems for full-disk tests: ``tmpfs_factory("2m") -> Path``.

    Needs root (the test machines are); skips the test with the reason otherwise. Every mount is
    unmounted (lazily, so open files cannot block it) when the test ends.
    """
    mounts = []

    def mount(size: str = "2m", name: str | None = None):
        mnt = tmp_path / (name or f"tmpfs{len(mounts)}")
        mnt.mkdir()
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True, text=True
        )
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}): needs root")
        mounts.append(mnt)
        return mnt

    yield mount
    for mnt in mounts:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


#: the spec of ``transitions`` rows, for shared tables (their columns are sized up front)
SHARED_SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32), "id": ((), np.int64)}
_shared_names = itertools.count()


@pytest.fixture(params=["local", "shared"])
def make(request, tmp_path):
    """``make(capacity, **kw)``: an in-process Table, or a SharedTable with the same options."""
    import replaystore as rs
    from replaystore.shared import SharedTable

    opened = []

    def build(capacity=10, **kw):
        kw.setdefault("seed", 0)
        if request.param == "local":
            return rs.Table(capacity, spec=SHARED_SPEC, **kw)
        t = SharedTable.create(f"t{next(_shared_names)}", capacity, SHARED_SPEC, directory=tmp_path, **kw)
        opened.append(t)
        return t

    yield build
    for t in opened:
        t.close()
