"""Pytest plugin: run Stable-Baselines3's own tests with replaystore's buffer classes as SB3's defaults.

Loaded by ``run_sb3_suite.py`` with ``-p sb3_redirect``. Nothing in SB3's files is edited; two
names are redirected:

- in ``stable_baselines3.common.off_policy_algorithm`` (for the whole run): ``ReplayBuffer``,
  ``DictReplayBuffer`` and ``NStepReplayBuffer``, the classes the algorithms pick when
  ``replay_buffer_class`` is ``None``;
- in ``stable_baselines3.common.buffers`` (only while a test module is being imported): the same
  names, so ``from stable_baselines3.common.buffers import ReplayBuffer`` in a test file, and the
  parametrisations built from it, get the replaystore classes. Restoring them afterwards keeps
  SB3's own code intact (``DictReplayBuffer.__init__`` calls ``super(ReplayBuffer, self)``, which
  ``HerReplayBuffer`` reaches).

The one ``isinstance(buffer, ReplayBuffer)`` check in ``OffPolicyAlgorithm.load_replay_buffer``
runs against SB3's original class, of which every replaystore class is a subclass (so a
``HerReplayBuffer`` still loads). ``REPLAYSTORE_SB3_REDIRECT`` chooses the names
(comma-separated; ``none`` runs SB3 unchanged, for a baseline).
"""

from __future__ import annotations

import os

import pytest

_ALL = ("ReplayBuffer", "DictReplayBuffer", "NStepReplayBuffer")
_classes: dict[str, type] = {}


def pytest_configure(config) -> None:  # noqa: D103
    names = os.environ.get("REPLAYSTORE_SB3_REDIRECT", ",".join(_ALL))
    chosen = [] if names.strip() == "none" else [n.strip() for n in names.split(",") if n.strip()]
    unknown = set(chosen) - set(_ALL)
    if unknown:
        raise ValueError(f"REPLAYSTORE_SB3_REDIRECT: unknown names {sorted(unknown)}; choose from {_ALL}")
    if not chosen:
        print("[sb3_redirect] baseline: SB3's own buffers")
        return
    import stable_baselines3.common.buffers as buffers
    import stable_baselines3.common.off_policy_algorithm as opa

    from replaystore.integrations import sb3 as ours

    original_replay_buffer = buffers.ReplayBuffer
    _classes.update({name: getattr(ours, f"Replaystore{name}") for name in chosen})
    for name, cls in _classes.items():
        setattr(opa, name, cls)

    if "ReplayBuffer" in chosen:
        load = opa.OffPolicyAlgorithm.load_replay_buffer

        def load_replay_buffer(self, *args, **kwargs):
            # the assertion inside reads the module's name ReplayBuffer: SB3's class, as unpatched
            opa.ReplayBuffer = original_replay_buffer
            try:
                return load(self, *args, **kwargs)
            finally:
                opa.ReplayBuffer = _classes["ReplayBuffer"]

        opa.OffPolicyAlgorithm.load_replay_buffer = load_replay_buffer
    print(f"[sb3_redirect] SB3 buffers redirected to replaystore: {', '.join(chosen)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):  # noqa: D103
    if not _classes or not isinstance(collector, pytest.Module):
        yield
        return
    import stable_baselines3.common.buffers as buffers

    saved = {name: getattr(buffers, name) for name in _classes}
    for name, cls in _classes.items():
        setattr(buffers, name, cls)
    try:
        yield
    finally:
        for name, cls in saved.items():
            setattr(buffers, name, cls)
