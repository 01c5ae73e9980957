"""The Ray backend: the manager as a named async actor, trainers call it through the object store.

A container travels as a wire message (:mod:`.wire`) passed by reference to the manager's ``data``
method; timeouts and the watch on trainer actors: docs/compat/gfn.md, "The remote buffer" (Ray).
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep Ray on loopback unless told

import asyncio  # noqa: E402
import socket  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import ray  # noqa: E402
from ray.exceptions import GetTimeoutError, RayActorError  # noqa: E402

from ...errors import Closed  # noqa: E402
from .timing import Timer  # noqa: E402
from .wire import from_wire, to_wire, wire_nbytes  # noqa: E402

_CLOSED = "__replaystore_closed__"
#: handles of the managers this process started: Ray kills an actor once no handle refers to it,
#: and users often refer to a manager by name only
_STARTED: dict[tuple[str | None, str], Any] = {}


class _ManagerActor:
    """The actor wrapped around a :class:`ReplayBufferManager` (one event loop: calls run one at a time)."""

    def __init__(
        self,
        manager_cls: type,
        args: tuple,
        kwargs: dict,
        env_fn: Callable[[], Any] | None,
        exit_when_done: bool,
        liveness_interval: float,
    ) -> None:
        if env_fn is not None:
            kwargs = dict(kwargs, env=env_fn())
        self.core = manager_cls(*args, **kwargs)
        self.exit_when_done = exit_when_done
        self.liveness_interval = liveness_interval
        self._done: asyncio.Event | None = None
        self._watchers: dict[Any, asyncio.Task] = {}
        self._exiting = False

    def _event(self) -> asyncio.Event:
        if self._done is None:
            self._done = asyncio.Event()
        return self._done

    async def hello(self, sender: Any, handle: Any = None) -> bool:
        """Register a trainer; with its actor handle, watch it for death."""
        self.core.per_sender.setdefault(sender, {"n_requests": 0, "n_items": 0, "bytes_recv": 0})
        if handle is not None and sender not in self._watchers:
            self._watchers[sender] = asyncio.get_running_loop().create_task(self._watch(sender, handle))
        return True

    async def _watch(self, sender: Any, handle: Any) -> None:
        while sender not in self.core.exited and self.core.is_running:
            try:
                await handle.__ray_ready__.remote()
            except RayActorError:
                self._finished_if(self.core.handle_dead(sender))
                return
            except Exception:  # noqa: BLE001 - anything else: stop watching, keep serving
                return
            await asyncio.sleep(self.liveness_interval)

    async def data(self, wire: dict, sender: Any) -> dict:
        """Store and score one batch; reply with the score dict."""
        if not self.core.is_running:
            return {_CLOSED: 1.0}
        container = from_wire(wire, self.core.env)
        return self.core.handle_data(container, sender, wire_nbytes(wire))

    async def goodbye(self, sender: Any) -> bool:
        """A trainer is done; returns whether the manager is now done."""
        return self._finished_if(self.core.handle_exit(sender))

    async def baseline_sync(self, payload: Any) -> bool:
        """See :meth:`ReplayBufferManager.handle_baseline_sync`."""
        return self.core.handle_baseline_sync(payload)

    async def metadata(self) -> dict:
        """See :meth:`ReplayBufferManager._compute_metadata`."""
        return self.core.compute_metadata()

    async def summary(self) -> dict:
        """The manager's summary."""
        return self.core.summary()

    async def sample(self, n: int) -> dict:
        """``n`` items of the manager's buffer, as a wire message."""
        return to_wire(self.core.replay_buffer.sample(n), self.core.env)

    async def wait_closed(self, timeout: float | None = None) -> dict | None:
        """Wait until the manager is done; its summary, or ``None`` after ``timeout`` seconds."""
        if self.core.is_running:
            try:
                await asyncio.wait_for(self._event().wait(), timeout)
            except asyncio.TimeoutError:
                return None
        return self.core.summary()

    async def shutdown(self) -> dict:
        """Stop serving now."""
        self.core.stop()
        self._finished_if(True)
        return self.core.summary()

    def _finished_if(self, done: bool) -> bool:
        if done:
            self._event().set()
            for task in self._watchers.values():
                task.cancel()
            if self.exit_when_done and not self._exiting:
                self._exiting = True
                ray.get_runtime_context().current_actor._exit.remote()
        return done

    async def _exit(self) -> None:
        await asyncio.sleep(0.5)  # let the last replies (goodbye, wait_closed) go out
        ray.actor.exit_actor()


def _handle(manager: Any, namespace: str | None) -> Any:
    if isinstance(manager, str):
        return ray.get_actor(manager, namespace=namespace)
    return manager


def start_manager_actor(
    manager_cls: type,
    name: str,
    args: tuple,
    kwargs: dict,
    namespace: str | None,
    env_fn: Callable[[], Any] | None,
    exit_when_done: bool,
    liveness_interval: float,
    actor_options: dict | None,
) -> Any:
    """Create the named manager actor and wait until it is constructed."""
    options = {"name": name, "num_cpus": 0, "max_concurrency": 64}
    if namespace is not None:
        options["namespace"] = namespace
    options.update(actor_options or {})
    actor_cls = ray.remote(_ManagerActor)
    handle = actor_cls.options(**options).remote(manager_cls, args, kwargs, env_fn, exit_when_done, liveness_interval)
    ray.get(handle.__ray_ready__.remote(), timeout=120)
    _STARTED[(namespace, name)] = handle
    return handle


def kill_manager(manager: Any, namespace: str | None = None) -> None:
    """Kill a manager actor at once and forget its handle."""
    handle = _handle(manager, namespace)
    for key, h in list(_STARTED.items()):
        if h == handle or (isinstance(manager, str) and key == (namespace, manager)):
            del _STARTED[key]
    ray.kill(handle)


def _get(ref: Any, timeout: float, what: str) -> Any:
    try:
        reply = ray.get(ref, timeout=timeout)
    except GetTimeoutError as exc:
        raise TimeoutError(f"replay buffer manager did not answer {what} within {timeout}s") from exc
    except RayActorError as exc:
        raise Closed(f"replay buffer manager is gone ({what})") from exc
    if isinstance(reply, dict) and _CLOSED in reply:
        raise Closed(f"replay buffer manager is closed ({what})")
    return reply


def wait_manager(manager: Any, timeout: float, namespace: str | None = None) -> dict:
    """See :meth:`ReplayBufferManager.wait`."""
    summary = _get(_handle(manager, namespace).wait_closed.remote(timeout), timeout + 30, "wait")
    if summary is None:
        raise TimeoutError(f"replay buffer manager still running after {timeout}s")
    return summary


def call(manager: Any, method: str, timeout: float, namespace: str | None, *args: Any) -> Any:
    """The reply of the manager actor's ``method(*args)``.

    Raises:
        TimeoutError: no reply within ``timeout`` seconds.
        Closed: the manager is gone or closed.
    """
    return _get(getattr(_handle(manager, namespace), method).remote(*args), timeout, method)


def default_sender() -> str:
    """The identity of this trainer: its Ray actor id, else host and process id."""
    try:
        actor_id = ray.get_runtime_context().get_actor_id()
    except Exception:  # noqa: BLE001 - not connected to Ray
        actor_id = None
    return actor_id or f"{socket.gethostname()}:{os.getpid()}"


class RayTrainerTransport:
    """Trainer side of the Ray backend (one per buffer)."""

    def __init__(self, manager: Any, buffer: Any, namespace: str | None = None) -> None:
        self.handle = _handle(manager, namespace)
        self.buffer = buffer
        self.sender = buffer.sender if buffer.sender is not None else default_sender()
        self._pending: Any = None
        self._said_goodbye = False
        try:
            me = ray.get_runtime_context().current_actor
        except Exception:  # noqa: BLE001 - a driver or a task: no handle to watch
            me = None
        _get(self.handle.hello.remote(self.sender, me), buffer.remote_timeout, "hello")

    def send(self, container: Any, wait: bool) -> dict | None:
        """Send a container; with ``wait`` return the score, else keep the reply for :meth:`collect`."""
        data = self.buffer.timing_data
        on = self.buffer.timing
        with Timer(data, "serialize_objs", on):
            wire = to_wire(container, self.buffer.env)
        if on:
            data.setdefault("send_bytes", []).append(float(wire_nbytes(wire)))
        with Timer(data, "send_data", on):
            ref = ray.put(wire)
            reply = self.handle.data.remote(ref, self.sender)
        if not wait:
            self._pending = reply
            return None
        with Timer(data, "recv_score", on):
            return _get(reply, self.buffer.remote_timeout, "a score")

    def collect(self, timeout: float) -> dict | None:
        """The reply of the previous async send."""
        if self._pending is None:
            return None
        reply = _get(self._pending, timeout, "a score")
        self._pending = None
        return reply

    def abandon(self) -> None:
        """Forget a pending reply."""
        self._pending = None

    def goodbye(self, timeout: float) -> None:
        """Tell the manager this trainer is done (once; a gone manager only warns)."""
        if self._said_goodbye:
            return
        self._said_goodbye = True
        try:
            _get(self.handle.goodbye.remote(self.sender), timeout, "goodbye")
        except (Closed, TimeoutError) as exc:
            warnings.warn(f"goodbye not acknowledged: {exc}", RuntimeWarning, stacklevel=2)
