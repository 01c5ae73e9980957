"""A service that cannot start says why: ``serve`` raises the actor's own start error (same class,
same message), every time (not depending on timing), and the name is free again afterwards."""

import functools
import os
import struct
import time

import numpy as np
import pytest
from ray_fixtures import start_ray

import replaystore as rs
from replaystore.wal.log import MAGIC, WalConfig, list_segments
from replaystore.wal.logged import LoggedTable

pytestmark = pytest.mark.timeout(240)
TRIES = 3  # each failure is repeated: the same exception every time


@pytest.fixture(scope="module")
def ray_local():
    ray = start_ray()
    yield ray
    ray.shutdown()


class FactoryBroke(RuntimeError):
    """A user's own error, raised by a table factory inside the actor."""


def broken_factory():
    raise FactoryBroke("the factory cannot reach its config server (code 7)")


def rows(ids):
    ids = np.asarray(ids, dtype=np.int64)
    return {"id": ids, "x": ids.astype(np.float32)}


def serve_fails(name, expected, match, **kwargs):
    """``serve`` raises ``expected`` (exactly that class) matching ``match``, TRIES times; the name is free."""
    from replaystore import ray as rsr

    messages = set()
    for _ in range(TRIES):
        with pytest.raises(Exception) as info:  # noqa: PT011 - the class is asserted exactly below
            rsr.serve(name=name, start_timeout=60, **kwargs)
        assert type(info.value) is expected, f"{type(info.value).__name__}: {info.value}"
        assert match in str(info.value)
        messages.add(str(info.value))
        assert rsr._runtime.find_actor(name, None) is None  # the failed service gave its name back at once
    assert len(messages) == 1, messages


def good_serve(name, **kwargs):
    from replaystore import ray as rsr

    return rsr.serve(name=name, start_timeout=60, **kwargs)


def test_factory_error_reaches_the_caller(ray_local):
    serve_fails("svc-start-factory", FactoryBroke, "config server (code 7)", tables={"t": broken_factory})
    serve_fails("svc-start-factory", rs.InvalidType, "returned int, not a Table", tables={"t": lambda: 3})
    c = good_serve("svc-start-factory", tables={"t": functools.partial(rs.Table, 10)})
    assert c.ping()["tables"] == ["t"]
    c.shutdown()


def test_refused_option_reaches_the_caller(ray_local, tmp_path):
    objs = functools.partial(rs.Table, 10, storage="objects")
    serve_fails(
        "svc-start-refused",
        rs.SpecError,
        "stores Python objects",
        tables={"objs": objs},
        wal=WalConfig(dir=str(tmp_path)),
    )
    c = good_serve("svc-start-refused", tables={"objs": objs})
    c.add({"any": "thing"})
    assert len(c) == 1
    c.shutdown()


def _flip_middle_record(seg_path):
    data = bytearray(open(seg_path, "rb").read())
    pos, offsets = len(MAGIC), []
    while pos < len(data):
        offsets.append(pos)
        pos += 20 + struct.unpack_from("<I", data, pos)[0]
    assert len(offsets) >= 3
    data[offsets[1] + 60] ^= 0x01  # inside record 2 of 3+: not a torn tail
    open(seg_path, "wb").write(data)


def test_corrupt_log_raises_wal_corrupt(ray_local, tmp_path):
    wal_dir = tmp_path / "wal"
    cfg = WalConfig(dir=str(wal_dir), fsync="always")
    lt = LoggedTable.open(rs.Table(100), str(wal_dir / "default"), cfg)
    for i in range(3):
        lt.durable("extend", rows(np.arange(8 * i, 8 * i + 8)))
    lt.close()
    (seg,) = [p for _, p in list_segments(str(wal_dir / "default"))]
    good = open(seg, "rb").read()
    _flip_middle_record(seg)
    serve_fails("svc-start-wal", rs.WalCorrupt, "record", tables=functools.partial(rs.Table, 100), wal=cfg)
    open(seg, "wb").write(good)  # repaired: the same name serves the logged table, all of it
    c = good_serve("svc-start-wal", tables=functools.partial(rs.Table, 100), wal=cfg)
    assert sorted(c.keys().tolist()) == list(range(24))
    c.shutdown()


def test_corrupt_checkpoint_raises_checkpoint_error(ray_local, tmp_path):
    ckpt = tmp_path / "ckpt"
    t = rs.Table(100)
    t.extend(rows(np.arange(10)))
    t.save(str(ckpt / "default"))
    victim = ckpt / "default" / "meta_priorities.npy"
    assert victim.exists(), os.listdir(ckpt / "default")
    good = victim.read_bytes()
    bad = bytearray(good)
    bad[-1] ^= 1
    victim.write_bytes(bytes(bad))
    serve_fails(
        "svc-start-ckpt",
        rs.CheckpointError,
        "meta_priorities.npy is corrupted",
        tables=functools.partial(rs.Table, 100),
        checkpoint_dir=str(ckpt),
    )
    victim.write_bytes(good)
    c = good_serve("svc-start-ckpt", tables=functools.partial(rs.Table, 100), checkpoint_dir=str(ckpt))
    assert len(c) == 10
    c.shutdown()


def test_a_restart_that_cannot_rebuild_its_table_says_why(ray_local, tmp_path):
    """Ray restarts a crashed service whose log was damaged meanwhile: calls raise ``WalCorrupt``."""

    cfg = WalConfig(dir=str(tmp_path / "wal"), fsync="always")
    c = good_serve("svc-start-restart", tables=functools.partial(rs.Table, 100), wal=cfg, max_restarts=1)
    for i in range(3):
        c.extend(rows(np.arange(8 * i, 8 * i + 8)), timeout=10)
    (seg,) = [p for _, p in list_segments(str(tmp_path / "wal" / "default"))]
    _flip_middle_record(seg)
    ray_local.kill(c.actor, no_restart=False)
    deadline = time.monotonic() + 90
    while True:
        try:
            c.ping()
        except rs.WalCorrupt as e:
            assert "fails its checksum" in str(e)
            break
        except (rs.Closed, rs.Timeout):  # the old process, or the restart under way
            pass
        assert time.monotonic() < deadline, "the restarted service never reported its start error"
        time.sleep(0.2)
    with pytest.raises(rs.WalCorrupt):
        c.keys()
    with pytest.raises(rs.WalCorrupt):
        c.extend(rows([99]), timeout=5)
    c.shutdown()
