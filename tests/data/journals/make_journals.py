"""Writes the journals of tests/test_lmdb_journal.py's format checks (run once, with the code of main 13eeac2).

    PYTHONPATH=<main>/src python tests/data/journals/make_journals.py

``fragments/data.mdb``: a fragment buffer's journal (JSON records, ``fragments/journal.py`` of main),
with its ``Journal.load()`` in ``fragments.json``. ``online/data.mdb``: a rollout buffer's journal
(pickle + CRC32 records, ``online/journal.py`` of main) plus one record of the format before CRCs,
with what the buffer showed before it closed in ``online.json``. Only ``data.mdb`` is kept (LMDB makes
``lock.mdb`` on open); the tests copy each directory before opening it.
"""

import json
import os
import pickle
import shutil
import sys
import tempfile

from replaystore.fragments.buffer import FragmentBuffer, FragmentBufferConfig
from replaystore.online import OnlineJournal, RolloutBuffer

HERE = os.path.dirname(os.path.abspath(__file__))
S = "session-0"


def fragments(tmp: str) -> None:
    cfg = FragmentBufferConfig(
        max_chunks=8,
        max_staleness=4,
        max_reuse=3,
        fragments_per_chunk=2,
        path=os.path.join(tmp, "buf"),
        num_shards=1,
        map_size=1 << 22,
        journal_reserve=0,
        journal_map_size=1 << 22,
        seed=0,
        lease_ttl=None,
        partial_max_age=None,
    )
    buf = FragmentBuffer(cfg)
    buf.set_version(S, 3)
    for stream, n in (("env-0", 5), ("env-1", 4), ("env-2", 1)):
        for seq in range(n):
            fid = buf.store.put({"stream": stream, "seq": seq})
            buf.add(fid, stream, seq, 3, S)
    lease = buf.fetch(2, "trainer-0")
    loaded = buf.journal.load()
    stats = buf.stats()
    buf.close()
    out = os.path.join(HERE, "fragments")
    os.makedirs(out, exist_ok=True)
    shutil.copy(os.path.join(cfg.path, "meta", "data.mdb"), os.path.join(out, "data.mdb"))
    keep = ("replay_buffer_size_chunks", "pending_fragments", "leases", "model_version")
    expected = {"load": loaded, "lease": lease.lease_id, "stats": {k: stats[k] for k in keep if k in stats}}
    with open(os.path.join(HERE, "fragments.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)


def online(tmp: str) -> None:
    path = os.path.join(tmp, "online")
    buf = RolloutBuffer(
        capacity=16, batch_size=2, max_staleness=1, group_size=2, ticket_ttl=None, journal=OnlineJournal(path)
    )
    a, b, c, d = buf.acquire(4)
    buf.add_group(a, ["a0", "a1"], versions=0, lengths=[3, 4])
    buf.add_group(b, ["b0", "b1"], versions=(0, 1), lengths=[1, 2])
    buf.add("c0", group=c)  # pending
    buf.set_version(1)
    st = buf.stats()
    buf.close()
    j = OnlineJournal(path)  # one record as journals wrote them before records had a CRC
    with j._env.begin(write=True) as txn:
        txn.put(b"d/'legacy'", pickle.dumps(("legacy", ["complete", None]), protocol=5))
    j.close()
    out = os.path.join(HERE, "online")
    os.makedirs(out, exist_ok=True)
    shutil.copy(os.path.join(path, "data.mdb"), os.path.join(out, "data.mdb"))
    keep = ("version", "groups", "rollouts", "pending_groups", "pending_rollouts", "add_calls")
    expected = {"tickets": [a, b, c, d], "stats": {k: st[k] for k in keep}, "running": st["budget"]["running"]}
    with open(os.path.join(HERE, "online.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        fragments(tmp)
        online(tmp)
    print("written under", HERE, file=sys.stderr)
