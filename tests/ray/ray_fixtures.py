"""Shared Ray fixtures for tests/ray (a helper module, not a conftest: ``from conftest import`` in
the top-level tests must keep finding tests/conftest.py).

Usage: a module-scoped fixture that calls :func:`start_ray` (or :func:`start_cluster`) once and
``ray.shutdown()`` (``stop_cluster``) at the end: one Ray per module.

A start that fails tears down what it started (``ray.shutdown()``, the cluster's nodes, and any
process this test process spawned during the attempt: gcs_server, raylet, dashboard, monitors) and
is tried again (:data:`START_ATTEMPTS`), since on a loaded machine Ray's start-up can time out; a
failed start never leaves orphaned Ray processes to load the machine further (issue 37 item 5).
"""

import os
import signal
import time

import numpy as np
import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# a loaded machine (2 cores, load 15-30) starts Ray slowly: generous start-up timeouts
os.environ.setdefault("RAY_gcs_server_request_timeout_seconds", "180")
os.environ.setdefault("RAY_gcs_rpc_server_connect_timeout_s", "120")
os.environ.setdefault("RAY_raylet_start_wait_time_s", "120")
START_ATTEMPTS = 3


def descendants(pid: int | None = None) -> set[int]:
    """The pids of every live descendant of ``pid`` (default: this process), read from ``/proc``."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields[0] in (b"Z", b"X"):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = set(), [root]
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def kill_new(before: set[int], wait_s: float = 15.0) -> set[int]:
    """SIGKILL the descendants of this process that were not in ``before``; reap them; return their pids."""
    new = descendants() - before
    for pid in new:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and descendants() & new:
        for pid in new:
            try:
                os.waitpid(pid, os.WNOHANG)  # our own children: reaped (not zombies)
            except ChildProcessError:
                pass
        time.sleep(0.05)
    return new


def _teardown(ray, before: set[int], cluster=None) -> None:
    """Undo a failed start: Ray's driver state, the cluster's nodes, every process spawned since ``before``."""
    try:
        ray.shutdown()
    except Exception:  # noqa: BLE001 - tearing down what a failed start left, whatever state it is in
        pass
    if cluster is not None:
        try:
            cluster.shutdown()
        except Exception:  # noqa: BLE001
            pass
    kill_new(before)


def _attempts(ray, start, what: str):
    """Run ``start()`` up to :data:`START_ATTEMPTS` times, tearing down after each failure."""
    last = None
    for attempt in range(START_ATTEMPTS):
        before = descendants()
        try:
            return start()
        except (TypeError, ValueError):  # a bad argument: the same every time
            _teardown(ray, before)
            raise
        except Exception as e:  # noqa: BLE001 - a start-up timeout on a loaded machine: try again
            last = e
            _teardown(ray, before, getattr(e, "cluster", None))
            time.sleep(2.0 * (attempt + 1))
    raise RuntimeError(f"{what} failed {START_ATTEMPTS} times; the last error: {last!r}") from last


def transitions(n: int, start: int = 0) -> dict:
    """A batch of small transitions whose ``id`` field identifies each row."""
    ids = np.arange(start, start + n, dtype=np.int64)
    return {
        "obs": np.repeat(ids[:, None].astype(np.float32), 4, axis=1),
        "action": (ids % 3).astype(np.int64),
        "reward": ids.astype(np.float32) * 0.5,
        "id": ids,
    }


def start_ray(**kwargs):
    """``ray.init`` a fresh local instance (2 CPUs, no dashboard) and return ``ray``."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("lmdb")
    if ray.is_initialized():
        ray.shutdown()
    kwargs.setdefault("address", "local")  # a new instance, whatever a stale ray_current_cluster says
    kwargs.setdefault("num_cpus", 2)
    kwargs.setdefault("include_dashboard", False)
    kwargs.setdefault("log_to_driver", False)
    # Ray workers import test-module functions by name: let them find tests/ray and tests/.
    here = os.path.dirname(os.path.abspath(__file__))
    tests = os.path.dirname(here)
    dirs = (here, tests, os.path.join(tests, "compat"), os.environ.get("PYTHONPATH"))
    path = os.pathsep.join(p for p in dirs if p)
    kwargs.setdefault("runtime_env", {"env_vars": {"PYTHONPATH": path}})
    _attempts(ray, lambda: ray.init(**kwargs), "ray.init")
    return ray


def start_cluster(head_node_args: dict, nodes: list[dict], **init_kwargs):
    """A ``ray.cluster_utils.Cluster`` (a head and ``nodes``) with the driver connected: ``(ray, cluster, nodes)``.

    Torn down and tried again if any step fails (see the module doc). Stop it with :func:`stop_cluster`.
    """
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    here = os.path.dirname(os.path.abspath(__file__))
    tests = os.path.dirname(here)
    dirs = (here, tests, os.path.join(tests, "compat"), os.environ.get("PYTHONPATH"))
    init_kwargs.setdefault("runtime_env", {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in dirs if p)}})
    init_kwargs.setdefault("log_to_driver", False)

    def start():
        c = None
        try:
            c = Cluster(initialize_head=True, head_node_args=head_node_args)
            added = [c.add_node(**n) for n in nodes]
            ray.init(address=c.address, **init_kwargs)
            c.wait_for_nodes()
            return ray, c, added
        except BaseException as e:
            e.cluster = c  # (_attempts shuts it down)
            if isinstance(e, (TypeError, ValueError)) and c is not None:
                c.shutdown()
            raise

    return _attempts(ray, start, "starting a Ray cluster")


def stop_cluster(ray, cluster) -> None:
    """Disconnect the driver and stop every node of ``cluster``."""
    try:
        ray.shutdown()
    finally:
        cluster.shutdown()


def wait_restarted(client, deadline_s: float = 90):
    """Wait until the service behind ``client`` answers ``ping`` as a restarted actor."""
    import time

    import replaystore as rs

    deadline = time.monotonic() + deadline_s
    while True:
        try:
            if client.ping()["restarted"]:
                return
        except (rs.Closed, rs.Timeout):
            pass
        assert time.monotonic() < deadline, "the service did not restart"
        time.sleep(0.2)


def log_then_replay(d: str, make_table, run_ops, ops, ops2, checkpoint: bool):
    """Run ``ops``, (a checkpoint,) ``ops2`` on a logged ``make_table()``; rebuild it from checkpoint + log.

    Returns ``(table, logged, restored, logged_restored, next_id)``; ``logged`` is closed,
    ``logged_restored`` is open (on the same log).
    """
    import replaystore as rs
    from replaystore.wal.log import WalConfig
    from replaystore.wal.logged import LoggedTable

    cfg = WalConfig(dir=d, fsync="never")
    t = make_table()
    lt = LoggedTable.open(t, os.path.join(d, "wal"), cfg)
    nid = run_ops(lt, ops)
    if checkpoint:
        lt.save(os.path.join(d, "ckpt"))
    nid = run_ops(lt, ops2, nid)
    lt.close()
    restored = rs.Table.load(os.path.join(d, "ckpt")) if checkpoint else make_table()
    return t, lt, restored, LoggedTable.open(restored, os.path.join(d, "wal"), cfg), nid
