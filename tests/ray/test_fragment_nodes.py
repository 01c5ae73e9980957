"""Node loss and re-attachment in the FragmentBuffer (node-local fragment ids), without Ray.

The buffer's store here is one FragmentStore holding ids that name two node labels, as node-local
stores make them (``"<time>-<uuid>@<label>"``); the Ray side is in test_node_stores_cluster.py.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("lmdb")

from replaystore.fragments.buffer import FragmentBuffer, FragmentBufferConfig  # noqa: E402
from replaystore.ray.fragments.node_stores import label_of  # noqa: E402
from replaystore.storage.fragments import FragmentStore, new_fragment_id  # noqa: E402

S = "s"


def make(tmp_path, **kw):
    cfg = dict(
        max_chunks=8,
        max_staleness=5,
        max_reuse=5,
        fragments_per_chunk=2,
        path=str(tmp_path),
        num_shards=1,
        seed=0,
        orphan_grace=3600.0,
        lease_ttl=None,
    )
    cfg.update(kw)
    buf = FragmentBuffer(FragmentBufferConfig(**cfg))
    buf.set_version(S, 0)
    return buf


def put(buf, label, stream, seq):
    fid = buf.store.put({"seq": seq}, new_fragment_id() + "@" + label)
    return fid, buf.add(fid, stream, seq, 0, S)


def test_label_of():
    assert label_of("0001-abc@node-a") == "node-a"
    assert label_of(new_fragment_id()) is None


def test_node_local_config_is_checked(tmp_path):
    with pytest.raises(ValueError, match="node_local"):
        FragmentBufferConfig(max_chunks=1, max_staleness=0, max_reuse=1, path=str(tmp_path), node_local="")


def test_drop_node_counts_and_keeps_the_rest(tmp_path):
    buf = make(tmp_path)
    a = [put(buf, "A", "sa", i)[0] for i in range(4)]  # two chunks on A
    b = [put(buf, "B", "sb", i)[0] for i in range(4)]  # two chunks on B
    pb = put(buf, "B", "sb", 4)[0]  # a partial chunk on B
    assert buf.num_chunks == 4
    lease = buf.fetch(8)  # leases every chunk (A and B)
    assert {label_of(r.fragment_id) for r in lease.records} == {"A", "B"}
    lost = buf.drop_node("B")
    assert lost == 5  # 4 chunked (also leased) + 1 partial
    st = buf.stats()
    assert st["fragments_lost_with_node"] == 5 and st["chunks_lost_with_node"] == 2 and st["nodes_lost"] == 1
    assert st["lost_nodes"] == ["B"] and st["pending_fragments"] == 0
    assert buf.num_chunks == 2
    assert buf.drop_node("B") == 0  # idempotent
    assert all(label_of(r.fragment_id) == "A" for r in buf.fetch(4).records)
    # fragments naming the lost node are refused, others accepted
    assert put(buf, "B", "sb", 5)[1] == "lost"
    assert buf.stats()["fragments_refused_lost_node"] == 1
    assert put(buf, "A", "sa", 4)[1] == "pending"
    # releasing the lease frees A's payloads; deletes of B's are not sent (its store went with it)
    buf.release(lease.lease_id)
    assert all(f in buf.store for f in a)
    assert pb in buf.store and all(f in buf.store for f in b)  # never sent to the lost node


def test_lost_nodes_survive_restart_and_reattach(tmp_path):
    buf = make(tmp_path)
    put(buf, "A", "sa", 0), put(buf, "A", "sa", 1)
    put(buf, "B", "sb", 0), put(buf, "B", "sb", 1)
    buf.drop_node("B")
    buf.close()
    buf = FragmentBuffer(
        FragmentBufferConfig(
            max_chunks=8,
            max_staleness=5,
            max_reuse=5,
            fragments_per_chunk=2,
            path=str(tmp_path),
            num_shards=1,
            seed=0,
            lease_ttl=None,
        )
    )
    st = buf.stats()
    assert st["lost_nodes"] == ["B"] and st["fragments_lost_with_node"] == 2 and buf.num_chunks == 1
    assert put(buf, "B", "sb", 2)[1] == "lost"
    assert buf.attach_node("B") and not buf.attach_node("B")
    assert buf.stats()["nodes_reattached"] == 1
    assert put(buf, "B", "sb", 3)[1] == "pending"
    buf.close()
    buf = FragmentBuffer(
        FragmentBufferConfig(
            max_chunks=8,
            max_staleness=5,
            max_reuse=5,
            fragments_per_chunk=2,
            path=str(tmp_path),
            num_shards=1,
            seed=0,
            lease_ttl=None,
        )
    )
    assert buf.stats()["lost_nodes"] == []
    buf.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["A", "B"]), st.integers(0, 2)), min_size=1, max_size=30), st.integers(0, 30))
def test_drop_node_against_a_model(tmp_path_factory, sends, drop_at):
    """Fragments of streams on nodes A and B; B dropped after ``drop_at`` sends: counts match a plain model."""
    buf = make(tmp_path_factory.mktemp("nodes"), max_chunks=64, persist=False)
    seqs: dict[str, int] = {}
    model = {"lost": 0, "refused": 0}
    dropped = False
    for step, (label, s) in enumerate(sends):
        if step == drop_at:
            assert buf.drop_node("B") == model["lost"]
            dropped = True
        stream = f"{label}{s}"
        seq = seqs.get(stream, 0)
        status = put(buf, label, stream, seq)[1]
        seqs[stream] = seq + 1
        if label == "B" and dropped:
            assert status == "lost"
            model["refused"] += 1
        elif label == "B":
            model["lost"] += 1
    if not dropped:
        assert buf.drop_node("B") == model["lost"]
    a_counts = [n for k, n in seqs.items() if k.startswith("A")]
    st_ = buf.stats()
    assert st_["fragments_lost_with_node"] == model["lost"]
    assert st_["fragments_refused_lost_node"] == model["refused"]
    assert buf.num_chunks == sum(n // 2 for n in a_counts)
    assert st_["pending_fragments"] == sum(n % 2 for n in a_counts)
    buf.close()


class Membership(FragmentStore):
    """A real store with the router's membership calls: ``alive`` labels, new ones reported once."""

    def __init__(self, path, alive):
        super().__init__(path, 1, 1 << 26)
        self.alive, self.known = set(alive), set(alive)

    def refresh(self):
        attached, lost = sorted(self.alive - self.known), sorted(self.known - self.alive)
        self.known = set(self.alive)
        return attached, lost

    def info(self):
        return dict.fromkeys(self.known, "node")

    def keys_of(self, label):
        return {k for k in self.keys() if label_of(k) == label}


def test_check_nodes_finds_a_node_that_left_while_the_service_was_down(tmp_path):
    cfg = FragmentBufferConfig(
        max_chunks=8,
        max_staleness=5,
        max_reuse=5,
        fragments_per_chunk=2,
        path=str(tmp_path),
        num_shards=1,
        seed=0,
        lease_ttl=None,
    )
    buf = FragmentBuffer(cfg, store=Membership(tmp_path / "s", {"A", "B"}))
    buf.set_version(S, 0)
    for i in range(3):
        put(buf, "A", "sa", i), put(buf, "B", "sb", i)
    assert buf.check_nodes() == ([], [])
    buf.close()
    store = Membership(tmp_path / "s", {"A"})  # restarted: B is gone, the router never knew it
    buf = FragmentBuffer(cfg, store=store)  # its start checks the nodes: B is dropped at once
    st_ = buf.stats()
    assert st_["fragments_lost_with_node"] == 3 and st_["lost_nodes"] == ["B"] and buf.num_chunks == 1
    assert buf.check_nodes() == ([], [])  # nothing more to drop
    store.alive.add("B")  # B comes back with its directory
    assert buf.check_nodes() == (["B"], [])
    assert buf.stats()["lost_nodes"] == [] and buf.stats()["nodes_reattached"] == 1
    assert put(buf, "B", "sb", 3)[1] == "pending"
    buf.close()


def test_a_store_started_again_is_reconciled_with_its_directory(tmp_path):
    """A store (re)attached under a label that was never dropped (service restart, a node back
    before anyone noticed): what its directory holds counts again; only what it lacks is dropped."""
    cfg = FragmentBufferConfig(
        max_chunks=8,
        max_staleness=5,
        max_reuse=5,
        fragments_per_chunk=2,
        path=str(tmp_path),
        num_shards=1,
        seed=0,
        lease_ttl=None,
    )
    store = Membership(tmp_path / "s", {"A", "B"})
    buf = FragmentBuffer(cfg, store=store)
    buf.set_version(S, 0)
    a = [put(buf, "A", "sa", i)[0] for i in range(4)]
    b = [put(buf, "B", "sb", i)[0] for i in range(5)]  # two chunks and a partial on B
    lease = buf.fetch(2 * buf.num_chunks)
    store.known.discard("B")  # the router restarted B's store: it is attached again at the next check
    assert buf.check_nodes() == (["B"], [])
    assert buf.num_chunks == 4 and buf.stats()["fragments_lost_with_node"] == 0  # all there: nothing lost
    store.delete([b[1]])  # B's directory lost one payload of its first chunk
    store.known.discard("B")
    assert buf.check_nodes() == (["B"], [])
    st_ = buf.stats()
    assert st_["fragments_lost_with_node"] == 1 and st_["chunks_lost_with_node"] == 1 and buf.num_chunks == 3
    assert st_["lost_nodes"] == [] and st_["pending_fragments"] == 1  # the node itself was not lost
    assert b[0] in store and all(f in store for f in a)  # b[0] is held by the lease
    buf.release(lease.lease_id)
    assert b[0] not in store  # its chunk was dropped: freed once the lease let it go
    assert put(buf, "B", "sb", 5)[1] == "chunk"
    buf.close()


def test_a_store_that_does_not_answer_on_an_alive_node_is_not_dropped(tmp_path):
    cfg = FragmentBufferConfig(
        max_chunks=8,
        max_staleness=5,
        max_reuse=5,
        fragments_per_chunk=2,
        path=str(tmp_path),
        num_shards=1,
        seed=0,
        lease_ttl=None,
    )
    store = Membership(tmp_path / "s", {"A", "B"})
    buf = FragmentBuffer(cfg, store=store)
    buf.set_version(S, 0)
    put(buf, "B", "sb", 0), put(buf, "B", "sb", 1)
    buf.close()
    store = Membership(tmp_path / "s", {"A"})  # restarted; B's node is alive but its store did not start
    store.starting = {"B"}
    buf = FragmentBuffer(cfg, store=store)
    assert buf.stats()["fragments_lost_with_node"] == 0 and buf.num_chunks == 1
    store.starting = set()  # the node left after all
    assert buf.check_nodes() == ([], ["B"]) and buf.stats()["fragments_lost_with_node"] == 2
    buf.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.tuples(st.sampled_from(["A", "B"]), st.integers(0, 2)), min_size=1, max_size=30),
    st.sets(st.integers(0, 29), max_size=10),
)
def test_reconcile_against_a_model(tmp_path_factory, sends, missing_at):
    """B re-attached without the payloads ``missing_at`` (indices of B's sends): exactly the chunks
    and partial chunks holding one are dropped, every other fragment counts again."""
    buf = make(tmp_path_factory.mktemp("reconcile"), max_chunks=64, persist=False)
    streams: dict[str, list[str]] = {}
    b_ids = []
    for label, s in sends:
        stream = f"{label}{s}"
        ids = streams.setdefault(stream, [])
        fid = put(buf, label, stream, len(ids))[0]
        ids.append(fid)
        if label == "B":
            b_ids.append(fid)
    missing = {b_ids[i] for i in missing_at if i < len(b_ids)}
    lost = buf.reconcile_node("B", set(b_ids) - missing)
    chunks = [ids[i : i + 2] for ids in streams.values() for i in range(0, len(ids) - 1, 2)]
    partials = [ids[-1] for ids in streams.values() if len(ids) % 2]
    assert lost == len(missing) == buf.stats()["fragments_lost_with_node"]
    assert buf.num_chunks == sum(not (set(c) & missing) for c in chunks)
    assert buf.stats()["chunks_lost_with_node"] == sum(bool(set(c) & missing) for c in chunks)
    assert buf.stats()["pending_fragments"] == sum(p not in missing for p in partials)
    assert buf.stats()["lost_nodes"] == [] and buf.reconcile_node("B", set(b_ids) - missing) == 0
    buf.close()


def test_leases_by_node_count_each_nodes_held_fragments(tmp_path):
    buf = make(tmp_path)
    for i in range(4):
        put(buf, "A", "sa", i)  # two chunks on A
    for i in range(2):
        put(buf, "B", "sb", i)  # one chunk on B
    assert buf.stats()["leases_by_node"] == {}
    first = buf.fetch(6)  # every chunk: 4 fragments on A, 2 on B
    assert buf.stats()["leases_by_node"] == {
        "A": {"leases": 1, "leased_fragments": 4},
        "B": {"leases": 1, "leased_fragments": 2},
    }
    second = buf.fetch(2)  # one chunk, held twice now
    labels = [label_of(r.fragment_id) for r in second.records]
    by = buf.stats()["leases_by_node"]
    assert by[labels[0]] == {"leases": 2, "leased_fragments": {"A": 4, "B": 2}[labels[0]] + 2}
    buf.release(first.lease_id)
    assert buf.stats()["leases_by_node"] == {labels[0]: {"leases": 1, "leased_fragments": 2}}
    buf.release(second.lease_id)
    assert buf.stats()["leases_by_node"] == {}
