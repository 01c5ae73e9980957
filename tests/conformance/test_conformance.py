"""One Table in every mode: the conformance matrix (issue 32, item 5).

Each mode runs the scenario of :mod:`conformance_scenario` (the Table's behavioural calls, bad inputs and
the error class each raises) next to an in-process Table that runs the same scenario; every cell
must agree with the Table or be a refusal or difference that the contract
(:mod:`replaystore.table.contract`) lists for that call and mode. Modes: in-process, shared
(SharedTable; and one that another process attached and calls), served (serve + client),
sharded with 1 and 2 shards (uneven masses: the first
batch has priorities up to 7 and goes to one shard), WAL-served, logged (LoggedTable). One Ray
instance for the module. The matrix is printed, and written to ``$REPLAYSTORE_CONFORMANCE_MATRIX``
when that is set (docs/architecture.md shows it).
"""

import os
import uuid

import numpy as np
import pytest
from conformance_modes import (
    CONFIGS,
    Handle,
    LoggedHandle,
    ServedHandle,
    ShardedHandle,
    SharedHandle,
    config,
    factory,
    table,
    unique,
)
from conformance_scenario import CELLS, CLOSING

from replaystore.table import contract

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

pytestmark = pytest.mark.timeout(300)

MODES = ["table", "shared", "shared-process", "served", "sharded-1", "sharded-2", "wal", "logged"]
RESULTS: dict[tuple[str, str], tuple[str, str]] = {}  # (cell, mode) -> (outcome, detail)


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray for the module, shut down even when starting it fails."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("lmdb")
    if ray.is_initialized():
        ray.shutdown()
    try:
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            namespace=f"conformance-{uuid.uuid4().hex[:8]}",
        )
        yield ray
    finally:
        ray.shutdown()


def build(mode: str, tmp: str, ray_local) -> tuple[dict, list]:
    """``({config: handle}, [cleanups])`` of a mode."""
    from replaystore import ray as rsr
    from replaystore.shared import SharedTable
    from replaystore.wal.log import WalConfig
    from replaystore.wal.logged import LoggedTable

    if mode == "table":
        return {c: Handle(table(c), c) for c in CONFIGS}, []
    if mode == "shared":
        hs = {}
        for c in CONFIGS:
            kw = config(c)
            hs[c] = SharedHandle(SharedTable.create(unique("cf"), kw.pop("capacity"), **kw), c)
        return hs, [h.cleanup for h in hs.values()]
    if mode == "shared-process":  # created here, every call made by another process that attached it
        hs = {}
        for c in CONFIGS:
            kw = config(c)
            hs[c] = SharedHandle(SharedTable.create(unique("cf"), kw.pop("capacity"), **kw), c)
        child = InOtherProcess({c: h.obj.name for c, h in hs.items()}, os.path.join(tmp, "child"))
        cleanups = [child.stop, *[h.obj.close for h in hs.values()], *[h.cleanup for h in hs.values()]]
        return {c: child for c in CONFIGS}, cleanups
    if mode in ("served", "wal"):
        wal = WalConfig(dir=os.path.join(tmp, "wal"), fsync="never") if mode == "wal" else None
        client = rsr.serve({c: factory(c) for c in CONFIGS}, name=unique("cf"), wal=wal)
        return {c: ServedHandle(client.table(c), c) for c in CONFIGS}, [client.shutdown]
    if mode.startswith("sharded"):
        n = int(mode.split("-")[1])
        hs = {c: ShardedHandle(rsr.serve_sharded(factory(c), n, name=unique(f"cf{c}"), depth=1), c) for c in CONFIGS}
        return hs, [h.obj.shutdown for h in hs.values()]
    if mode == "logged":
        hs = {}
        for c in CONFIGS:
            d = os.path.join(tmp, "log", c)
            hs[c] = LoggedHandle(LoggedTable.open(table(c), d, WalConfig(dir=d, fsync="never")), c)
        return hs, [h.obj.close for h in hs.values()]
    raise KeyError(mode)


class InOtherProcess:
    """Runs the scenario's cells in a spawned process on SharedTables it attached by name."""

    def __init__(self, names: dict, tmp: str) -> None:
        import multiprocessing as mp

        self.conn, child = mp.get_context("spawn").Pipe()
        self.proc = mp.get_context("spawn").Process(target=_child_loop, args=(child, names, tmp), daemon=True)
        self.proc.start()

    def run(self, index: int):
        self.conn.send(index)
        if not self.conn.poll(120):
            raise TimeoutError("the other process did not answer")
        return self.conn.recv()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        finally:
            self.proc.join(30)
            if self.proc.is_alive():
                self.proc.kill()


def _child_loop(conn, names: dict, tmp: str) -> None:
    from conformance_modes import SharedHandle

    from replaystore.shared import SharedTable

    handles = {c: SharedHandle(SharedTable.attach(n, seed=0), c) for c, n in names.items()}
    ctx = {c: {"tmp": tmp} for c in names}
    cells = [*CELLS, *CLOSING]
    while True:
        i = conn.recv()
        if i is None:
            break
        cfg, _, _, fn = cells[i]
        conn.send(run(fn, handles[cfg], ctx[cfg]))
    for h in handles.values():
        try:
            h.obj.close()
        except Exception:  # noqa: BLE001 - closed by the scenario already
            pass


def norm(v):
    """Plain, comparable values (arrays and tuples as lists, floats rounded)."""
    if isinstance(v, dict):
        return {k: norm(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [norm(x) for x in v]
    if isinstance(v, np.ndarray):
        return norm(v.tolist())
    if isinstance(v, (float, np.floating)):
        return round(float(v), 9)
    if isinstance(v, (np.integer, np.bool_)):
        return v.item()
    return v


def run(fn, h, ctx):
    try:
        return "ok", norm(fn(h, ctx))
    except Exception as e:  # noqa: BLE001 - the class is the cell's result
        return "raises", type(e).__name__


def classify(call: str, mode: str, got, want) -> tuple[str, str]:
    if got == want:
        return "agrees", ""
    c = contract.CALLS.get(call)
    base = "sharded" if mode.startswith("sharded") else "served" if mode == "wal" else mode
    if c is not None and base in c.refused and got == ("raises", c.refused[base][0].__name__):
        return "refused", f"{got[1]} (listed)"
    if c is not None and base in c.differs:
        return "listed", c.differs[base]
    return "fails", f"got {got!r}, the Table {want!r}"


@pytest.mark.parametrize("mode", MODES)
def test_mode_agrees_with_the_table(mode, ray_local, tmp_path):
    handles, cleanups = build(mode, str(tmp_path / "m"), ray_local)
    refs = {c: Handle(table(c), c) for c in CONFIGS}
    ctx = {c: {"tmp": str(tmp_path / "m")} for c in CONFIGS}
    ref_ctx = {c: {"tmp": str(tmp_path / "ref")} for c in CONFIGS}
    fails = []
    try:
        for i, (cfg, call, name, fn) in enumerate([*CELLS, *CLOSING]):
            want = run(fn, refs[cfg], ref_ctx[cfg])
            h = handles[cfg]
            got = h.run(i) if isinstance(h, InOtherProcess) else run(fn, h, ctx[cfg])
            outcome = classify(call, mode, got, want)
            RESULTS[(f"{cfg}: {name}", mode)] = outcome
            if outcome[0] == "fails":
                fails.append(f"{cfg}: {name} ({call}): {outcome[1]}")
    finally:
        for clean in cleanups:
            try:
                clean()
            except Exception:  # noqa: BLE001 - cleanup after a failure
                pass
    assert not fails, f"{mode}: {len(fails)} cells disagree with the Table:\n" + "\n".join(fails)


def test_sharded_edges(ray_local):
    """What the scenario does not reach: an uneven capacity split, a batch larger than a shard, a
    routed write refused before any shard changes, and ``Closed`` seen by another client."""
    import functools

    from conformance_scenario import batch

    import replaystore as rs
    from replaystore import ray as rsr

    c = rsr.serve_sharded(functools.partial(rs.Table, 5, seed=2), 2, name=unique("edge"), depth=1)
    try:
        assert [st["capacity"] for st in c.stats()["shards"]] == [3, 2]
        keys = c.extend(batch(0, 5))  # larger than either shard: split over both, as one Table keeps all 5
        assert len(c) == 5 and sorted(c.get(keys)[0]["id"].tolist()) == list(range(5))
        with pytest.raises(rs.InvalidPriority):
            c.extend(batch(5, 2), priorities=[1.0, np.nan], route=[0, 1])
        with pytest.raises(rs.InvalidArgument):
            c.extend(batch(5, 2), route=[0])
        assert len(c) == 5 and c.stats()["total"]["inserts"] == 5
        c.close()
        with pytest.raises(rs.Closed):
            rsr.connect_sharded(c.name).sample(1, timeout=0.1)
    finally:
        c.shutdown()


def test_matrix_summary():
    """Print the matrix (and write it where ``$REPLAYSTORE_CONFORMANCE_MATRIX`` says)."""
    if not RESULTS:
        pytest.skip("no mode ran")
    cells = list(dict.fromkeys(c for c, _ in RESULTS))
    modes = [m for m in MODES if any((c, m) in RESULTS for c in cells)]
    mark = {"agrees": "=", "refused": "R", "listed": "L", "fails": "X"}
    lines = ["| cell | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for c in cells:
        row = [mark[RESULTS[(c, m)][0]] if (c, m) in RESULTS else "" for m in modes]
        lines.append(f"| {c} | " + " | ".join(row) + " |")
    counts = {k: sum(1 for v in RESULTS.values() if v[0] == k) for k in mark}
    lines.append("")
    lines.append(", ".join(f"{k}: {v}" for k, v in counts.items()) + f" (of {len(RESULTS)} cells)")
    notes = sorted({f"- {c} / {m}: {v[1]}" for (c, m), v in RESULTS.items() if v[0] in ("listed", "refused")})
    text = "\n".join(lines + notes)
    print(text)
    out = os.environ.get("REPLAYSTORE_CONFORMANCE_MATRIX")
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
