"""ReplayServer: the replay service, an async Ray actor hosting Tables and a fragment buffer.

One server holds any number of named :class:`~replaystore.Table` objects (small items travel inline,
one Ray call per batch) and optionally one
:class:`~replaystore.fragments.buffer.FragmentBuffer` (large payloads stay in a FragmentStore on
the server's node; only ids and metadata reach the server). Start it with
:func:`replaystore.ray.serve`, talk to it with :class:`~replaystore.ray.client.ReplayClient`.

docs/ray.md has the contract: concurrency ("Inside the actor": a call that may wait first tries
without waiting, then waits in a worker thread, a fetch on an asyncio condition), restarts (the
fragment buffer resumes from its journal, Tables reload from ``checkpoint_dir`` and replay their
write-ahead log: "Durable tables") and start errors ("When the service cannot start"; see
:class:`ReplayServer`). Methods of the fragment buffer and of the rollout buffers live in
:mod:`~replaystore.ray.fragments.service` and :mod:`~replaystore.ray.server_online`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..checkpoint import checkpoint_exists
from ..errors import Closed, InvalidArgument, InvalidType, KeyNotFound, Timeout
from ..fragments.buffer import FragmentBuffer, FragmentBufferConfig
from ..monitor import LoggingSink, Sink, TensorBoardSink, WandbSink, flatten_scalars, write_sinks
from ..table import Table, contract
from ..wal.log import WalConfig
from ..wal.logged import LoggedTable
from ._runtime import import_ray
from .fragments.service import FragmentService
from .server_online import OnlineService

if TYPE_CHECKING:
    from ..online import RolloutBuffer, RolloutBufferConfig

log = logging.getLogger("replaystore")

SinkSpec = Callable[[], list[Sink]] | list[str] | None


def make_sinks(spec: SinkSpec) -> list[Sink]:
    """Sinks from a factory or from names: ``"logging"``, ``"tensorboard:<logdir>"``, ``"wandb"``."""
    if spec is None:
        return [LoggingSink(prefix="replay ")]
    if callable(spec):
        return list(spec())
    sinks: list[Sink] = []
    for s in spec:
        if s == "logging":
            sinks.append(LoggingSink(prefix="replay "))
        elif s.startswith("tensorboard"):
            sinks.append(TensorBoardSink(logdir=s.partition(":")[2] or None))
        elif s == "wandb":
            sinks.append(WandbSink())
        else:
            raise InvalidArgument(f"unknown sink {s!r}: use 'logging', 'tensorboard:<logdir>' or 'wandb'")
    return sinks


class ReplayServer(FragmentService, OnlineService):
    """The service's actor class (use :func:`replaystore.ray.serve`, which wraps it in ``ray.remote``).

    Its arguments are :func:`~replaystore.ray.serve`'s of the same names (``tables`` as ``serve``
    passes it: the mapping pickled with cloudpickle), plus ``max_blocking_threads``: threads
    available to Table calls that wait on a rate limiter.

    Start errors: the constructor never raises. Whatever goes wrong while it builds or reloads what
    it holds is kept, what was opened is closed, and every call (``ping`` first, which
    :func:`~replaystore.ray.serve` awaits) raises that exception as itself (docs/ray.md, "When the
    service cannot start").
    """

    MODE = "served"

    def __init__(
        self,
        name: str,
        tables: Mapping[str, Callable[[], Table]] | None = None,
        fragments: FragmentBufferConfig | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_period: float | None = None,
        report_period: float | None = None,
        sinks: SinkSpec = None,
        housekeeping_period: float = 10.0,
        max_blocking_threads: int = 64,
        online: Mapping[str, RolloutBufferConfig] | None = None,
        wal: WalConfig | Mapping[str, WalConfig] | None = None,
    ) -> None:
        ray = import_ray()
        ctx = ray.get_runtime_context()
        self.name = name
        with warnings.catch_warnings():  # Ray's property uses a deprecated accessor internally
            warnings.simplefilter("ignore")
            self.restarted = bool(getattr(ctx, "was_current_actor_reconstructed", False))
        self.node_id = ctx.get_node_id()
        self.namespace = ctx.namespace
        self.checkpoint_dir = None if checkpoint_dir is None else os.path.abspath(checkpoint_dir)
        self.checkpoint_period = checkpoint_period
        self.report_period = report_period
        self.housekeeping_period = housekeeping_period
        self._step = 0
        self._sinks: list[Sink] = []
        self.tables: dict[str, Table] = {}
        self.logged: dict[str, LoggedTable] = {}
        self._saving: set[str] = set()
        self.fragments: FragmentBuffer | None = None
        self.online: dict[str, RolloutBuffer] = {}
        self._online_report_every: dict[str, int | None] = {}
        self._pool = ThreadPoolExecutor(max_blocking_threads, thread_name_prefix="replaystore-wait")
        self._cond: asyncio.Condition | None = None
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # (the actor's event loop, once started)
        self._store_actor: Any = None
        self._closed = False
        self._start_error: Exception | None = None
        self._start_tb: Any = None
        try:  # a failure is kept and raised by every call (ping first), not by the constructor: see _open
            self._open(tables, fragments, sinks, online, wal)
        except Exception as e:  # noqa: BLE001 - reported to every caller as itself
            self._failed_start(e)
            return
        log.info("replay service %r started on node %s (restarted=%s)", name, self.node_id, self.restarted)

    def _open(
        self,
        tables: Mapping[str, Callable[[], Table]] | bytes | None,
        fragments: FragmentBufferConfig | None,
        sinks: SinkSpec,
        online: Mapping[str, RolloutBufferConfig] | None,
        wal: WalConfig | Mapping[str, WalConfig] | None,
    ) -> None:
        """Build (or reload) everything the service holds; raise whatever goes wrong."""
        if isinstance(tables, bytes):  # serve() pickles the factories, so that unpickling errors land here too
            tables = pickle.loads(tables)
        self._sinks = make_sinks(sinks)
        for tname, factory in (tables or {}).items():
            self.tables[tname] = self._load_or_make(tname, factory)
            cfg = wal.get(tname) if isinstance(wal, Mapping) else wal
            if cfg is not None:
                path = os.path.join(os.path.abspath(cfg.dir), tname)
                lt = LoggedTable.open(self.tables[tname], path, cfg)
                self.logged[tname] = lt
                log.info(
                    "table %r: write-ahead log %s at record %d (fsync=%s)", tname, path, lt.wal.last_lsn, cfg.fsync
                )
                if self.checkpoint_dir is None:
                    log.warning(
                        "table %r has a write-ahead log but the service no checkpoint_dir: the log is never truncated",
                        tname,
                    )
        if fragments is not None:
            self.fragments = FragmentBuffer(
                fragments,
                store=self._fragment_store(fragments),
                report=self._write_fragment_report,
                resume=self.restarted or not fragments.clear_on_start,
            )
        for oname, ocfg in (online or {}).items():
            buf = ocfg.build(oname, resume=self.restarted or not ocfg.clear_on_start)
            buf.sinks = self._sinks
            self.online[oname] = buf
            self._online_report_every[oname] = ocfg.report_every

    def _failed_start(self, error: Exception) -> None:
        """Keep ``error`` for every later call and let go of whatever was opened before it."""
        log.error("replay service %r failed to start: %s: %s", self.name, type(error).__name__, error)
        self._start_error, self._start_tb = error, error.__traceback__
        for closing in self._closers():
            try:
                closing()
            except Exception:  # noqa: BLE001 - the first error is the one to report
                log.exception("replay service %r: cleaning up after a failed start", self.name)
        self.logged, self.tables, self.online, self._sinks, self.fragments = {}, {}, {}, [], None
        self._closed = True
        self._pool.shutdown(wait=False)

    def _closers(self) -> list[Callable[[], None]]:
        """The ``close`` of everything the service holds: tables, logs, rollout buffers, sinks, fragments."""
        return (
            [t.close for t in self.tables.values()]
            + [lt.close for lt in self.logged.values()]
            + [b.close for b in self.online.values()]
            + [s.close for s in self._sinks]
            + ([self.fragments.close] if self.fragments is not None else [])
        )

    def _raise_start_error(self) -> None:
        if self._start_error is not None:
            raise self._start_error.with_traceback(self._start_tb)

    def _load_or_make(self, tname: str, factory: Callable[[], Table]) -> Table:
        if self.checkpoint_dir is not None:
            path = os.path.join(self.checkpoint_dir, tname)
            if checkpoint_exists(path):  # also a copy an interrupted save left beside it
                log.info("table %r: loading checkpoint %s", tname, path)
                return Table.load(path, allow_pickle=True)
        table = factory()
        if not isinstance(table, Table):
            raise InvalidType(f"the factory of table {tname!r} returned {type(table).__name__}, not a Table")
        return table

    # -- plumbing -------------------------------------------------------------------------------------
    def _start(self) -> asyncio.Condition:
        """Create the condition and background tasks on the event loop (first call only)."""
        if self._cond is None:
            self._cond = asyncio.Condition()
            loop = self._loop = asyncio.get_running_loop()
            if (self.fragments is not None or self.online) and self.housekeeping_period:
                self._tasks.append(loop.create_task(self._every(self.housekeeping_period, self._housekeeping)))
            if self.report_period:
                self._tasks.append(loop.create_task(self._every(self.report_period, self._report)))
            if self.checkpoint_period and self.checkpoint_dir:
                self._tasks.append(loop.create_task(self._every(self.checkpoint_period, self.save)))
        return self._cond

    def __ray_shutdown__(self) -> None:
        """Ray's graceful exit of the actor (every handle dropped): close the service first.

        On its event loop, so that no periodic task is left pending (``Task was destroyed but it is
        pending!`` in the actor's log).
        """
        loop = self._loop
        if loop is None or self._closed or loop.is_closed():
            return
        try:
            if loop.is_running():  # (on the loop's thread: wait for it there)
                asyncio.run_coroutine_threadsafe(self.close(), loop).result(timeout=10)
            else:  # (Ray stopped the loop before calling this: run it once more, here)
                loop.run_until_complete(self.close())
        except Exception:  # noqa: BLE001 - the actor exits anyway
            log.exception("replay service %r: closing at exit", self.name)

    async def _every(self, period: float, fn: Callable) -> None:
        while not self._closed:
            await asyncio.sleep(period)
            try:
                result = fn()
                if asyncio.iscoroutine(result):
                    await result
            except Exception:  # noqa: BLE001 - keep the periodic task alive
                log.exception("replay service %r: periodic %s failed", self.name, getattr(fn, "__name__", fn))

    def _check_open(self) -> None:
        self._raise_start_error()
        if self._closed:
            raise Closed(f"replay service {self.name!r} is closed")

    def _table(self, name: str) -> Table:
        self._check_open()
        try:
            return self.tables[name]
        except KeyError:
            raise KeyNotFound(f"service {self.name!r} has no table {name!r}; tables: {sorted(self.tables)}") from None

    async def _blocking(self, fn: Callable, a: dict[str, Any]) -> Any:
        """``fn(**a)``, a call that may wait: first with ``timeout=0``, then (if it would wait) in a thread."""
        try:
            return fn(**{**a, "timeout": 0})
        except Timeout:
            if a["timeout"] is not None and a["timeout"] <= 0:
                raise
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(**a))

    async def _notify(self) -> None:
        cond = self._start()
        async with cond:
            cond.notify_all()

    def _housekeeping(self) -> None:
        """Expire fragment leases and online tickets (every ``housekeeping_period``)."""
        self._expire_fragments()
        self._expire_online()

    # -- service -----------------------------------------------------------------------------------------
    async def pid(self) -> int:
        """The service process's id (for tests that kill it)."""
        return os.getpid()

    async def ping(self) -> dict[str, Any]:
        """``{"name", "node_id", "restarted", "tables", "fragments"}``: the service is up.

        Raises:
            Exception: the exception that made the service fail to start (re)building its tables,
                fragment buffer or rollout buffers (a factory's error, ``WalCorrupt``,
                ``CheckpointError``, a refused option, ...), as itself; every other call raises it too.
        """
        self._raise_start_error()
        self._start()
        return {
            "name": self.name,
            "node_id": self.node_id,
            "restarted": self.restarted,
            "tables": sorted(self.tables),
            "fragments": self.fragments is not None,
        }

    async def stats(self) -> dict[str, Any]:
        """Every table's ``stats()`` by name (with ``"wal"``: its log's, if logged), plus ``"fragments"``."""
        self._raise_start_error()
        out: dict[str, Any] = {n: t.stats() for n, t in self.tables.items()}
        for n, lt in self.logged.items():
            out[n]["wal"] = lt.stats()
        if self.fragments is not None:
            out["fragments"] = self._fragment_stats()
        if self.online:
            out["online"] = {n: b.stats() for n, b in self.online.items()}
        return out

    async def save(self, path: str | None = None) -> list[str]:
        """Checkpoint every table to ``<path or checkpoint_dir>/<table>``; return the directories.

        The fragment buffer needs no checkpoint: its journal is always current.
        """
        self._raise_start_error()
        root = path or self.checkpoint_dir
        if root is None:
            raise InvalidArgument("save() needs a path (the service has no checkpoint_dir)")
        loop = asyncio.get_running_loop()
        out = []
        for tname, table in self.tables.items():
            d = os.path.join(root, tname)
            lt = self.logged.get(tname)
            if lt is not None and path is None:  # the service's own checkpoint: it truncates the log
                await self._save_logged(tname, d)
            else:
                await loop.run_in_executor(self._pool, table.save, d)
            out.append(d)
        return out

    async def _save_logged(self, tname: str, d: str, background: bool = False) -> None:
        if not background:
            while tname in self._saving:  # one checkpoint of a table at a time
                await asyncio.sleep(0.02)
        self._saving.add(tname)
        try:
            await asyncio.get_running_loop().run_in_executor(self._pool, self.logged[tname].save, d)
        finally:
            self._saving.discard(tname)

    def _finished_save(self, task: asyncio.Task) -> None:
        if task in self._tasks:
            self._tasks.remove(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("replay service %r: checkpoint by log size failed: %s", self.name, task.exception())

    async def _logged(self, tname: str, lt: LoggedTable, result_lsn: tuple[Any, int]) -> Any:
        """Wait until a logged call is acknowledged; checkpoint the table if its log grew too long."""
        result, lsn = result_lsn
        await lt.wait_async(lsn)
        if self.checkpoint_dir is not None and tname not in self._saving and lt.needs_checkpoint():
            self._saving.add(tname)  # one at a time; the task clears it
            d = os.path.join(self.checkpoint_dir, tname)
            task = asyncio.get_running_loop().create_task(self._save_logged(tname, d, True))
            self._tasks.append(task)
            task.add_done_callback(self._finished_save)
        return result

    async def close(self) -> None:
        """Close every table and the fragment buffer; wake every waiting call with ``Closed``."""
        if self._closed:
            return
        self._closed = True
        for closing in self._closers():  # (no await before the last: no task runs in between)
            closing()
        tasks, self._tasks = list(self._tasks), []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # (none left pending when the actor exits)
        await self._notify()
        self._pool.shutdown(wait=False)

    # -- monitoring -------------------------------------------------------------------------------------------
    def _write(self, scalars: dict[str, float]) -> None:
        write_sinks(self._sinks, scalars, self._step)
        self._step += 1

    def _write_fragment_report(self, scalars: dict[str, float]) -> None:
        self._write({f"replay_buffer/{k}": v for k, v in scalars.items()})

    async def _report(self) -> None:
        self._write(flatten_scalars(await self.stats()))

    # -- tables: every call of replaystore.table.contract.CALLS is generated below (_serve) ------------------
    async def size(self, table: str) -> int:
        """Number of items in ``table``."""
        return len(self._table(table))


async def _serve(server: ReplayServer, call: contract.Call, table: str, a: dict[str, Any]) -> Any:
    """``ReplayServer.<call>(table, ...)``: the Table method on ``table`` (generated by ``contract.forward``).

    Blocking calls run as :meth:`ReplayServer._blocking` does (first without waiting, then in a
    worker thread); calls that change the table go through its write-ahead log when it has one
    (acknowledged once logged); reads run inline.
    """
    t = server._table(table)
    lt = server.logged.get(table) if call.mutating else None
    fn = getattr(t if lt is None else lt, call.name)
    result = (await server._blocking(fn, a)) if call.blocking else fn(**a)
    return result if lt is None else await server._logged(table, lt, result)


contract.forward(ReplayServer, serve=_serve, first="table")
