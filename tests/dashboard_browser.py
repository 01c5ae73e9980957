"""Helpers for the dashboard's browser tests: headless Chromium through chromedriver, and a live workload.

A helper module (not a test file): tests/test_dashboard_browser.py and tools/dashboard_screenshot.py
import it.
"""

import shutil
import threading
import time

import numpy as np

import replaystore as rs


def chromium_paths():
    """``(chromium, chromedriver)`` paths, or ``None`` where missing."""
    browser = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    return browser, shutil.which("chromedriver")


def open_browser(width=1400, height=1500):
    """A headless Chromium driven by selenium (the caller quits it)."""
    from selenium import webdriver

    browser, driver = chromium_paths()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"):
        opts.add_argument(arg)
    opts.add_argument(f"--window-size={width},{height}")
    return webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=driver))


class Workload:
    """A writer and a learner (threads) on ``table``; ``pause()`` both, ``starve()`` the learner.

    The writer extends 32 rows every few ms and moves the version every 40 calls; the learner samples
    64 and updates their priorities. ``starve()`` stops the writer and lets the learner block in the
    rate limiter (a stalled learner), ``pause()`` stops both outside the table.
    """

    def __init__(self, table, seed=0):
        self.table = table
        self.rng = np.random.default_rng(seed)
        self.learner_rng = np.random.default_rng(seed + 1)
        self.writing = threading.Event()
        self.learning = threading.Event()
        self.stop = threading.Event()
        self.idle = {"writer": threading.Event(), "learner": threading.Event()}
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._write, self._learn)]

    def start(self):
        self.writing.set()
        self.learning.set()
        for t in self.threads:
            t.start()
        return self

    def _write(self):
        calls = 0
        while not self.stop.is_set():
            if not self.writing.is_set():
                self.idle["writer"].set()
                time.sleep(0.01)
                continue
            self.idle["writer"].clear()
            obs = self.rng.standard_normal((32, 4)).astype(np.float32)
            calls += 1
            try:
                self.table.extend({"obs": obs}, version=calls // 40, timeout=0.3)
                if calls % 40 == 0:
                    self.table.set_version(calls // 40)
            except rs.Timeout:
                pass
            except rs.Closed:
                break
            time.sleep(0.004)
        self.idle["writer"].set()

    def _learn(self):
        while not self.stop.is_set():
            if not self.learning.is_set():
                self.idle["learner"].set()
                time.sleep(0.01)
                continue
            self.idle["learner"].clear()
            try:
                s = self.table.sample(64, timeout=None if not self.writing.is_set() else 0.3)
                self.table.update_priorities(s.keys, self.learner_rng.exponential(1.0, len(s.keys)) + 1e-3)
            except (rs.Timeout, rs.Closed):
                pass
            time.sleep(0.002)
        self.idle["learner"].set()

    def pause(self):
        """Stop both threads outside the table (returns once both are idle)."""
        self.writing.clear()
        self.learning.clear()
        for e in self.idle.values():
            assert e.wait(10), "a workload thread did not stop"

    def resume(self):
        self.idle["writer"].clear()
        self.idle["learner"].clear()
        self.writing.set()
        self.learning.set()

    def starve(self):
        """Stop the writer; the learner then blocks in the rate limiter (no timeout) until :meth:`close`."""
        self.writing.clear()
        assert self.idle["writer"].wait(10)

    def close(self):
        self.stop.set()
        self.writing.set()  # the learner's blocked sample returns once the writer writes again
        self.table.close()  # (or raises Closed)
        for t in self.threads:
            t.join(10)


def make_table():
    """The table of the browser tests and the docs' screenshot: prioritized, paced at 2 samples per insert."""
    return rs.Table(
        30_000,
        sampler=rs.Prioritized(0.6, 0.4),
        remover=rs.Fifo(),
        rate_limiter=rs.SampleToInsertRatio(2.0, 500, 4_000.0),
        seed=0,
        name="replay",
    )
