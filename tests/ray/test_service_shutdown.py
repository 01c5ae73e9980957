"""A service shut down with ``client.shutdown()`` leaves no asyncio task pending (issue 38 item 9).

Its periodic tasks (stats reports, housekeeping) used to be cancelled but never awaited, so the
actor's exit printed ``Task was destroyed but it is pending!`` (in its log, forwarded to the
driver). The actor's own stderr log is read after its process is gone.
"""

import glob
import os
import time

import pytest
from ray_fixtures import start_ray, transitions

import replaystore as rs

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ray_local():
    ray = start_ray()
    yield ray
    ray.shutdown()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("how", ["shutdown", "dropped"])
def test_an_ended_service_leaves_no_pending_task(ray_local, how):
    """``client.shutdown()``, or every handle dropped (Ray's graceful exit of the actor)."""
    import gc

    from replaystore.ray import serve

    client = serve(lambda: rs.Table(100), name=f"ended-{how}", report_period=0.05, housekeeping_period=0.05)
    client.extend(transitions(8))
    pid = ray_local.get(client.actor.pid.remote())
    time.sleep(0.3)  # the periodic report has run a few times
    if how == "shutdown":
        client.shutdown()
    del client
    gc.collect()
    deadline = time.monotonic() + 60
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(pid)
    logs = glob.glob(f"/tmp/ray/session_*/logs/worker-*-{pid}.err")
    assert logs, "the actor's stderr log was not found"
    text = open(max(logs, key=os.path.getmtime), encoding="utf-8", errors="replace").read()
    assert ":actor_name:ReplayServer" in text  # the right log
    assert "Task was destroyed but it is pending" not in text, text[-2000:]
