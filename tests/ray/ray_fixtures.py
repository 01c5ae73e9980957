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
