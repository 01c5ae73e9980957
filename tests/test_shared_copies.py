"""The state copies of a shared table's header: the compiled StateCopies against the struct
PackedCopies (same bytes, same reads), and their refusals (the current copy stays as it was)."""

import mmap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaystore.errors import InvalidArgument
from replaystore.shared.copies import PackedCopies, StateCopies, state_copies

CODES, WORDS = "qqdqqqd", 12  # (ints and floats mixed, as Table.state_layout gives them)
ACTIVE, FIRST = 3, 8  # the selector word, the first copy's first word
IMPLS = [PackedCopies]
if StateCopies is not None:
    IMPLS.append(lambda mm, active, first, words, codes: StateCopies(mm, active * 8, first * 8, words * 8, codes))

ints = st.integers(-(2**63), 2**63 - 1)
floats = st.floats(allow_nan=False)
values = st.tuples(*[ints if c == "q" else floats for c in CODES])
ops = st.lists(st.one_of(st.tuples(st.just("publish"), ints, values), st.tuples(st.just("intent"), ints)), max_size=12)


def make(impl):
    mm = mmap.mmap(-1, 4096)
    return mm, impl(mm, ACTIVE, FIRST, WORDS, CODES)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_implementations_agree_with_a_model(ops):
    pairs = [make(impl) for impl in IMPLS]
    model = {"current": (0, 0, tuple(0 if c == "q" else 0.0 for c in CODES))}
    for op in ops:
        if op[0] == "publish":
            _, gen, vals = op
            for _, c in pairs:
                c.publish(gen, vals)
            model["current"] = (gen, 0, vals)
        else:
            for _, c in pairs:
                c.set_intent(op[1])
            gen, _, vals = model["current"]
            model["current"] = (gen, op[1], vals)
        for _, c in pairs:
            assert c.read() == model["current"] and c.generation() == model["current"][0]
    assert len({bytes(mm[:]) for mm, _ in pairs}) == 1  # the same bytes, whichever wrote them


@pytest.mark.parametrize("impl", IMPLS)
def test_publish_writes_the_other_copy_then_flips(impl):
    mm, c = make(impl)
    words = memoryview(mm).cast("q")
    c.publish(7, (1, 2, 0.5, 3, 4, 5, -1.5))
    assert words[ACTIVE] == 1 and words[FIRST + WORDS : FIRST + WORDS + 4].tolist() == [7, 0, 1, 2]
    assert memoryview(mm).cast("d")[FIRST + WORDS + 4] == 0.5  # (gen, intent, 1, 2, 0.5)
    c.set_intent(9)
    c.publish(8, (6, 7, 0.0, 8, 9, 10, 1.0))
    assert words[ACTIVE] == 0 and words[FIRST + WORDS + 1] == 9  # the old copy keeps its intent
    assert c.read() == (8, 0, (6, 7, 0.0, 8, 9, 10, 1.0))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "bad",
    [(1, 2, 0.5, 3, 4, 5), (1, 2, 0.5, 3.5, 4, 5, 0.5), (1, 2, 0.5, 3, 2**64, 5, 0.5), (1, 2, "x", 3, 4, 5, 0.5)],
)
def test_bad_values_leave_the_current_copy(impl, bad):
    mm, c = make(impl)
    c.publish(1, (1, 2, 0.5, 3, 4, 5, 0.5))
    before, active = c.read(), mm[ACTIVE * 8]
    with pytest.raises((TypeError, ValueError, OverflowError, struct_error())):
        c.publish(2, bad)
    assert c.read() == before and mm[ACTIVE * 8] == active  # (struct may have half-filled the other copy)


def struct_error():
    import struct

    return struct.error


def test_more_scalars_than_a_copy_holds_and_bad_codes_are_named():
    with pytest.raises(InvalidArgument, match="30 scalars; a segment copy holds 10"):
        state_copies(mmap.mmap(-1, 4096), ACTIVE, FIRST, WORDS, "q" * 30)
    with pytest.raises(InvalidArgument, match="'q' or 'd'"):
        state_copies(mmap.mmap(-1, 4096), ACTIVE, FIRST, WORDS, "qqf")
