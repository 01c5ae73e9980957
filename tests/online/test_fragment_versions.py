"""Version ranges on the fragment service's chunks: a stream continued across weight updates."""

import pytest

pytest.importorskip("lmdb")

from replaystore.fragments.buffer import FragmentBuffer, FragmentBufferConfig  # noqa: E402

S = "s"


def make(tmp_path, end):
    cfg = FragmentBufferConfig(
        max_chunks=8,
        max_staleness=1,
        max_reuse=1,
        fragments_per_chunk=3,
        path=str(tmp_path),
        num_shards=1,
        seed=0,
        staleness_end=end,
    )
    buf = FragmentBuffer(cfg)
    buf.set_version(S, 0)
    return buf


def stream(buf, versions, name="env"):
    out = []
    for seq, v in enumerate(versions):
        if buf.version < v:
            buf.set_version(S, v)  # the trainer moves on while the stream continues
        out.append(buf.add(buf.store.put(seq), name, seq, v, S))
    return out


@pytest.mark.parametrize("end", ["min", "max"])
def test_chunk_range_and_staleness_end(tmp_path, end):
    buf = make(tmp_path, end)
    status = stream(buf, [0, 1, 2])  # one chunk produced under versions 0..2, now at version 2
    if end == "min":
        # the oldest fragment is 2 behind: MineStudio drops it (and with it the partial chunk)
        assert "chunk" not in status and buf.num_chunks == 0
        assert buf.counters["fragments_dropped_expired"] == 2  # the partial chunk went at version 2
    else:
        assert status[-1] == "chunk" and buf.num_chunks == 1
        [chunk] = buf._chunks.values()
        assert chunk.versions == (0, 2) and chunk.version == 0  # the range is kept
        lease = buf.fetch(3)
        assert [r.version for r in lease.records] == [0, 1, 2]
    buf.close()


def test_max_end_still_drops_chunks_whose_newest_part_is_stale_and_survives_restart(tmp_path):
    buf = make(tmp_path, "max")
    stream(buf, [0, 0, 1], name="a")
    stream(buf, [1, 1, 1], name="b")
    assert buf.num_chunks == 2
    buf.close()
    again = FragmentBuffer(
        FragmentBufferConfig(  # a restart on the same path
            max_chunks=8,
            max_staleness=1,
            max_reuse=1,
            fragments_per_chunk=3,
            path=str(tmp_path),
            num_shards=1,
            seed=0,
            staleness_end="max",
        )
    )
    assert again.num_chunks == 2 and sorted(c.versions for c in again._chunks.values()) == [(0, 1), (1, 1)]
    assert again.set_version(S, 3) == 2  # both newest ends are now 2 behind
    again.close()
    with pytest.raises(ValueError):
        FragmentBufferConfig(max_chunks=1, max_staleness=0, max_reuse=1, staleness_end="mid")
