"""Take the docs' screenshot of the dashboard (docs/img/dashboard.png) in headless Chromium.

A prioritized table with a writer and a learner thread (tests/dashboard_browser.py) runs for
``--seconds``; then the writer stops, the learner blocks in the rate limiter, and once the page
shows it the screenshot is taken.

Usage::

    PYTHONPATH=src python tools/dashboard_screenshot.py [--out docs/img/dashboard.png] [--seconds 40]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from dashboard_browser import Workload, make_table, open_browser  # noqa: E402

from replaystore.metrics import serve_dashboard  # noqa: E402


def main() -> int:
    """Run the workload, wait for the stall on the page, write the PNG; 0 on success."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img" / "dashboard.png"))
    ap.add_argument("--seconds", type=float, default=40.0)
    args = ap.parse_args()
    table = make_table()
    work = Workload(table).start()
    dash = serve_dashboard(table, port=0, period=0.5)
    driver = open_browser(1400, 1180)
    try:
        driver.get(dash.url)
        time.sleep(args.seconds)
        work.starve()
        deadline = time.monotonic() + 30
        while "Learner stalled" not in driver.find_element("id", "alerts").text:
            if time.monotonic() > deadline:
                print("the stall never showed", file=sys.stderr)
                return 1
            time.sleep(0.1)
        time.sleep(2.5)  # a few points of the stall on the charts
        driver.save_screenshot(args.out)
        print(f"wrote {args.out}")
    finally:
        driver.quit()
        work.close()
        dash.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
