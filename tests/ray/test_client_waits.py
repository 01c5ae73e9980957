"""A blocked remote call warns in the caller's process and can be interrupted; connect() without Ray
fails at once (issue 38, items 6 and 7)."""

import os
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
from ray_fixtures import start_ray, transitions

import replaystore as rs
from replaystore import ray as rsr
from replaystore.ray import _runtime

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def ray_local():
    try:
        yield start_ray(namespace=f"waits-{uuid.uuid4().hex[:8]}")
    finally:
        import ray

        ray.shutdown()


class Alarm(Exception):
    pass


def _alarm(signum, frame):
    raise Alarm


@pytest.fixture
def service(ray_local):
    c = rsr.serve(lambda: rs.Table(100, seed=0), name=f"waits-{uuid.uuid4().hex[:8]}")
    yield c
    c.shutdown()


def test_blocked_sample_warns_in_the_caller_and_is_interruptible(service, monkeypatch):
    monkeypatch.setattr(_runtime, "BLOCKING_WARNING_S", 0.5)
    old = signal.signal(signal.SIGALRM, _alarm)
    t0 = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, 2.0)
        with pytest.warns(rs.BlockingWarning, match="no timeout"), pytest.raises(Alarm):
            service.sample(4)  # an empty table, no timeout: would wait for good
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.monotonic() - t0 < 10  # the handler ran while the call waited
    service.extend(transitions(10))  # still usable (the abandoned sample takes its 4 on the service)
    s = service.sample(2, timeout=5)
    assert len(s.keys) == 2


def test_calls_with_a_timeout_do_not_warn(service, monkeypatch, recwarn):
    monkeypatch.setattr(_runtime, "BLOCKING_WARNING_S", 0.0)
    with pytest.raises(rs.Timeout):
        service.sample(4, timeout=0.6)
    service.extend(transitions(3))
    assert np.asarray(service.keys()).size == 3
    assert not [w for w in recwarn if issubclass(w.category, rs.BlockingWarning)]


def test_connect_without_ray_init_fails_at_once_with_a_named_error():
    code = (
        "import time, ray\n"
        "import replaystore as rs\n"
        "from replaystore import ray as rsr\n"
        "t = time.monotonic()\n"
        "for call in (lambda: rsr.connect('nosuch'), lambda: rsr.connect_sharded('nosuch')):\n"
        "    try:\n"
        "        call()\n"
        "    except rs.NotConnected as e:\n"
        "        assert 'ray.init' in str(e), e\n"
        "    else:\n"
        "        raise SystemExit('no error')\n"
        "assert not ray.is_initialized(), 'a local Ray was started'\n"
        "print(round(time.monotonic() - t, 3))\n"
    )
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="disabled")
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip().splitlines()[-1]) < 2.0
