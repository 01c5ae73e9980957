"""The one LMDB journal (replaystore.checkpoint.journal): a dict model, both codecs, main's formats, damage."""

import json
import os
import pickle
import shutil
import struct
import tempfile
import zlib
from pathlib import Path

import pytest

pytest.importorskip("lmdb")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import replaystore as rs  # noqa: E402
from replaystore.checkpoint.journal import JSON, PICKLE, LmdbJournal  # noqa: E402
from replaystore.fragments.buffer import FragmentBuffer, FragmentBufferConfig  # noqa: E402
from replaystore.fragments.records import under  # noqa: E402
from replaystore.online import OnlineJournal, RolloutBuffer  # noqa: E402

DATA = Path(__file__).parent / "data" / "journals"
CODECS = {"json": JSON, "pickle": PICKLE}

# JSON-able values (JSON has no tuples, bytes or non-finite floats; pickle takes these too)
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**62), 2**62)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
KEYS = st.sampled_from(["s", "p/1", "p/2", "c/0000000000000001", "l/é", "t/7", "d/'x'"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.dictionaries(KEYS, VALUES, max_size=3), st.lists(KEYS, max_size=2)),
        st.tuples(st.just("reopen"), st.none(), st.none()),
        st.tuples(st.just("clear"), st.none(), st.none()),
    ),
    max_size=12,
)


@pytest.mark.parametrize("codec", sorted(CODECS))
@settings(max_examples=25, deadline=None)
@given(ops=OPS)
def test_the_journal_behaves_as_a_dict_across_writes_reopens_and_clears(codec, ops):
    with tempfile.TemporaryDirectory() as tmp:
        j = LmdbJournal(os.path.join(tmp, "j"), CODECS[codec], map_size=1 << 24)
        model: dict = {}
        try:
            for op, puts, deletes in ops:
                if op == "write":
                    j.write(puts, deletes)
                    for k in deletes:
                        model.pop(k, None)
                    model.update(puts)
                elif op == "reopen":
                    j.close()
                    j = LmdbJournal(os.path.join(tmp, "j"), CODECS[codec], map_size=1 << 24)
                else:
                    j.clear()
                    model.clear()
                assert j.load() == dict(sorted(model.items()))
        finally:
            j.close()


def test_a_transaction_that_does_not_fit_changes_nothing(tmp_path):
    j = LmdbJournal(str(tmp_path / "j"), PICKLE, map_size=1 << 20)
    j.write({"s": 1, "a": b"x" * 100})
    with pytest.raises(rs.DiskFull):
        j.write({"b": b"y" * (2 << 20), "s": 2}, ["a"])
    assert j.load() == {"a": b"x" * 100, "s": 1}
    with pytest.raises(TypeError):  # a value the codec cannot encode: refused before the transaction
        LmdbJournal(str(tmp_path / "k"), JSON).write({"s": 1, "t": {1, 2}})
    j.close()


def copy_fixture(name, dest):
    shutil.copytree(DATA / name, dest)
    return str(dest)


def test_a_fragment_journal_written_by_main_opens_and_resumes_its_buffer(tmp_path):
    expected = json.loads((DATA / "fragments.json").read_text())
    j = LmdbJournal(copy_fixture("fragments", tmp_path / "j"), JSON)
    saved = j.load()  # main's Journal.load() grouped the records by kind
    kinds = {"pending": "p/", "streams": "h/", "leases": "l/"}
    assert {k: under(saved, p) for k, p in kinds.items()} == {k: expected["load"][k] for k in kinds}
    assert list(under(saved, "c/").values()) == expected["load"]["chunks"] and saved["s"] == expected["load"]["state"]
    j.close()
    cfg = FragmentBufferConfig(
        max_chunks=8, max_staleness=4, max_reuse=3, fragments_per_chunk=2, path=str(tmp_path / "buf"),
        num_shards=1, map_size=1 << 22, journal_reserve=0, journal_map_size=1 << 22, seed=0, lease_ttl=None,
        partial_max_age=None,  # the fixture's wall-clock times are old: nothing may expire by them
    )  # fmt: skip
    copy_fixture("fragments", tmp_path / "buf" / "meta")
    buf = FragmentBuffer(cfg)
    stats = buf.stats()
    assert {k: stats[k] for k in expected["stats"]} == expected["stats"] and stats["restarts"] == 1
    assert buf.release(expected["lease"]) == 2
    buf.close()
    again = FragmentBuffer(cfg)  # records of both formats in one journal now
    assert again.stats()["leases"] == 0 and again.stats()["replay_buffer_size_chunks"] == 4
    again.close()


def test_a_rollout_journal_written_by_main_opens_and_resumes_its_buffer(tmp_path):
    expected = json.loads((DATA / "online.json").read_text())
    path = copy_fixture("online", tmp_path / "j")
    assert OnlineJournal(path).load()["d/'legacy'"] == ("legacy", ["complete", None])  # a record without CRC
    buf = RolloutBuffer(capacity=16, batch_size=2, max_staleness=1, group_size=2, ticket_ttl=None,
                        journal=OnlineJournal(path))  # fmt: skip
    stats = buf.stats()
    assert {k: stats[k] for k in expected["stats"]} == expected["stats"]
    assert stats["budget"]["running"] == expected["running"] and stats["restarts"] == 1
    a, b, c, d = expected["tickets"]
    assert buf.add("c1", group=c) == "complete"
    buf.abandon([d])  # else the trainer waits for it (in-order picks)
    batch = buf.sample(2, timeout=30)
    assert batch.group_ids == [a, b] and batch.data == ["a0", "a1", "b0", "b1"]
    buf.close()


def raw_put(path, codec, key: bytes, raw: bytes):
    j = LmdbJournal(path, codec)
    with j._env.begin(write=True) as txn:
        txn.put(key, raw)
    j.close()


def framed(tag: bytes, body: bytes) -> bytes:
    return tag + struct.pack("<I", zlib.crc32(body)) + body


def flipped(codec):
    raw = bytearray(codec.encode({"a": [1, 2, 3]}))
    raw[-3] ^= 4  # one bit of the body, as a bad disk would
    return bytes(raw)


DAMAGED = {
    "flipped bit": flipped,
    "truncated frame": lambda codec: codec.tag + b"\x01",
    "foreign bytes": lambda codec: b"\x00\x01garbage",
    "other codec": lambda codec: (PICKLE if codec is JSON else JSON).encode({"a": 1}),
    "bad body, good CRC": lambda codec: framed(codec.tag, b"\x80\x05not json nor pickle"),
    "bad bare record": lambda codec: codec.bare[0] + b"\xff\xfe",
}


@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_a_damaged_record_is_a_checkpoint_error(tmp_path, codec, damage):
    path = str(tmp_path / "j")
    LmdbJournal(path, CODECS[codec]).write({"s": {"ok": True}})
    raw_put(path, CODECS[codec], b"c/1", DAMAGED[damage](CODECS[codec]))
    j = LmdbJournal(path, CODECS[codec])
    with pytest.raises(rs.CheckpointError, match="c/1"):
        j.load()
    j.close()


def test_a_pickle_in_a_json_journal_is_never_unpickled(tmp_path):
    path = str(tmp_path / "j")

    class Boom:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "unpickled"),))

    raw_put(path, JSON, b"s", framed(b"RJ1", pickle.dumps(Boom(), protocol=5)))
    raw_put(path, JSON, b"t", pickle.dumps(Boom(), protocol=5))  # a bare pickle too
    with pytest.raises(rs.CheckpointError):
        LmdbJournal(path, JSON).load()
    assert not (tmp_path / "unpickled").exists()


def test_deep_json_and_a_non_utf8_key_are_checkpoint_errors(tmp_path):
    path = str(tmp_path / "j")
    raw_put(path, JSON, b"c/1", b"[" * 200_000)  # the decoder's RecursionError
    with pytest.raises(rs.CheckpointError, match="damaged"):
        LmdbJournal(path, JSON).load()
    path = str(tmp_path / "k")
    raw_put(path, PICKLE, b"c/\xff", PICKLE.encode(1))
    with pytest.raises(rs.CheckpointError, match="UnicodeDecodeError"):
        LmdbJournal(path, PICKLE).load()


@settings(max_examples=60, deadline=None)
@given(raw=st.binary(max_size=64))
def test_any_bytes_in_a_json_journal_load_or_raise_checkpoint_error(raw):
    with tempfile.TemporaryDirectory() as tmp:
        raw_put(tmp, JSON, b"c/1", raw)
        j = LmdbJournal(tmp, JSON)
        try:
            j.load()
        except rs.CheckpointError:
            pass
        finally:
            j.close()


def test_a_fragment_journal_with_readable_records_that_are_not_a_state_is_a_checkpoint_error(tmp_path):
    cfg = FragmentBufferConfig(max_chunks=4, max_staleness=1, max_reuse=1, path=str(tmp_path), num_shards=1,
                               map_size=1 << 22, journal_reserve=0, journal_map_size=1 << 22)  # fmt: skip
    FragmentBuffer(cfg).close()
    for key, value in (("s", {"version": "x"}), ("s", [1]), ("c/0000000000000000", {"chunk_id": 0})):
        j = LmdbJournal(str(tmp_path / "meta"), JSON)
        j.write({"s": {"version": 0, "session": "", "next_chunk_id": 0, "counters": {}}, key: value})
        j.close()
        with pytest.raises(rs.CheckpointError, match="no valid state"):
            FragmentBuffer(cfg)
