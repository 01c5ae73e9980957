"""What the docs say a mode refuses is what the code refuses (issue 37 item 7).

Each claim is one (mode, calls) pair with the code's answer, checked by running the code (a
``LoggedTable``: what ``serve(..., wal=...)`` runs, without Ray). Then no sentence of any docs page
(or the README) may say that mode refuses those calls when the code serves them, and a refusal the
code makes must be stated as one wherever a page speaks of it.
"""

from __future__ import annotations

import pathlib
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

import replaystore as rs

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
REFUSAL = re.compile(r"\brefus(e|es|ed|ing)\b|\bcannot be logged\b|\bnot loggable\b", re.I)


def _logged(table: rs.Table):
    pytest.importorskip("ray")
    from replaystore.wal.log import WalConfig
    from replaystore.wal.logged import LoggedTable

    d = tempfile.mkdtemp(prefix="refusals-")
    return LoggedTable.open(table, f"{d}/wal", WalConfig(dir=d))


def wal_episode_calls_refused() -> bool:
    table = rs.Table(32, episodes=rs.Episodes(max_streams=4))
    lt = _logged(table)
    try:
        step = {"obs": np.zeros((2, 3), np.float32), "reward": np.ones(2, np.float32)}
        lt.durable("extend_steps", step, np.array([0, 1]), terminated=np.array([False, True]), timeout=0)
        lt.durable("add_step", {"obs": np.zeros(3, np.float32), "reward": np.float32(1)}, 0, timeout=0)
        lt.durable("end_episode", [0])
        lt.durable("add_episode", {"obs": np.zeros((3, 3), np.float32), "reward": np.ones(3, np.float32)}, timeout=0)
        lt.durable("sample_sequences", 2, 2, timeout=0)
        lt.durable("sample_nstep", 2, 2, 0.9, timeout=0)
        lt.durable("sample_episodes", 1, timeout=0)
    except (rs.SpecError, rs.InvalidArgument, NotImplementedError):
        return True
    finally:
        lt.close()
    assert table.stats()["size"] == 6
    return False


def wal_object_storage_refused() -> bool:
    try:
        _logged(rs.Table(8, storage="objects")).close()
    except rs.SpecError:
        return True
    return False


@dataclass
class Claim:
    mode: str  # a regex naming the mode in a sentence
    calls: str  # a regex naming the calls in a sentence
    refused: bool  # what the docs may say
    check: Callable[[], bool]  # what the code does


CLAIMS = {
    "wal x episode calls": Claim(r"wal=|write-ahead log", r"episod", False, wal_episode_calls_refused),
    "wal x object storage": Claim(r"wal=|write-ahead log|\blog\b", r"object storage", True, wal_object_storage_refused),
}


def sentences(text: str) -> list[str]:
    text = re.sub(r"```.*?```", " ", text, flags=re.S)  # code is not prose
    return [" ".join(s.split()) for s in re.split(r"(?<=[.;])\s+|\n\s*\n|\n\s*[-|]", text)]


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_the_claim_is_what_the_code_does(name):
    claim = CLAIMS[name]
    assert claim.check() == claim.refused, f"{name}: the code {'refuses' if claim.check() else 'serves'} it"


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_no_page_contradicts_the_claim(name):
    claim = CLAIMS[name]
    wrong, said = [], False
    for page in PAGES:
        for s in sentences(page.read_text()):
            if re.search(claim.mode, s) and re.search(claim.calls, s, re.I) and REFUSAL.search(s):
                said = True
                if not claim.refused:
                    wrong.append(f"{page.relative_to(ROOT)}: {s[:200]}")
    assert not wrong, f"{name}: the code serves these calls, but the docs say they are refused:\n" + "\n".join(wrong)
    if claim.refused:
        assert said, f"{name}: the code refuses these calls and no page says so"
