"""serve() and connect(): start the replay service, and the client that mirrors the Table API.

```python
import replaystore as rs
from replaystore import ray as rsr

client = rsr.serve({"replay": functools.partial(rs.Table, 100_000, sampler=rs.Prioritized(0.6, 0.4))},
                   name="apex")
# in any Ray worker:
c = rsr.connect("apex", table="replay")
keys = c.extend(batch, priorities=p)          # one Ray call per batch
s = c.sample(256, timeout=10.0)               # rs.Timeout after 10 s
c.update_priorities(s.keys, new_p)
```

A :class:`ReplayClient` is small and picklable: pass it to Ray tasks and actors.
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument
from ..fragments.buffer import FragmentBufferConfig
from ..items import Sample
from ..monitor import Sink, StatsReporter
from ..table import Table, contract
from ..wal.log import WalConfig
from ._runtime import get, import_ray, init_local, require_init, rpc_timeout
from .factories import table_factories
from .server import ReplayServer, SinkSpec

if TYPE_CHECKING:
    from ..online import RolloutBufferConfig
    from .fragments.client import FragmentClient
    from .online_client import OnlineClient

DEFAULT_TABLE = "default"


class ReplayClient:
    """Talks to a replay service; one table is the default target of the Table's methods.

    The Table's methods (``extend``, ``sample``, ``update_priorities``, ... every call of
    :data:`replaystore.table.contract.CALLS`) are generated from the contract: same names,
    signatures and docstrings as :class:`~replaystore.Table`, each one Ray call.

    Args:
        actor: the service's actor handle.
        name: the service's name.
        table: default table for ``extend``, ``sample``, ...
        default_timeout: timeout of blocking calls that pass none (``None``: wait).
        rpc_grace: extra seconds a client waits for an answer beyond an operation's own timeout,
            and the whole wait for calls that never block (``None``: no limit).

    Every method is one Ray call (thread-safe; the client holds no state besides the handle).
    Errors raised by the service come back as themselves (``rs.Timeout``, ``rs.Closed``,
    ``rs.SpecError``, ...); a service that died for good gives ``rs.Closed``; no answer within the
    limits above gives ``rs.Timeout``.
    """

    def __init__(
        self,
        actor: Any,
        name: str,
        table: str = DEFAULT_TABLE,
        default_timeout: float | None = None,
        rpc_grace: float | None = 60.0,
    ) -> None:
        self.actor = actor
        self.name = name
        self.table_name = table
        self.default_timeout = default_timeout
        self.rpc_grace = rpc_grace

    MODE = "served"

    def __repr__(self) -> str:
        return f"ReplayClient(name={self.name!r}, table={self.table_name!r})"

    def table(self, name: str) -> "ReplayClient":
        """A client of the same service whose default table is ``name``."""
        return ReplayClient(self.actor, self.name, name, self.default_timeout, self.rpc_grace)

    def _t(self, timeout: float | None) -> float | None:
        return self.default_timeout if timeout is None else timeout

    def _call(self, method: str, *args: Any, op_timeout: float | None = 0.0, warn: bool = False) -> Any:
        ref = getattr(self.actor, method).remote(*args)
        return get(ref, rpc_timeout(op_timeout, self.rpc_grace), f"{self.name}.{method}", warn)

    # -- the Table API: generated from replaystore.table.contract (see _remote_call below) ----------------
    def extend_async(self, data: Any, priorities: Any = None, version: Any = None, timeout: float | None = None) -> Any:
        """Start an insert and return its ``ObjectRef`` at once (pipelined writers; ``ray.get`` it later)."""
        return self.actor.extend.remote(self.table_name, data, priorities, version, self._t(timeout))

    def iterate(
        self, batch_size: int, prefetch: int = 4, timeout: float | None = None, max_batches: int | None = None
    ) -> Iterator[Sample]:
        """Samples of ``batch_size``, with ``prefetch`` sample calls kept in flight.

        The service draws the next batches while the caller works on this one, which hides the
        round trip (as Reverb's datasets do with ``max_in_flight_samples_per_worker``). Each
        batch is an ordinary :meth:`sample`: it counts towards ``times_sampled`` and the rate
        limiter when it is drawn, so stopping early drops up to ``prefetch`` drawn batches.
        Errors (``rs.Timeout``, ``rs.Closed``) surface on the ``next()`` that reaches them.

        Args:
            batch_size: items per sample.
            prefetch: sample calls in flight (``>= 1``).
            timeout: per-sample timeout, as for :meth:`sample`.
            max_batches: stop after this many samples (``None``: never).
        """
        if prefetch < 1:
            raise InvalidArgument(f"prefetch must be >= 1, got {prefetch}")
        if batch_size < 1:
            raise InvalidArgument(f"batch_size must be >= 1, got {batch_size}")
        return self._iterate(int(batch_size), int(prefetch), self._t(timeout), max_batches)

    def _iterate(self, batch_size: int, prefetch: int, t: float | None, max_batches: int | None) -> Iterator[Sample]:
        wait = rpc_timeout(t, self.rpc_grace)
        in_flight: collections.deque = collections.deque()
        produced = 0
        try:
            while max_batches is None or produced < max_batches:
                while len(in_flight) < prefetch and (max_batches is None or produced + len(in_flight) < max_batches):
                    in_flight.append(self.actor.sample.remote(self.table_name, batch_size, t))
                sample = get(in_flight.popleft(), wait, f"{self.name}.sample")
                produced += 1
                yield sample
        finally:
            in_flight.clear()  # drop the refs: those results are discarded

    def __len__(self) -> int:
        return self._call("size", self.table_name)

    def __contains__(self, key: Any) -> bool:
        """Whether ``key`` is a live item of the default table (one Ray call; ``InvalidArgument`` as the Table)."""
        return bool(self.info([key])["found"][0])

    def stats(self) -> dict[str, Any]:
        """Stats of every table (by name) and of the fragment buffer (``"fragments"``)."""
        return self._call("stats")

    def save(self, path: str | None = None) -> list[str]:
        """Checkpoint every table to ``<path or checkpoint_dir>/<table>``; return the directories."""
        return self._call("save", path, op_timeout=None)

    # -- service ----------------------------------------------------------------------------------------------
    def ping(self) -> dict[str, Any]:
        """Service info; raises ``Timeout``/``Closed`` when it does not answer."""
        return self._call("ping")

    @functools.cached_property
    def fragments(self) -> "FragmentClient":
        """The client of the service's fragment buffer (see :mod:`replaystore.ray.fragments.client`)."""
        from .fragments.client import FragmentClient

        return FragmentClient(self.actor, self.name, rpc_grace=self.rpc_grace)

    def online(self, buffer: str = "rollouts") -> "OnlineClient":
        """The client of the service's rollout buffer ``buffer`` (see :mod:`replaystore.ray.online_client`)."""
        from .online_client import OnlineClient

        return OnlineClient(self.actor, self.name, buffer, rpc_grace=self.rpc_grace)

    def reporter(self, sinks: list[Sink] | None = None, period: float = 30.0) -> StatsReporter:
        """A :class:`~replaystore.monitor.StatsReporter` of this service's stats, on the client side."""
        return StatsReporter(self.stats, sinks, period)

    def close(self) -> None:
        """Close the service (tables and fragment buffer); later calls raise ``Closed``."""
        self._call("close")

    def shutdown(self) -> None:
        """Close the service and kill its actor (no restart)."""
        ray = import_ray()
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the actor may be dead already
            pass
        ray.kill(self.actor, no_restart=True)

    def __reduce__(self) -> tuple:
        return (ReplayClient, (self.actor, self.name, self.table_name, self.default_timeout, self.rpc_grace))


def _remote_call(call: contract.Call) -> Callable:
    """``ReplayClient.<call>``: one Ray call of the service's method of the same name, on the default table.

    The arguments are bound to the Table method's signature (a wrong call raises ``TypeError``
    here, as the Table would) and sent positionally; a blocking call waits ``timeout`` (the
    client's ``default_timeout`` if ``None``) plus ``rpc_grace``; arguments the contract marks
    local (``as_tensor``, ...) are applied to the answer here.
    """

    def method(self: ReplayClient, *args: Any, **kwargs: Any) -> Any:
        a = contract.bind(call, args, kwargs)
        local = {k: a.pop(k) for k in call.local}
        if not call.blocking:
            return self._call(call.name, self.table_name, *a.values())
        a["timeout"] = t = self._t(a["timeout"])
        out = self._call(call.name, self.table_name, *a.values(), op_timeout=t, warn=t is None)
        return contract.apply_local(out, local)

    return contract.forwarded(call, method, ReplayClient)


contract.install(ReplayClient, _remote_call)


def serve(
    tables: Callable[[], Table] | Mapping[str, Callable[[], Table]] | None = None,
    *,
    name: str = "replaystore",
    fragments: FragmentBufferConfig | None = None,
    namespace: str | None = None,
    max_restarts: int = 0,
    max_task_retries: int | None = None,
    checkpoint_dir: str | None = None,
    checkpoint_period: float | None = None,
    report_period: float | None = None,
    sinks: SinkSpec = None,
    resources: dict[str, float] | None = None,
    num_cpus: float = 0,
    detached: bool = False,
    scheduling_strategy: Any = None,
    housekeeping_period: float = 10.0,
    default_timeout: float | None = None,
    rpc_grace: float | None = 60.0,
    start_timeout: float = 120.0,
    online: Mapping[str, RolloutBufferConfig] | None = None,
    wal: WalConfig | Mapping[str, WalConfig] | None = None,
    server_class: type[ReplayServer] = ReplayServer,
) -> ReplayClient:
    """Start a replay service as a named Ray actor; return a client bound to its first table.

    Starts a local Ray instance on loopback if Ray is not initialized.

    Args:
        tables: a zero-argument factory returning a :class:`~replaystore.Table` (named
            ``"default"``), or a mapping name -> factory. Factories (``functools.partial(rs.Table,
            ...)`` or a function) run inside the actor, again after each restart.
        name: the actor's name; :func:`connect` finds the service by it.
        fragments: add a fragment buffer with this configuration (MineStudio's system).
        namespace: Ray namespace of the actor (default: the job's).
        max_restarts: how often Ray restarts the actor after a crash (``-1``: always).
        max_task_retries: retries of calls in flight during a restart (default: ``-1`` when
            ``max_restarts`` is set, so callers see a delay instead of an error; calls are then
            delivered at least once, and the fragment buffer ignores the duplicates).
        checkpoint_dir: where tables are checkpointed and reloaded from (see :class:`ReplayServer`).
        checkpoint_period: seconds between automatic checkpoints (``None``: on request only).
        report_period: seconds between stats reports to the sinks (``None``: off).
        sinks: monitoring sinks: a factory or names (``"logging"``, ``"tensorboard:<dir>"``, ``"wandb"``).
        resources: Ray resources for the actor, e.g. ``{"database": 0.0001}`` to place it (and so
            the fragment store) on the node that declares ``database``.
        num_cpus: CPUs reserved for the actor (0: it never blocks the scheduler).
        detached: outlive the driver (``lifetime="detached"``).
        scheduling_strategy: a Ray scheduling strategy for the actor.
        housekeeping_period: seconds between fragment-buffer housekeeping passes.
        default_timeout: the returned client's default timeout (see :class:`ReplayClient`).
        rpc_grace: the returned client's grace period (see :class:`ReplayClient`).
        start_timeout: seconds to wait for the actor to come up.
        online: rollout buffers by name (:class:`~replaystore.online.RolloutBufferConfig`); reach
            one with ``client.online(name)`` (see docs/online.md).
        wal: a write-ahead log for every table (a :class:`~replaystore.ray.WalConfig`) or for some
            (``{table: WalConfig}``): each mutation is logged before its call returns and replayed
            after a restart, on top of the last checkpoint (see docs/ray.md, "Durable tables").
        server_class: the actor class, :class:`ReplayServer` or a subclass adding methods (the
            shards of :func:`~replaystore.ray.serve_sharded` use
            :class:`~replaystore.ray.sharded.server.ShardServer`).

    Raises:
        InvalidArgument: a service (actor) with this name already exists.
        Timeout: the actor did not start in time.
        Exception: the exception that made the service fail to start, as itself (same class and
            message, the actor's traceback attached as a note): a factory's own error,
            ``InvalidType`` (a factory returned no Table), ``SpecError`` (``wal=`` for an object
            storage), ``CheckpointError`` (a corrupt checkpoint in ``checkpoint_dir``),
            ``WalCorrupt`` (a corrupt log), ... The actor is then killed and the name is free
            again when this raises.
    """
    tables = table_factories(tables, DEFAULT_TABLE)  # (a Table instead of a factory: named, before Ray starts)
    ray = init_local()
    if _lookup(name, namespace) is not None:
        raise InvalidArgument(f"a replay service named {name!r} already exists")
    if max_task_retries is None:
        max_task_retries = -1 if max_restarts else 0
    options: dict[str, Any] = dict(
        name=name, max_restarts=max_restarts, max_task_retries=max_task_retries, num_cpus=num_cpus, max_concurrency=1000
    )
    if namespace is not None:
        options["namespace"] = namespace
    if resources:
        options["resources"] = dict(resources)
    if detached:
        options["lifetime"] = "detached"
    if scheduling_strategy is not None:
        options["scheduling_strategy"] = scheduling_strategy
    # the factories travel pickled: an error unpickling them in the actor is a start error like any other
    actor = (
        ray.remote(server_class)
        .options(**options)
        .remote(
            name,
            ray.cloudpickle.dumps(dict(tables)),
            fragments,
            checkpoint_dir,
            checkpoint_period,
            report_period,
            sinks,
            housekeeping_period,
            online=dict(online) if online else None,
            wal=wal,
        )
    )
    client = ReplayClient(actor, name, next(iter(tables), DEFAULT_TABLE), default_timeout, rpc_grace)
    try:
        get(actor.ping.remote(), start_timeout, f"starting {name!r}")
    except BaseException:  # a service that failed to start must not keep its name
        _kill_and_free(ray, actor, name, namespace)
        raise
    return client


def _kill_and_free(ray: Any, actor: Any, name: str, namespace: str | None, timeout: float = 30.0) -> None:
    """Kill ``actor`` for good and wait (up to ``timeout`` s) until its name can be used again."""
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - it may be gone already
        pass
    end = time.monotonic() + timeout
    while _lookup(name, namespace) is not None and time.monotonic() < end:
        time.sleep(0.02)


def _lookup(name: str, namespace: str | None) -> Any:
    ray = import_ray()
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None


def connect(
    name: str = "replaystore",
    table: str | None = None,
    namespace: str | None = None,
    default_timeout: float | None = None,
    rpc_grace: float | None = 60.0,
) -> ReplayClient:
    """A client of the running service ``name`` (default table: ``table`` or its first one).

    Raises:
        NotConnected: Ray is not initialized in this process (at once; ``ray.init(address="auto")``
            joins the cluster where the service runs).
        InvalidArgument: no service of that name is running.
    """
    require_init(f"connect({name!r})")
    actor = _lookup(name, namespace)
    if actor is None:
        raise InvalidArgument(f"no replay service named {name!r} is running")
    client = ReplayClient(actor, name, table or DEFAULT_TABLE, default_timeout, rpc_grace)
    if table is None:
        tables = client.ping()["tables"]
        if tables:
            client.table_name = DEFAULT_TABLE if DEFAULT_TABLE in tables else tables[0]
    return client
