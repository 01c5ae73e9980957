"""connect() without Ray fails at once with a named error (issue 38, item 7).

Item 6 (a blocked remote call warns in the caller's process and can be interrupted) is tested in
test_service_tables.py, on its Ray instance.
"""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


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
