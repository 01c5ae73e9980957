"""The dashboard page in a real browser (headless Chromium): charts update, values match stats(), a
stalled learner shows within one refresh, and the page recovers when its server restarts."""

import time

import pytest
from dashboard_browser import Workload, chromium_paths, make_table, open_browser

from replaystore.metrics import TableSource, serve_dashboard

PERIOD = 0.5  # seconds between reads of stats(), and between the page's refreshes

browser_path, driver_path = chromium_paths()
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        browser_path is None or driver_path is None,
        reason="no chromium + chromedriver on this machine (Debian: apt-get install chromium chromium-driver; "
        ".ci/run installs them)",
    ),
]


def wait_for(what, fn, timeout=60.0, every=0.05):
    """Poll ``fn()`` until it returns something truthy; its value, and how long it took."""
    start = time.monotonic()
    while True:
        value = fn()
        if value:
            return value, time.monotonic() - start
        assert time.monotonic() - start < timeout, f"timed out after {timeout}s waiting for {what}"
        time.sleep(every)


def js(driver, script):
    return driver.execute_script(script)


def cells(driver, table):
    """The tables table's row of ``table``: ``{field: data-value}``."""
    return js(
        driver,
        f"""const out = {{}};
        document.querySelectorAll('tr[data-table="{table}"] td')
            .forEach(td => out[td.dataset.field] = td.dataset.value);
        return out;""",
    )


def renders(driver, chart):
    v = js(driver, f"const c = document.querySelector('canvas[data-chart=\"{chart}\"]'); return c && c.dataset;")
    return v or {}


def alerts(driver):
    return js(driver, "return [...document.querySelectorAll('#alerts .alert')].map(a => a.textContent);")


@pytest.fixture
def browser():
    pytest.importorskip("selenium", reason="the browser tests drive chromium with selenium (the [dev] extra)")
    driver = open_browser()
    try:
        yield driver
    finally:
        driver.quit()


def test_the_page_follows_a_writer_and_a_learner(browser):
    table = make_table()
    work = Workload(table).start()
    dash = serve_dashboard(table, port=0, period=PERIOD)
    try:
        browser.get(dash.url)
        # charts update while the writer and the learner run
        wait_for("points on the inserts chart", lambda: int(renders(browser, "inserts").get("npoints", 0)) >= 3)
        first = renders(browser, "inserts")
        (latest, _) = wait_for(
            "a positive inserts/s",
            lambda: js(
                browser,
                "return Number(document.querySelector('[data-series=\"replay:inserts_per_s\"]')?.dataset.latest || 0)",
            ),
        )
        assert latest > 0
        wait_for("more renders", lambda: int(renders(browser, "inserts")["renders"]) > int(first["renders"]) + 1)
        assert int(renders(browser, "inserts")["npoints"]) > int(first["npoints"])
        assert js(browser, "return document.getElementById('status').textContent") == "live"
        # quiet the workload: after a refresh the page shows exactly what stats() says
        work.pause()
        st = table.stats()

        def settled():
            row = cells(browser, "replay")
            same = row.get("inserts") == str(st["inserts"]) and row.get("samples") == str(st["samples"])
            return row if same else None

        row, _ = wait_for("the table row to match stats()", settled)
        assert int(row["size"]) == st["size"] and int(row["capacity"]) == st["capacity"] == 30_000
        assert int(row["evictions"]) == st["evictions"]
        assert float(row["sample_to_insert_ratio"]) == pytest.approx(st["sample_to_insert_ratio"])
        assert float(row["target"]) == 2.0 and "Prioritized" in row["sampler"]
        total, _ = wait_for("the priority histogram", lambda: int(renders(browser, "prio-replay").get("total", 0)))
        assert total == st["size"]
        wait_for(
            "inserts/s back to 0",
            lambda: (
                js(browser, "return document.querySelector('[data-series=\"replay:inserts_per_s\"]').dataset.latest")
                == "0"
            ),
        )
        # a stalled learner: the writer stops, the learner blocks in the rate limiter
        work.resume()
        time.sleep(1.0)
        work.starve()
        _, onset = wait_for("the learner to block", lambda: table.stats()["sample_waiting"], every=0.01)
        t0, ticks0 = time.monotonic(), js(browser, "return window.replaystoreDashboard.renders")
        text, _ = wait_for("the stalled-learner alert", lambda: [a for a in alerts(browser) if "Learner stalled" in a])
        shown_after = time.monotonic() - t0
        ticks = js(browser, "return window.replaystoreDashboard.renders") - ticks0
        print(f"stalled learner shown {shown_after:.2f} s ({ticks} page refreshes) after stats() reported the wait")
        assert "blocked by the rate limiter" in text[0] and "replay" in text[0]
        # within one refresh: the recorder's next read (<= PERIOD) plus the page's next poll (<= PERIOD),
        # counted in the page's refreshes (each one PERIOD when quiet; a loaded machine stretches them
        # all alike, so a wall-clock bound of 2 * PERIOD + 1 s failed there): at most 2, and 2 of margin
        assert ticks <= 4, f"the stall showed {ticks} refreshes ({shown_after:.2f} s) after it began"
        # the dashboard server restarts (a new recorder, a new sequence): the page says so, then recovers
        port = dash.server.port
        dash.close()
        wait_for("the unreachable banner", lambda: [a for a in alerts(browser) if "does not answer" in a])
        assert js(browser, "return document.getElementById('status').textContent") == "dashboard unreachable"
        dash = serve_dashboard(table, port=port, period=PERIOD)
        wait_for("live again", lambda: js(browser, "return document.getElementById('status').textContent") == "live")
        wait_for("points after the restart", lambda: int(renders(browser, "inserts").get("npoints", 0)) >= 2)
        assert js(browser, "return window.replaystoreDashboard.lastSeq") <= dash.recorder.seq
    finally:
        work.close()
        dash.close()


def latest(driver, key):
    """The newest value the page shows for the series ``key`` (``None``: no such series yet)."""
    v = js(driver, f"const s = document.querySelector('[data-series=\"{key}\"]'); return s ? s.dataset.latest : null;")
    return None if v is None else (float(v) if v != "" else None)


def test_the_page_charts_a_rollout_buffers_budget_groups_and_refusals(browser):
    from replaystore.online import RolloutBuffer

    buf = RolloutBuffer(64, batch_size=4, max_staleness=1, group_size=1)
    dash = serve_dashboard(TableSource(make_table(), online=buf), port=0, period=PERIOD)
    try:
        browser.get(dash.url)
        wait_for("the budget chart", lambda: latest(browser, "rollouts:tickets") == 0)  # seen once, at rest
        tickets = buf.acquire(5)
        for t in tickets[:3]:
            buf.add("x", group=t)
        buf.reject(tickets[3], "all_equal")
        want = buf.stats()
        # the charts show the budget's tickets and the groups as stats() says, and the refusal by its reason
        wait_for("tickets running", lambda: latest(browser, "rollouts:tickets") == want["budget"]["running"] == 1)
        assert latest(browser, "rollouts:budget_limit") == want["budget"]["limit"]
        assert latest(browser, "rollouts:budget_accepted") == want["budget"]["accepted"] == 3
        wait_for("the groups chart", lambda: latest(browser, "rollouts:groups") == want["groups"] == 3)
        # a reason's series shows once its rate was above 0 in the window; it goes back to 0 after
        wait_for("the rate back at 0", lambda: latest(browser, "rollouts:rejected_per_s:all_equal") == 0)
        assert js(
            browser, "return replaystoreDashboard.points.some(p => p.online?.rollouts?.rejected_per_s?.all_equal > 0)"
        )
        assert int(renders(browser, "online-refusals-rollouts").get("renders", 0)) >= 2
    finally:
        dash.close()
        buf.close()
