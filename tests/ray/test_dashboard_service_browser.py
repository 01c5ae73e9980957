"""The dashboard page against a running Ray service (headless Chromium): a writer and a learner through
the client, values that match the service's stats(), a stalled learner, the service restarting while
the page is open, and a node whose disk fills up. Slow (a Ray instance and a browser): ``pytest -m slow``."""

import os
import sys
import time
import uuid

import numpy as np
import pytest
from ray_fixtures import start_ray

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: dashboard_browser

from dashboard_browser import Workload, chromium_paths, make_table, open_browser  # noqa: E402

from replaystore.metrics import ServiceSource, serve_dashboard  # noqa: E402

PERIOD = 0.5
browser_path, driver_path = chromium_paths()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        browser_path is None or driver_path is None,
        reason="no chromium + chromedriver on this machine (Debian: apt-get install chromium chromium-driver)",
    ),
]


def wait_for(what, fn, timeout=20.0):
    end = time.monotonic() + timeout
    while not (value := fn()):
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


@pytest.fixture(scope="module")
def ray_local():
    ray = start_ray(resources={"database": 1})  # (a node-local fragment store on this node)
    yield ray
    ray.shutdown()


def test_the_page_follows_a_service_and_its_restart(ray_local):
    pytest.importorskip("selenium")
    from replaystore import ray as rsr

    name = f"dash-{uuid.uuid4().hex[:6]}"
    client = rsr.serve({"replay": make_table}, name=name)
    work = Workload(client).start()
    dash = serve_dashboard(ServiceSource(name, rpc_timeout=5), port=0, period=PERIOD)
    driver = open_browser()
    status = "return document.getElementById('status').textContent"
    alerts = "return [...document.querySelectorAll('#alerts .alert')].map(a => a.textContent)"
    try:
        driver.get(dash.url)
        wait_for(
            "points",
            lambda: (
                int(
                    driver.execute_script(
                        "return document.querySelector('canvas[data-chart=\"inserts\"]')?.dataset.npoints || 0"
                    )
                )
                >= 3
            ),
        )
        assert driver.execute_script(status) == "live"
        assert "service " + name in driver.find_element("id", "source").text
        work.pause()
        st = client.stats()["replay"]

        def row():
            r = driver.execute_script(
                "const o = {}; document.querySelectorAll('tr[data-table=\"replay\"] td')"
                ".forEach(td => o[td.dataset.field] = td.dataset.value); return o;"
            )
            return r if r.get("inserts") == str(st["inserts"]) and r.get("samples") == str(st["samples"]) else None

        r = wait_for("the row to match the service's stats()", row)
        assert int(r["size"]) == st["size"] and float(r["target"]) == 2.0
        work.resume()
        time.sleep(1.0)
        work.starve()
        wait_for("the stalled learner", lambda: [a for a in driver.execute_script(alerts) if "Learner stalled" in a])
        work.close()  # closes the service's tables (the blocked sample returns Closed)
        client.shutdown()
        wait_for("source unavailable", lambda: driver.execute_script(status) == "source unavailable")
        assert any(name in a for a in driver.execute_script(alerts))
        client = rsr.serve({"replay": make_table}, name=name)
        client.extend({"obs": np.zeros((5, 4), np.float32)})
        wait_for("live again", lambda: driver.execute_script(status) == "live")
        inserts = 'return document.querySelector(\'tr[data-table="replay"] td[data-field="inserts"]\')?.dataset.value'
        wait_for("the new service's row", lambda: driver.execute_script(inserts) == "5")
    finally:
        driver.quit()
        dash.close()
        client.shutdown()


def test_the_page_shows_a_node_whose_disk_fills_up(ray_local, tmpfs_factory):
    pytest.importorskip("selenium")
    pytest.importorskip("lmdb")
    from replaystore import ray as rsr

    mnt = tmpfs_factory("96m")
    cfg = dict(max_chunks=64, max_staleness=4, max_reuse=100, fragments_per_chunk=1, path=str(mnt / "store"))
    cfg.update(num_shards=1, map_size=1 << 24, lease_ttl=None, node_local="database", seed=0)
    name = f"nodes-{uuid.uuid4().hex[:6]}"
    client = rsr.serve(name=name, fragments=rsr.FragmentBufferConfig(**cfg), housekeeping_period=0)
    dash = serve_dashboard(ServiceSource(name, rpc_timeout=10), port=0, period=PERIOD)
    driver = open_browser()
    alerts = "return [...document.querySelectorAll('#alerts .alert')].map(a => a.textContent)"
    try:
        driver.get(dash.url)
        node_row = "return document.querySelector('#nodes tbody tr')?.dataset.node"
        label = wait_for("the node's row", lambda: driver.execute_script(node_row))
        assert not [a for a in driver.execute_script(alerts) if "nearly full" in a]
        # a lease shows per node: its fragments on the leased-fragments chart and in the node's row
        fc = client.fragments
        fc.update_model_version("s", 0)
        fc.add(fc.put({"x": 1}), "a", 0, 0, "s")
        fc.fetch(1, timeout=30)
        leased = f"return document.querySelector('[data-series=\"{label}:leased_fragments\"]')?.dataset.latest"
        wait_for("the leased fragment", lambda: driver.execute_script(leased) == "1")
        free = client.stats()["fragments"]["nodes"][label]["free_bytes"]
        with open(mnt / "ballast", "wb") as f:  # leave 32 MiB: under the page's 64 MiB mark
            os.posix_fallocate(f.fileno(), 0, free - (32 << 20))
        t0 = time.monotonic()
        (text,) = wait_for(
            "the full-node alert", lambda: [a for a in driver.execute_script(alerts) if "nearly full" in a]
        )
        shown_after = time.monotonic() - t0
        print(f"full node shown {shown_after:.2f} s after the disk filled")
        assert label in text and "MiB free" in text
        assert shown_after <= 2 * PERIOD + 1.0  # the recorder's next read, then the page's next poll
    finally:
        driver.quit()
        dash.close()
        client.shutdown()
