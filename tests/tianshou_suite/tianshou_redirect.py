"""Pytest plugin: run Tianshou's own buffer tests with replaystore's classes in place of Tianshou's.

Loaded by ``run_tianshou_suite.py`` with ``-p tianshou_redirect``. Nothing in Tianshou's files is
edited: while each test module is being imported, the names below in ``tianshou.data`` are the
replaystore classes, so the test file's ``from tianshou.data import ReplayBuffer, ...`` gets ours;
afterwards Tianshou's names are restored (Tianshou's own code, e.g. ``CachedReplayBuffer``, keeps
its classes). ``REPLAYSTORE_TIANSHOU_REDIRECT=none`` runs Tianshou unchanged (a baseline).
"""

from __future__ import annotations

import os

import pytest

NAMES = (
    "ReplayBuffer",
    "VectorReplayBuffer",
    "PrioritizedReplayBuffer",
    "PrioritizedVectorReplayBuffer",
    "HERReplayBuffer",
    "HERVectorReplayBuffer",
    "ReplayBufferManager",
    "PrioritizedReplayBufferManager",
    "HERReplayBufferManager",
    "CachedReplayBuffer",
)
_classes: dict[str, type] = {}


def pytest_configure(config) -> None:  # noqa: D103
    if os.environ.get("REPLAYSTORE_TIANSHOU_REDIRECT", "").strip() == "none":
        print("[tianshou_redirect] baseline: Tianshou's own buffers")
        return
    from replaystore.compat import tianshou as ours

    _classes.update({name: getattr(ours, name) for name in NAMES})
    print(f"[tianshou_redirect] Tianshou buffers redirected to replaystore: {', '.join(NAMES)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):  # noqa: D103
    if not _classes or not isinstance(collector, pytest.Module):
        yield
        return
    import tianshou.data as data

    saved = {name: getattr(data, name) for name in _classes}
    for name, cls in _classes.items():
        setattr(data, name, cls)
    try:
        yield
    finally:
        for name, cls in saved.items():
            setattr(data, name, cls)
