"""``ReplayBufferManager``: the remote buffer that many trainers send their containers to.

Stores, scores and replies as docs/compat/gfn.md, "The remote buffer" describes. The logic here is
transport-free; it runs as a named Ray actor (:meth:`ReplayBufferManager.start`, :mod:`.ray_backend`)
or as a torch.distributed rank (:meth:`ReplayBufferManager.run`, :mod:`.torch_backend`).
"""

from __future__ import annotations

import inspect
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .buffer import ReplayBuffer
from .strategies import NormBasedDiversePrioritizedReplayBuffer
from .timing import Timer

_STRATEGIES = ("min", "percentile", "ema")


class ReplayBufferManager:
    """Stores and scores containers sent by trainers (torchgfn's ``ReplayBufferManager``).

    Args:
        env: the environment (needed to rebuild torchgfn containers).
        rank: this manager's rank (torch backend) or index (Ray); informational on Ray.
        num_training_ranks: how many trainers report to this manager; it stops once all are done.
        scoring_function: ``f(container, sender=...) -> dict[str, float]`` (a function taking
            ``sender_rank=`` as in torchgfn also works). Default: ``{"score": inf}``.
        diverse_replay_buffer: store in a :class:`NormBasedDiversePrioritizedReplayBuffer`
            (``cutoff_distance``, ``p_norm_distance``); else a reward-prioritized ``ReplayBuffer``.
        capacity: capacity of the stored buffer.
        remote_manager_rank: forward what is stored to another manager (chaining), as in torchgfn.
        communication_backend: ``"ray"`` or ``"torch"`` (only used when chaining).
        timing: record phase timings (``recv``, ``replay_add``, ``scoring``, ``send``).
        store_locally: store the received containers (else only score them).
        baseline_strategy: ``"min"`` / ``"percentile"`` of the stored log-rewards once the buffer is
            full, else (and for ``"ema"``) an EMA of each batch's finite minimum log-reward.
        baseline_percentile: the quantile for ``"percentile"``.
        baseline_ema_alpha: the EMA weight of the newest batch.
        num_buffer_managers: how many managers shard the trainers (a warning explains that shard
            baselines diverge unless synchronised with :meth:`handle_baseline_sync`).
    """

    def __init__(
        self,
        env: Any = None,
        rank: int = 0,
        num_training_ranks: int = 1,
        scoring_function: Callable[..., dict[str, float]] | None = None,
        diverse_replay_buffer: bool = False,
        capacity: int = 10000,
        remote_manager_rank: Any = None,
        communication_backend: str = "ray",
        timing: bool = False,
        store_locally: bool = True,
        baseline_strategy: str = "min",
        baseline_percentile: float = 0.1,
        baseline_ema_alpha: float = 0.1,
        num_buffer_managers: int = 1,
        *,
        cutoff_distance: float = 0.0,
        p_norm_distance: float = 1.0,
        remote_manager: Any = None,
    ) -> None:
        if baseline_strategy not in _STRATEGIES:
            raise ValueError(f"baseline_strategy must be one of {_STRATEGIES}, got {baseline_strategy!r}")
        if num_buffer_managers > 1 and store_locally and baseline_strategy in ("min", "percentile"):
            warnings.warn(
                f"{num_buffer_managers} buffer managers with baseline_strategy={baseline_strategy!r}: each "
                "shard computes its own baseline, so they diverge unless synchronised (BASELINE_SYNC)",
                UserWarning,
                stacklevel=2,
            )
        self.env = env
        self.rank = rank
        self.num_training_ranks = int(num_training_ranks)
        self.scoring_function = scoring_function or self.default_scoring_function
        self.diverse_replay_buffer = bool(diverse_replay_buffer)
        self.capacity = int(capacity)
        self.timing = bool(timing)
        self.store_locally = bool(store_locally)
        self.baseline_strategy = baseline_strategy
        self.baseline_percentile = float(baseline_percentile)
        self.baseline_ema_alpha = float(baseline_ema_alpha)
        self.num_buffer_managers = int(num_buffer_managers)
        remote = remote_manager if remote_manager is not None else remote_manager_rank
        common = dict(remote_manager=remote, communication_backend=communication_backend, timing=timing)
        self.replay_buffer: ReplayBuffer = (
            NormBasedDiversePrioritizedReplayBuffer(
                env, capacity, cutoff_distance=cutoff_distance, p_norm_distance=p_norm_distance, **common
            )
            if self.diverse_replay_buffer
            else ReplayBuffer(env, capacity, prioritized_capacity=True, **common)
        )
        self.is_running = True
        self.exit_counter = 0
        self.exited: set[Any] = set()
        self.dead: set[Any] = set()
        self.per_sender: dict[Any, dict[str, float]] = {}
        self.timing_data: dict[str, list[float]] = {}
        self._ema: float | None = None
        self._global_baseline: float | None = None
        self._scoring_kw = _sender_keyword(self.scoring_function)
        self._started = time.monotonic()

    # -- scoring ----------------------------------------------------------------------------------
    @staticmethod
    def default_scoring_function(container: Any, sender: Any = None) -> dict[str, float]:
        """The placeholder score: ``{"score": inf}``."""
        return {"score": math.inf}

    def handle_data(self, container: Any, sender: Any, nbytes: int = 0) -> dict[str, float]:
        """Store (if ``store_locally``), score, add the baseline; return the reply dict."""
        if self.store_locally:
            with Timer(self.timing_data, "replay_add", self.timing):
                self.replay_buffer.add(container)
        with Timer(self.timing_data, "scoring", self.timing):
            if self._scoring_kw is None:
                score = self.scoring_function(container)
            else:
                score = self.scoring_function(container, **{self._scoring_kw: sender})
        score = dict(score or {})
        score = self._inject_baseline_log_reward(score, container)
        st = self.per_sender.setdefault(sender, {"n_requests": 0, "n_items": 0, "bytes_recv": 0})
        st["n_requests"] += 1
        st["n_items"] += len(container)
        st["bytes_recv"] += nbytes
        return score

    def _inject_baseline_log_reward(self, score: dict[str, float], container: Any) -> dict[str, float]:
        lr = getattr(container, "log_rewards", None)
        if lr is not None:
            finite = lr[torch.isfinite(lr)]
            if finite.numel():
                batch_min = float(finite.min())
                a = self.baseline_ema_alpha
                self._ema = batch_min if self._ema is None else a * batch_min + (1 - a) * self._ema
        if self._global_baseline is not None:
            score["baseline_log_reward"] = self._global_baseline
            return score
        if (
            self.store_locally
            and self.baseline_strategy in ("min", "percentile")
            and len(self.replay_buffer) >= self.capacity
        ):
            values = self.replay_buffer.live_log_rewards()
            values = values[np.isfinite(values)]
            if len(values):
                if self.baseline_strategy == "min":
                    score["baseline_log_reward"] = float(values.min())
                else:
                    q = torch.quantile(torch.from_numpy(values), self.baseline_percentile)
                    score["baseline_log_reward"] = float(q)
                return score
        if self._ema is not None:
            score["baseline_log_reward"] = self._ema
        return score

    def handle_baseline_sync(self, payload: Any) -> bool:
        """Adopt a global baseline ``{"global_baseline_log_reward": x}``; ignore anything else.

        Returns whether the payload was used (a malformed one is ignored, as in torchgfn).
        """
        if not isinstance(payload, dict) or "global_baseline_log_reward" not in payload:
            return False
        try:
            value = float(payload["global_baseline_log_reward"])
        except (TypeError, ValueError):
            return False
        if not math.isfinite(value):
            return False
        self._global_baseline = value
        return True

    _handle_baseline_sync = handle_baseline_sync

    def _compute_metadata(self) -> dict[str, Any]:
        """What ``get_metadata`` returns; subclasses override (default: buffer size and counts)."""
        return {"size": len(self.replay_buffer), "n_requests": sum(s["n_requests"] for s in self.per_sender.values())}

    def compute_metadata(self) -> dict[str, Any]:
        """What ``get_metadata`` returns: :meth:`_compute_metadata`, the hook subclasses override (torchgfn's name)."""
        return self._compute_metadata()

    # -- lifecycle -----------------------------------------------------------------------------------
    def handle_exit(self, sender: Any) -> bool:
        """A trainer said goodbye; returns whether the manager is now done."""
        if sender not in self.exited:
            self.exited.add(sender)
            self.exit_counter += 1
        return self._check_done()

    def handle_dead(self, sender: Any) -> bool:
        """A trainer died without saying goodbye; returns whether the manager is now done."""
        if sender not in self.exited:
            self.dead.add(sender)
        return self._check_done()

    def _check_done(self) -> bool:
        if len(self.exited | self.dead) >= self.num_training_ranks:
            self.is_running = False
        return not self.is_running

    def stop(self) -> None:
        """Stop now (the "when asked" path)."""
        self.is_running = False

    def summary(self) -> dict[str, Any]:
        """Counters and timings, for logs and tests."""
        timings = {k: {"total": sum(v), "count": len(v)} for k, v in self.timing_data.items()}
        return {
            "rank": self.rank,
            "size": len(self.replay_buffer),
            "exited": sorted(map(str, self.exited)),
            "dead": sorted(map(str, self.dead)),
            "per_sender": {str(k): dict(v) for k, v in self.per_sender.items()},
            "baseline_log_reward": self._global_baseline if self._global_baseline is not None else self._ema,
            "timings": timings,
            "uptime_s": time.monotonic() - self._started,
        }

    # -- backends -------------------------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        name: str,
        *args: Any,
        namespace: str | None = None,
        env_fn: Callable[[], Any] | None = None,
        exit_when_done: bool = False,
        liveness_interval: float = 1.0,
        actor_options: dict | None = None,
        **kwargs: Any,
    ) -> Any:
        """Start a manager as a named async Ray actor; returns its handle.

        ``args``/``kwargs`` go to the constructor (``env_fn`` builds the env inside the actor,
        instead of shipping ``env``). With ``exit_when_done`` the actor exits after the last
        trainer's goodbye (or death); otherwise use :meth:`wait` then :meth:`kill`. This process
        keeps a handle to the actor (Ray would otherwise end it when the returned handle is
        dropped), so trainers can find it by name until it exits or is killed.
        """
        from .ray_backend import start_manager_actor

        return start_manager_actor(
            cls,
            name,
            args,
            kwargs,
            namespace=namespace,
            env_fn=env_fn,
            exit_when_done=exit_when_done,
            liveness_interval=liveness_interval,
            actor_options=actor_options,
        )

    @staticmethod
    def wait(manager: Any, timeout: float, namespace: str | None = None) -> dict[str, Any]:
        """Block until a Ray manager is done (every trainer gone or ``shutdown``); its summary.

        Raises ``TimeoutError`` after ``timeout`` seconds.
        """
        from .ray_backend import wait_manager

        return wait_manager(manager, timeout, namespace)

    @staticmethod
    def shutdown(manager: Any, timeout: float = 30.0, namespace: str | None = None) -> dict[str, Any]:
        """Ask a Ray manager to stop now; returns its summary."""
        from .ray_backend import call

        return call(manager, "shutdown", timeout, namespace)

    @staticmethod
    def kill(manager: Any, namespace: str | None = None) -> None:
        """Kill a Ray manager now (``ray.kill``); this process stops keeping it alive."""
        from .ray_backend import kill_manager

        kill_manager(manager, namespace)

    def run(self, timeout: float | None = None) -> dict[str, Any]:
        """Serve trainers as a torch.distributed rank until all said goodbye; return the summary.

        ``timeout``: give up after that many seconds without any message (``None``: wait).
        """
        from .torch_backend import serve

        return serve(self, idle_timeout=timeout)

    @staticmethod
    def send_termination_signal(
        manager: Any, backend: str = "ray", sender: Any = None, timeout: float = 60.0, namespace: str | None = None
    ) -> None:
        """Say goodbye to a manager on behalf of ``sender`` (a trainer that has no buffer at hand)."""
        if backend == "ray":
            from .ray_backend import call, default_sender

            call(manager, "goodbye", timeout, namespace, sender or default_sender())
        else:
            from .torch_backend import send_exit

            send_exit(int(manager), timeout)

    @staticmethod
    def get_metadata(manager: Any, backend: str = "ray", timeout: float = 60.0, namespace: str | None = None) -> dict:
        """Ask a manager for :meth:`_compute_metadata`."""
        if backend == "ray":
            from .ray_backend import call

            return call(manager, "metadata", timeout, namespace)
        from .torch_backend import request_metadata

        return request_metadata(int(manager), timeout)


def _sender_keyword(fn: Callable[..., Any]) -> str | None:
    """Which keyword passes the sender to ``fn``: ``sender``, ``sender_rank`` or none."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return "sender"
    if "sender" in params:
        return "sender"
    if "sender_rank" in params:
        return "sender_rank"
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return "sender"
    return None
