"""Pytest plugin: run Stable-Baselines3's own ``tests/test_her.py`` against replaystore's HER buffer.

Load it with ``-p sb3_her_redirect`` (this directory on ``PYTHONPATH``). It makes
``stable_baselines3.HerReplayBuffer`` (the name SB3's test file imports) replaystore's
:class:`~replaystore.integrations.sb3_her.ReplaystoreHerReplayBuffer`. SB3's own code keeps its
class; ours subclasses it, so SB3's ``isinstance`` checks (passing the env, ``set_env`` on load)
still hold. Nothing of SB3's is copied or edited. Command: see docs/sequences.md ("Hindsight").
"""

from __future__ import annotations


def pytest_configure(config) -> None:  # noqa: D103, ARG001
    import stable_baselines3

    from replaystore.integrations.sb3_her import ReplaystoreHerReplayBuffer

    stable_baselines3.HerReplayBuffer = ReplaystoreHerReplayBuffer
    print("[sb3_her_redirect] stable_baselines3.HerReplayBuffer -> ReplaystoreHerReplayBuffer")
