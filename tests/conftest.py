"""Test configuration: keep any Ray instance on loopback, and shared helpers."""

import os

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
