"""Pytest plugin: run TorchRL's own replay-buffer tests with replaystore's samplers as TorchRL's.

Loaded by ``run_torchrl_suite.py`` with ``-p torchrl_redirect``. Nothing in TorchRL's files is
edited; for the whole run the names below are rebound to replaystore's classes (subclasses of
TorchRL's) in every TorchRL namespace a test or TorchRL's own constructors read them from:

- ``PrioritizedSampler`` in ``torchrl.data``, ``torchrl.data.replay_buffers``,
  ``torchrl.data.replay_buffers.samplers`` (``from ... import PrioritizedSampler`` and
  ``samplers.PrioritizedSampler(...)`` in the tests) and in the modules of
  ``PrioritizedReplayBuffer`` / ``TensorDictPrioritizedReplayBuffer``, whose constructors build
  one by that name (so TorchRL's prioritized buffers run on replaystore's trees);
- ``SliceSampler``, ``SliceSamplerWithoutReplacement`` and ``PrioritizedSliceSampler`` in
  ``torchrl.data``, ``torchrl.data.replay_buffers`` and ``torchrl.data.replay_buffers.samplers``;
- ``LazyTensorStorage`` in ``torchrl.data``, ``torchrl.data.replay_buffers`` and
  ``torchrl.data.replay_buffers.storages`` (TorchRL's ``LazyMemmapStorage`` keeps TorchRL's base);
- ``ReplayBuffer``, ``TensorDictReplayBuffer``, ``PrioritizedReplayBuffer`` and
  ``TensorDictPrioritizedReplayBuffer`` (the buffers with the fast ``sample``) in ``torchrl.data`` and
  ``torchrl.data.replay_buffers`` only: TorchRL's own modules import them from the internal package
  ``torchrl.data.replay_buffers.replay_buffers`` (e.g. ``ParameterScheduler``'s ``isinstance`` check),
  which keeps TorchRL's classes.

TorchRL's other subclasses of these keep TorchRL's bases. ``REPLAYSTORE_TORCHRL_REDIRECT``
chooses the names (comma-separated; ``none`` runs TorchRL unchanged, for a baseline).
"""

from __future__ import annotations

import importlib
import os

_ALL = (
    "PrioritizedSampler",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "PrioritizedSliceSampler",
    "LazyTensorStorage",
    "ReplayBuffer",
    "TensorDictReplayBuffer",
    "PrioritizedReplayBuffer",
    "TensorDictPrioritizedReplayBuffer",
)
_BUFFERS = ("torchrl.data", "torchrl.data.replay_buffers")
_PUBLIC = ("torchrl.data", "torchrl.data.replay_buffers", "torchrl.data.replay_buffers.samplers")
_MODULES = {
    "PrioritizedSampler": (
        "torchrl.data",
        "torchrl.data.replay_buffers",
        "torchrl.data.replay_buffers.samplers",
        "torchrl.data.replay_buffers.replay_buffers.prioritized",
        "torchrl.data.replay_buffers.replay_buffers.prioritized_tensordict",
    ),
    "SliceSampler": _PUBLIC,
    "SliceSamplerWithoutReplacement": _PUBLIC,
    "PrioritizedSliceSampler": _PUBLIC,
    "LazyTensorStorage": ("torchrl.data", "torchrl.data.replay_buffers", "torchrl.data.replay_buffers.storages"),
    "ReplayBuffer": _BUFFERS,
    "TensorDictReplayBuffer": _BUFFERS,
    "PrioritizedReplayBuffer": _BUFFERS,
    "TensorDictPrioritizedReplayBuffer": _BUFFERS,
}


def pytest_configure(config) -> None:  # noqa: D103
    names = os.environ.get("REPLAYSTORE_TORCHRL_REDIRECT", ",".join(_ALL))
    chosen = [] if names.strip() == "none" else [n.strip() for n in names.split(",") if n.strip()]
    unknown = set(chosen) - set(_ALL)
    if unknown:
        raise ValueError(f"REPLAYSTORE_TORCHRL_REDIRECT: unknown names {sorted(unknown)}; choose from {_ALL}")
    if not chosen:
        print("[torchrl_redirect] baseline: TorchRL's own samplers")
        return
    from replaystore.integrations import torchrl as ours

    for name in chosen:
        cls = getattr(ours, name)
        for module in _MODULES[name]:
            mod = importlib.import_module(module)
            if not hasattr(mod, name):
                raise AttributeError(f"{module} has no {name}: not the TorchRL version this plugin targets")
            setattr(mod, name, cls)
    print(f"[torchrl_redirect] TorchRL samplers/storages redirected to replaystore: {', '.join(chosen)}")
