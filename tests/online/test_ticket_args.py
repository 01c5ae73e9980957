"""A ticket argument that is not an integer id: one error class, the same in code and docs (issue 37 item 6)."""

import inspect
import pathlib

import pytest

import replaystore as rs
from replaystore.online import RolloutBuffer, StalenessBudget

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "online.md"
CALLS = ("finish", "abandon", "renew")


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("bad", ["x", 1.5, None, True])
def test_a_non_integer_ticket_is_invalid_request_and_changes_nothing(call, bad):
    buf = RolloutBuffer(16, batch_size=4, max_staleness=1)
    [t] = buf.acquire(1)
    before = buf.stats()
    with pytest.raises(rs.InvalidRequest) as e:
        getattr(buf, call)([t, bad])
    assert not isinstance(e.value, rs.UnknownTicket)
    assert buf.held(t) and buf.stats() == before
    budget = StalenessBudget(4, 1)
    [u] = budget.acquire(1)
    with pytest.raises(rs.InvalidRequest):
        getattr(budget, call)([u, bad])
    assert budget.held(u)


@pytest.mark.parametrize("owner", [RolloutBuffer, StalenessBudget])
@pytest.mark.parametrize("call", CALLS)
def test_the_docstrings_name_invalid_request_for_a_non_integer_ticket(owner, call):
    doc = inspect.getdoc(getattr(owner, call))
    raises = doc[doc.index("Raises:") :]
    assert "InvalidRequest: a ticket that is not an integer id" in " ".join(raises.split()), (owner, call)


def test_the_docs_say_which_error_a_non_integer_ticket_raises():
    text = " ".join(DOCS.read_text().split())
    assert '`InvalidRequest` for a ticket argument that is not an integer id (`finish([t, "x"])`' in text
    assert "`UnknownTicket` (a `KeyError`) for integer ticket ids never acquired" in text
