"""The conformance scenario: the Table's behavioural calls, in order, each reduced to a comparable value.

Every cell is ``(table config, contract call, name, fn)``; ``fn(handle, ctx)`` makes the call(s)
and returns what must agree with the in-process Table: ids of payloads (keys differ between
modes: a sharded key carries its shard), counts, flags, priorities, shapes, or the exception
class. Random draws are reduced to what does not depend on the draw (sizes, membership,
totals). ``ctx`` keeps a handle's keys between cells. A helper module, not a conftest.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np


def batch(start: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + n, dtype=np.int64)
    return {"obs": np.stack([ids, -ids], axis=1).astype(np.float32), "id": ids}


def item(i: int) -> dict[str, Any]:
    return {"obs": np.array([i, -i], dtype=np.float32), "id": np.int64(i)}


def ids(h: Any, keys: Any) -> list[int]:
    """The payload ids of ``keys`` that are live, sorted."""
    data, found = h.get(np.asarray(keys, dtype=np.int64))
    return sorted(np.asarray(data["id"]).tolist()) if found.any() else []


def live(h: Any) -> list[int]:
    return ids(h, h.keys())


Cell = tuple[str, str, str, Callable[[Any, dict], Any]]
CELLS: list[Cell] = []


def cell(config: str, call: str, name: str | None = None) -> Callable:
    def register(fn: Callable) -> Callable:
        CELLS.append((config, call, name or fn.__name__, fn))
        return fn

    return register


# -- P: a prioritized table with a staleness window ------------------------------------------------------------
@cell("P", "extend")
def extend_returns_one_key_per_row(h, ctx):
    ctx["k1"] = k = h.extend(batch(0, 10), priorities=np.linspace(1.0, 7.0, 10))
    return len(k), ids(h, k)


@cell("P", "extend")
def default_priority_is_the_tables_max(h, ctx):
    ctx["k2"] = k = h.extend(batch(10, 5))
    return sorted(h.info(k)["priorities"].tolist())


@cell("P", "add")
def add_one_item(h, ctx):
    k = h.add(item(15))
    ctx["k3"] = np.array([k])
    return ids(h, [k]), float(h.info([k])["priorities"][0])


@cell("P", "keys")
def len_keys_and_in(h, ctx):
    return len(h), live(h), bool(ctx["k1"][0] in h)


@cell("P", "get")
def get_keeps_the_order_asked(h, ctx):
    data, found = h.get(ctx["k1"][[3, 1]])
    return np.asarray(data["id"]).tolist(), found.tolist()


@cell("P", "info")
def info_of_live_keys(h, ctx):
    i = h.info(ctx["k1"][:3])
    return i["found"].tolist(), i["priorities"].tolist(), i["times_sampled"].tolist(), i["versions"].tolist()


@cell("P", "update_priorities")
def update_priorities_applies(h, ctx):
    n = h.update_priorities(ctx["k1"][:2], [9.0, 0.5])
    return n, h.info(ctx["k1"][:2])["priorities"].tolist()


@cell("P", "delete")
def delete_by_key(h, ctx):
    n = h.delete(ctx["k1"][9:])
    return n, len(h), bool(ctx["k1"][9] in h), h.get(ctx["k1"][9:])[1].tolist()


@cell("P", "update_priorities")
def update_of_a_deleted_key(h, ctx):
    return h.update_priorities(ctx["k1"][9:], [1.0])


@cell("P", "update_fields")
def update_fields_rewrites_rows_by_key(h, ctx):
    k = ctx["k1"][[2, 4, 2]]  # a duplicate key: the last row wins
    n = h.update_fields(k, {"obs": np.array([[5, 5], [6, 6], [7, 7]], np.float32)})
    data, found = h.get(ctx["k1"][[2, 4]])
    return n, np.asarray(data["obs"]).tolist(), np.asarray(data["id"]).tolist(), found.tolist()


@cell("P", "update_fields")
def update_fields_of_a_deleted_key(h, ctx):
    return h.update_fields(ctx["k1"][9:], {"obs": np.zeros((1, 2), np.float32)})


@cell("P", "update_fields")
def bad_update_fields_name(h, ctx):
    h.update_fields(ctx["k1"][:1], {"nope": np.zeros(1)})


@cell("P", "update_fields")
def bad_update_fields_rows(h, ctx):
    h.update_fields(ctx["k1"][:2], {"obs": np.zeros((1, 2), np.float32)})


@cell("P", "update_fields", "rewritten rows survive save and load")
def update_fields_survive_a_checkpoint(h, ctx):
    loaded = h.roundtrip(os.path.join(ctx["tmp"], "ckpt-P-fields"))
    rows = []
    for t in loaded if isinstance(loaded, list) else [loaded]:
        data = t.get(t.keys())[0]
        rows += zip(np.asarray(data["id"]).tolist(), np.asarray(data["obs"]).tolist())
    return sorted(rows), live(h)


@cell("P", "sample")
def sample_draws_live_items(h, ctx):
    s = h.sample(4, timeout=10)
    got = np.asarray(s.data["id"]).tolist()
    return len(s.keys), set(got) <= set(live(h)), np.shape(s.probabilities), np.shape(s.weights)


@cell("P", "sample")
def samples_are_counted(h, ctx):
    return int(h.info(h.keys())["times_sampled"].sum())


@cell("P", "info", "stats")
def stats_gauges(h, ctx):
    st = h.stats()
    names = ("size", "capacity", "inserts", "samples", "deletes", "priority_min", "priority_max")
    names += ("max_priority_seen", "version", "staleness_histogram")
    return {k: st.get(k) for k in names}


@cell("P", "set_version")
def set_version_drops_stale_items(h, ctx):
    n0 = len(h)
    return h.set_version(3) == n0, len(h)


@cell("P", "extend")
def stale_inserts_are_refused_with_key_minus_one(h, ctx):
    k = h.extend(batch(30, 2), version=[3, 0])
    return (np.asarray(k) >= 0).tolist(), h.stats()["staleness_histogram"]


@cell("P", "extend")
def bad_field_shape(h, ctx):
    h.extend({"obs": np.zeros((2, 3), np.float32), "id": np.arange(2)})


@cell("P", "extend")
def bad_priority_nan(h, ctx):
    h.extend(batch(40, 2), priorities=[1.0, np.nan])


@cell("P", "extend")
def bad_version_dtype(h, ctx):
    h.extend(batch(40, 2), version=[0.5, 1.5])


@cell("P", "sample")
def bad_batch_size(h, ctx):
    h.sample(0)


@cell("P", "get")
def bad_keys(h, ctx):
    h.get(["x"])


@cell("P", "keys", "bad key in")
def bad_key_in(h, ctx):
    return "x" in h


@cell("P", "update_priorities")
def bad_update_count(h, ctx):
    h.update_priorities(ctx["k2"][:2], [1.0, 2.0, 3.0])


@cell("P", "update_priorities")
def bad_update_nan(h, ctx):
    h.update_priorities(ctx["k2"][:1], [np.inf])


@cell("P", "episode_info")
def episode_call_on_a_plain_table(h, ctx):
    h.episode_info(ctx["k2"][:1])


@cell("P", "extend", "nothing changed by refused calls")
def unchanged_after_refusals(h, ctx):
    st = h.stats()
    return len(h), live(h), st["inserts"], h.info(ctx["k2"])["priorities"].tolist()


@cell("P", "clear")
def clear_empties(h, ctx):
    h.clear()
    return len(h), h.stats()["size"]


@cell("P", "sample")
def sample_times_out_on_an_empty_table(h, ctx):
    h.sample(1, timeout=0.2)


@cell("P", "snapshot", "save and load")
def save_and_load(h, ctx):
    h.extend(batch(50, 3), priorities=[1.0, 2.0, 3.0])
    loaded = h.roundtrip(os.path.join(ctx["tmp"], "ckpt-P"))
    loaded = loaded if isinstance(loaded, list) else [loaded]
    got = sorted(i for t in loaded for i in ids(t, t.keys()))
    prios = sorted(p for t in loaded for p in t.info(t.keys())["priorities"].tolist())
    return got, prios


@cell("P", "snapshot")
def snapshot_in_process(h, ctx):
    return h.snapshot().size


# -- E: episodes -----------------------------------------------------------------------------------------------
def _steps(start: int, n: int) -> dict[str, np.ndarray]:
    return batch(start, n)


@cell("E", "add_episode")
def add_episode_takes_fresh_streams(h, ctx):
    a = h.add_episode(_steps(0, 3))
    b = h.add_episode(_steps(10, 2), terminated=False)
    ctx["a"], ctx["b"] = a, b
    return h.episode_info(np.concatenate([a, b])).streams.tolist()


@cell("E", "add_step")
def add_step_continues_its_stream(h, ctx):
    k = h.add_step(item(12), stream=int(h.episode_info(ctx["b"][:1]).streams[0]))
    ctx["b"] = np.append(ctx["b"], k)
    i = h.episode_info([k])
    return i.positions.tolist(), i.lengths.tolist(), i.closed.tolist()


@cell("E", "extend_steps")
def extend_steps_over_streams(h, ctx):
    k = h.extend_steps(_steps(20, 4), streams=[5, 6, 5, 6], terminated=[False, False, True, False])
    ctx["c"] = k
    i = h.episode_info(k)
    return len(k), i.streams.tolist(), i.positions.tolist(), i.closed.tolist()


@cell("E", "end_episode")
def end_episode_closes(h, ctx):
    n = h.end_episode([int(h.episode_info(ctx["b"][:1]).streams[0]), 6], truncated=True)
    return n, h.episode_info(ctx["b"]).truncated.tolist()


@cell("E", "episode_info")
def episode_info_of_every_step(h, ctx):
    keys = h.keys()
    i = h.episode_info(keys)
    order = np.argsort(h.get(keys)[0]["id"])
    by_episode: dict[int, list[int]] = {}
    for e, pid in zip(i.episodes[order].tolist(), np.sort(h.get(keys)[0]["id"]).tolist()):
        by_episode.setdefault(e, []).append(pid)
    fields = ("streams", "positions", "lengths", "closed", "complete", "terminated", "truncated", "is_last")
    return {f: getattr(i, f)[order].tolist() for f in fields}, sorted(by_episode.values())


@cell("E", "episode_keys")
def episode_keys_of_positions(h, ctx):
    firsts = np.array([ctx["a"][0], ctx["b"][0], ctx["c"][0]])
    return [ids(h, [k]) for k in h.episode_keys(firsts, 1).tolist()]


@cell("E", "sample_episodes")
def sample_episodes_draws_complete_ones(h, ctx):
    b = h.sample_episodes(8)
    d = h.sample_episodes(4, replace=False)  # every complete episode once
    return len(b), set(b.lengths.tolist()) <= {2, 3}, sorted(d.lengths.tolist()), all(b.terminated | b.truncated)


@cell("E", "sample_sequences")
def sample_sequences_shapes(h, ctx):
    s = h.sample_sequences(4, 2, timeout=10)
    return np.shape(s.step_keys), np.shape(s.data["obs"])


@cell("E", "sample_nstep")
def sample_nstep_shapes(h, ctx):
    s = h.sample_nstep(4, 2, 0.9, timeout=10)
    return len(s.keys), np.shape(s.data["obs"])


@cell("E", "extend_steps")
def bad_stream_writes_nothing(h, ctx):
    n = len(h)
    try:
        h.extend_steps(_steps(40, 2), streams=[99, 0])
    except Exception as e:  # noqa: BLE001 - the class is the result
        return type(e).__name__, len(h) == n
    return "no error", len(h) == n


@cell("E", "extend")
def plain_extend_on_an_episodic_table(h, ctx):
    h.extend(_steps(50, 1))


@cell("E", "sample_nstep")
def bad_nstep(h, ctx):
    h.sample_nstep(2, 0, 0.9, timeout=5)


@cell("E", "end_episode")
def end_of_an_unknown_stream(h, ctx):
    h.end_episode([9])


@cell("E", "add_episode")
def add_episode_on_an_open_stream(h, ctx):
    h.add_episode(_steps(60, 2), stream=int(h.episode_info(ctx["c"][1:2]).streams[0]) + 10)
    h.add_episode(_steps(62, 2), stream=int(h.episode_info(ctx["c"][1:2]).streams[0]) + 10)


# -- R: retirement -----------------------------------------------------------------------------------------------
@cell("R", "sample")
def sampled_items_retire(h, ctx):
    h.extend(batch(0, 6))
    s = h.sample(3, timeout=10)
    drawn = len(set(np.asarray(s.data["id"]).tolist()))
    return len(h) + drawn, h.stats()["retired"] == drawn


# -- closing (last, for every config) ----------------------------------------------------------------------------
CLOSING: list[Cell] = []
for _c in ("P", "E", "R"):

    def _closed(h, ctx):
        h.close()
        out = []
        for call in (lambda: h.sample(1, timeout=0.1), lambda: h.set_version(9)):
            try:
                call()
                out.append("no error")
            except Exception as e:  # noqa: BLE001 - the class is the result
                out.append(type(e).__name__)
        return out

    CLOSING.append((_c, "sample", "closed", _closed))
