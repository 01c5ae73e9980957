"""Shared Ray fixtures for tests/ray (a helper module, not a conftest: ``from conftest import`` in
the top-level tests must keep finding tests/conftest.py).

Usage: a module-scoped fixture that calls :func:`start_ray` once and ``ray.shutdown()`` at the end.
"""

import os

import numpy as np
import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def transitions(n: int, start: int = 0) -> dict:
    """A batch of small transitions whose ``id`` field identifies each row."""
    ids = np.arange(start, start + n, dtype=np.int64)
    return {
        "obs": np.repeat(ids[:, None].astype(np.float32), 4, axis=1),
        "action": (ids % 3).astype(np.int64),
        "reward": ids.astype(np.float32) * 0.5,
        "id": ids,
    }


def start_ray(**kwargs):
    """``ray.init`` a fresh local instance (2 CPUs, no dashboard) and return ``ray``."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("lmdb")
    if ray.is_initialized():
        ray.shutdown()
    kwargs.setdefault("address", "local")  # a new instance, whatever a stale ray_current_cluster says
    kwargs.setdefault("num_cpus", 2)
    kwargs.setdefault("include_dashboard", False)
    kwargs.setdefault("log_to_driver", False)
    # Ray workers import test-module functions by name: let them find tests/ray and tests/.
    here = os.path.dirname(os.path.abspath(__file__))
    tests = os.path.dirname(here)
    dirs = (here, tests, os.path.join(tests, "compat"), os.environ.get("PYTHONPATH"))
    path = os.pathsep.join(p for p in dirs if p)
    kwargs.setdefault("runtime_env", {"env_vars": {"PYTHONPATH": path}})
    ray.init(**kwargs)
    return ray


def wait_restarted(client, deadline_s: float = 90):
    """Wait until the service behind ``client`` answers ``ping`` as a restarted actor."""
    import time

    import replaystore as rs

    deadline = time.monotonic() + deadline_s
    while True:
        try:
            if client.ping()["restarted"]:
                return
        except (rs.Closed, rs.Timeout):
            pass
        assert time.monotonic() < deadline, "the service did not restart"
        time.sleep(0.2)


def log_then_replay(d: str, make_table, run_ops, ops, ops2, checkpoint: bool):
    """Run ``ops``, (a checkpoint,) ``ops2`` on a logged ``make_table()``; rebuild it from checkpoint + log.

    Returns ``(table, logged, restored, logged_restored, next_id)``; ``logged`` is closed,
    ``logged_restored`` is open (on the same log).
    """
    import replaystore as rs
    from replaystore.ray.logged_table import LoggedTable
    from replaystore.ray.wal import WalConfig

    cfg = WalConfig(dir=d, fsync="never")
    t = make_table()
    lt = LoggedTable.open(t, os.path.join(d, "wal"), cfg)
    nid = run_ops(lt, ops)
    if checkpoint:
        lt.save(os.path.join(d, "ckpt"))
    nid = run_ops(lt, ops2, nid)
    lt.close()
    restored = rs.Table.load(os.path.join(d, "ckpt")) if checkpoint else make_table()
    return t, lt, restored, LoggedTable.open(restored, os.path.join(d, "wal"), cfg), nid
