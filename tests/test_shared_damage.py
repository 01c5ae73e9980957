"""Damaged shared segments (issue 37 item 3): every header word and configuration field is untrusted.

A damaged segment attaches as :class:`LayoutMismatch` (or another named error: ``Timeout`` when a
lock word says a live process holds the lock), never as a crash, an ``OverflowError`` or an
``OSError``. Flips run in worker processes (``tests/shared_flips.py``): a crash ends a worker and
is reported, not suffered.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from replaystore.shared import LayoutMismatch, SharedTable
from replaystore.shared.header import HEADER_BYTES, PIDS, W_BUSY, W_DEFERRED, W_JSON_LEN, W_RESERVED
from replaystore.shared.lock import MUTEX_BYTE, default_kind

sys.path.insert(0, os.path.dirname(__file__))
import shared_flips  # noqa: E402


@pytest.fixture
def table(tmp_path):
    t = shared_flips.make(str(tmp_path))
    seg = tmp_path / f"replaystore-{shared_flips.NAME}" / "segment"
    yield t, tmp_path, seg
    with open(seg, "r+b") as f:  # undamaged again for the creator's close
        f.write((tmp_path / "pristine").read_bytes())
    t.close()


def rewrite_config(seg: Path, edit) -> None:
    raw = bytearray(seg.read_bytes())
    words = np.frombuffer(raw, np.int64, count=HEADER_BYTES // 8)
    n = int(words[W_JSON_LEN])
    config = json.loads(bytes(raw[HEADER_BYTES : HEADER_BYTES + n]))
    first = min(r["offset"] for r in config["regions"])
    edit(config)
    new = json.dumps(config).encode()
    assert HEADER_BYTES + len(new) <= first
    raw[HEADER_BYTES : HEADER_BYTES + max(n, len(new))] = new.ljust(max(n, len(new)), b" ")
    raw[W_JSON_LEN * 8 : W_JSON_LEN * 8 + 8] = len(new).to_bytes(8, "little")
    seg.write_bytes(raw)


def region(config, name):
    return next(r for r in config["regions"] if r["name"].endswith(name))


def attach(directory):
    return SharedTable.attach(shared_flips.NAME, directory=str(directory), lock_timeout=0.5)


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda c: region(c, "act").update(offset=region(c, "obs")["offset"]), id="same-offset"),
        pytest.param(lambda c: region(c, "act").update(offset=region(c, "act")["offset"] + 8), id="misaligned"),
        pytest.param(lambda c: region(c, "act").update(offset=region(c, "act")["offset"] + 4096), id="overlap"),
        pytest.param(lambda c: region(c, "act").update(offset=1 << 40), id="outside"),
        pytest.param(lambda c: region(c, "act").update(offset=-4096), id="negative"),
        pytest.param(lambda c: region(c, "act").update(dtype="|O"), id="object-dtype"),
        pytest.param(lambda c: region(c, "act").update(shape=[-1]), id="negative-shape"),
        pytest.param(lambda c: c.update(capacity=17), id="capacity"),
        pytest.param(lambda c: c.update(sampler={"type": "Nope"}), id="sampler"),
        pytest.param(lambda c: c.pop("spec"), id="no-spec"),
        pytest.param(lambda c: c.update(regions=c["regions"] + [dict(c["regions"][0])]), id="duplicate-region"),
    ],
)
def test_a_damaged_configuration_is_layout_mismatch(table, edit):
    t, directory, seg = table
    rewrite_config(seg, edit)
    with pytest.raises(LayoutMismatch):
        attach(directory)


@pytest.mark.parametrize(
    "word, value",
    [(W_BUSY, -5), (W_BUSY, 1 << 40), (PIDS + 3, -1), (PIDS, 1 << 62), (W_RESERVED, -2), (W_DEFERRED, 7)],
)
def test_a_header_word_out_of_range_is_layout_mismatch(table, word, value):
    t, directory, seg = table
    with open(seg, "r+b") as f:
        f.seek(word * 8)
        f.write(int(value).to_bytes(8, "little", signed=True))
    with pytest.raises(LayoutMismatch, match="out of its range"):
        attach(directory)


@pytest.mark.skipif(default_kind() != 1, reason="the robust mutex is not compiled here")
def test_a_damaged_mutex_type_is_layout_mismatch(table):
    t, directory, seg = table
    with open(seg, "r+b") as f:
        f.seek(MUTEX_BYTE + 16)
        f.write(b"\xff")
    with pytest.raises(LayoutMismatch, match="mutex"):
        attach(directory)


def test_an_undamaged_segment_attaches_and_reads_back(table):
    t, directory, seg = table
    a = attach(directory)
    try:
        assert sorted(a.sample(5, timeout=1).data["act"].tolist())[:1] in ([0], [1], [2], [3], [4])
        assert len(a) == 5
    finally:
        a.close()


def flips(seg: bytes, exhaustive: bool) -> list[tuple[int, int]]:
    """Every byte of the header's words, its mutex and the JSON configuration, flipped four ways;
    the default run takes a fixed sample of 300 of them (the slow test takes all)."""
    n = int(np.frombuffer(seg, np.int64, count=HEADER_BYTES // 8)[W_JSON_LEN])
    where = [*range((W_DEFERRED + 1) * 8), *range(MUTEX_BYTE, MUTEX_BYTE + 40), *range(HEADER_BYTES, HEADER_BYTES + n)]
    every = [(o, x) for o in where for x in (0x01, 0x10, 0x80, 0xFF)]
    if exhaustive:
        return every
    pick = np.random.default_rng(37).choice(len(every), 300, replace=False)
    return [every[i] for i in sorted(pick)]


def check_flips(tmp_path, lock: str, exhaustive: bool) -> None:
    t = shared_flips.make(str(tmp_path), lock)
    try:
        pristine = (tmp_path / "pristine").read_bytes()
        results = shared_flips.run(str(tmp_path), flips(pristine, exhaustive))
    finally:
        t.close()
    bad = {k: v for k, v in results.items() if not (v == "ok" or v.startswith("named"))}
    assert not bad, f"{len(bad)} of {len(results)} flips: {dict(list(bad.items())[:10])}"
    assert sum(v == "named LayoutMismatch" for v in results.values()) > len(results) // 10  # damage is seen


@pytest.mark.parametrize("lock", ["auto", "flock"])
def test_single_byte_flips_give_named_errors_or_a_working_table(tmp_path, lock):
    check_flips(tmp_path, lock, exhaustive=False)


@pytest.mark.slow
@pytest.mark.parametrize("lock", ["auto", "flock"])
def test_every_single_byte_flip_gives_a_named_error_or_a_working_table(tmp_path, lock):
    check_flips(tmp_path, lock, exhaustive=True)


def test_a_tree_dtype_other_than_the_segments_is_layout_mismatch_naming_the_region(table):
    """A float64 prioritized segment whose configuration asks for float32 trees (damaged, or written
    by another version) is refused with the tree's region named, never read as float32."""
    t, directory, seg = table
    rewrite_config(seg, lambda c: c["sampler"].update(tree_dtype="float32"))
    with pytest.raises(LayoutMismatch, match=r"prioritized\.sum.*float64.*float32"):
        attach(directory)
