"""Importing Ray safely and calling it with timeouts and replaystore's errors.

Ray binds its sockets to the machine's external address unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``
is ``"0"`` when ``ray`` is first imported; :func:`import_ray` sets it (and ``RAY_AUTH_MODE``) unless
the user already chose, so a local instance started by replaystore listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from typing import Any

from ..errors import BlockingWarning, Closed, NotConnected, ReplayError, Timeout

_LOCAL_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}


def import_ray() -> Any:
    """``import ray`` after making a local instance bind to loopback (if ray is not loaded yet)."""
    if "ray" not in sys.modules:
        for k, v in _LOCAL_ENV.items():
            os.environ.setdefault(k, v)
    try:
        import ray
    except ImportError as e:  # pragma: no cover - only without the extra
        raise ImportError("replaystore.ray needs Ray: pip install 'replaystore[ray]'") from e
    return ray


def require_init(what: str) -> Any:
    """``ray``, if this process joined a Ray cluster; :class:`~replaystore.errors.NotConnected` at once otherwise.

    Finding a service by name needs the cluster it runs in: without ``ray.init`` Ray would start
    a new local instance (which cannot hold it) and the lookup would fail only after a long wait.
    """
    ray = import_ray()
    if not ray.is_initialized():
        raise NotConnected(
            f"{what}: Ray is not initialized in this process: call ray.init(address='auto') (or the "
            "cluster's address) first, in the cluster where the service runs"
        )
    return ray


def init_local(**kwargs: Any) -> Any:
    """Start a local Ray instance on loopback unless Ray is initialized; return ``ray``.

    ``kwargs`` go to ``ray.init`` (defaults: ``address="local"``, ``include_dashboard=False``,
    quiet logging). ``address="local"`` starts a new instance even when a stale
    ``/tmp/ray/ray_current_cluster`` names a cluster that is gone; pass ``address="auto"`` (or an
    address) to join a running cluster instead.
    """
    ray = import_ray()
    if not ray.is_initialized():
        kwargs.setdefault("address", "local")
        kwargs.setdefault("include_dashboard", False)
        kwargs.setdefault("log_to_driver", True)
        ray.init(**kwargs)
    return ray


#: seconds a blocking remote call without a timeout waits before it warns in the caller's process
#: (``BlockingWarning``; the Table's ``blocking_warning_s``)
BLOCKING_WARNING_S = 10.0
#: the longest single ``ray.get`` wait: between two, the caller's signal handlers run (Ctrl-C, alarms)
SLICE_S = 0.25


def get(refs: Any, timeout: float | None, what: str, warn: bool = False) -> Any:
    """``ray.get`` with replaystore's errors, interruptible.

    The wait is cut into slices of :data:`SLICE_S`, so the caller's signal handlers run while it
    waits (``KeyboardInterrupt`` comes out as itself; the remote call goes on, and its result is
    dropped). ``warn``: a call that may block for good (a sample of an empty table, no timeout)
    issues a :class:`~replaystore.errors.BlockingWarning` here, in the caller's process, once it
    has waited :data:`BLOCKING_WARNING_S`.

    Raises:
        Timeout: no answer within ``timeout`` seconds (the remote call may still run).
        Closed: the actor died for good.
        Exception: the remote error itself when the remote code raised (a replaystore error,
            ``ValueError``, ...), with the remote traceback attached as a note.
    """
    ray = import_ray()
    start = time.monotonic()
    end = None if timeout is None else start + timeout
    warned = not warn
    try:
        while True:
            left = None if end is None else max(0.0, end - time.monotonic())
            try:
                return ray.get(refs, timeout=SLICE_S if left is None else min(SLICE_S, left))
            except ray.exceptions.GetTimeoutError:
                if left is not None and left <= SLICE_S:
                    raise
            except SystemError as e:  # a signal handler raised inside Ray's wait: raise what it raised
                raised = e.__context__ or e.__cause__
                if raised is None or isinstance(raised, ray.exceptions.RayError):
                    raise
                raise raised from None
            if not warned and time.monotonic() - start >= BLOCKING_WARNING_S:
                warned = True
                warnings.warn(
                    f"{what} has waited {BLOCKING_WARNING_S:g}s for the service and goes on waiting (no "
                    "timeout): a sample of a table its rate limiter never admits (empty, below MinSize) "
                    "blocks for good; pass timeout= to get rs.Timeout instead, Ctrl-C interrupts",
                    BlockingWarning,
                    stacklevel=4,
                )
    except ray.exceptions.GetTimeoutError:
        raise Timeout(f"{what}: no answer within {timeout:.3g}s") from None
    except ray.exceptions.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
            tb = e.__dict__.get("traceback_str")
            if tb and hasattr(cause, "add_note"):
                cause.add_note(f"(raised remotely by {what}; remote traceback:\n{tb})")
            raise cause from None
        raise
    except ray.exceptions.RayActorError as e:
        raise Closed(f"{what}: the actor is gone ({type(e).__name__}: {e})") from e


def find_actor(name: str, namespace: str | None) -> Any:
    """The handle of the named actor, or ``None`` if no actor of that name is alive."""
    try:
        return import_ray().get_actor(name, namespace=namespace)
    except ValueError:
        return None


def kill(actor: Any) -> None:
    """``ray.kill(actor, no_restart=True)``; an actor that is gone already is no error."""
    with contextlib.suppress(Exception):
        import_ray().kill(actor, no_restart=True)


def rpc_timeout(op_timeout: float | None, grace: float | None) -> float | None:
    """How long a client waits for an answer: the operation's own timeout plus a grace period."""
    if op_timeout is None or grace is None:
        return None
    return op_timeout + grace


__all__ = ["Closed", "ReplayError", "get", "import_ray", "init_local", "require_init", "rpc_timeout"]
