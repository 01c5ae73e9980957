"""Sampling N shards as one table: shard counts, merged batches, global probabilities and weights.

Plain NumPy, no Ray (tested on its own). The math is docs/ray.md, "Sharded tables", "Samples as
one table" and "Where the masses come from, and the drift bound": per-shard counts
``Multinomial(B, m / M)``, an item's probability ``P(i) = (m_s / M) * p_s(i)``, weights
``(P(i) / P_min) ** -beta`` with the global smallest probability (a shard that answered gives its
``pmin`` at draw time through its own weights, the others their last ``min_mass / mass``); the
probabilities returned are the ones the items were really drawn with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from ..storage.spec import concat, take
from . import keys as shard_keys

#: ``(size, mass, min_mass, kind, beta)`` as :func:`replaystore.ray.sharded.server.shard_state` returns it.
State = tuple


def masses(states: list[State | None], alive: np.ndarray) -> np.ndarray:
    """The masses to draw shards from: prioritized masses, or sizes if every prioritized mass is 0.

    Shards with no known state or not ``alive`` get 0.
    """
    m = np.array([0.0 if st is None else float(st[1]) for st in states])
    size = np.array([0.0 if st is None else float(st[0]) for st in states])
    m[~alive] = 0.0
    size[~alive] = 0.0
    if not m.sum() > 0.0:
        return size
    return m


_PAYLOAD = ("data", "next_obs")
_KEYS = ("keys", "step_keys")


def merge(
    parts: list[tuple[int, Any]],
    tag: int,
    mass: np.ndarray,
    states: list[State | None],
    rng: np.random.Generator | None,
) -> Any:
    """One sample from the shards' samples, with global keys, probabilities and weights.

    Each part is ``(shard, sample)``, a Sample, SequenceSample or NStepSample.

    Args:
        parts: the shards' replies, each drawn with the count ``mass`` gave its shard.
        tag: the table's key tag.
        mass: the masses the counts were drawn from.
        states: last known shard states (for shards that did not answer this sample).
        rng: shuffles the rows (so a row's position says nothing about its shard); ``None``: keep
            the shards' order.
    """
    total = float(mass.sum())
    share = mass / total
    beta = next((float(st[4]) for st in states if st is not None), 0.0)
    pmin = np.full(len(mass), np.inf)
    for t, st in enumerate(states):
        if st is not None and mass[t] > 0 and float(st[1]) > 0 and np.isfinite(float(st[2])):
            pmin[t] = float(st[2]) / float(st[1])
    prob_parts = []
    for s, smp in parts:
        p_local = np.asarray(smp.probabilities, dtype=np.float64)
        prob_parts.append(share[s] * p_local)
        if beta > 0 and len(p_local):
            w_local = np.asarray(smp.weights, dtype=np.float64)
            pmin[s] = float(np.min(p_local * np.power(w_local, 1.0 / beta)))
    probabilities = np.concatenate(prob_parts)
    if beta > 0 and mass_is_priority(states, mass):
        ok = (share > 0) & np.isfinite(pmin)
        global_min = float(np.min(share[ok] * pmin[ok])) if ok.any() else float(probabilities.min())
        weights = np.power(probabilities / global_min, -beta)
    else:
        weights = np.ones(len(probabilities))
    given = {k: np.concatenate([shard_keys.encode(tag, s, getattr(smp, k)) for s, smp in parts]) for k in _keys(parts)}
    given.update(probabilities=probabilities, weights=weights)
    samples = [smp for _, smp in parts]
    if rng is None or len(parts) == 1:
        return _rowwise(samples, concat, np.concatenate, given)
    order = rng.permutation(len(probabilities))
    given = {k: v[order] for k, v in given.items()}
    return _rowwise(samples, lambda v: take(concat(v), order), lambda v: np.concatenate(v)[order], given)


def _keys(parts: list[tuple[int, Any]]) -> tuple[str, ...]:
    return _KEYS if hasattr(parts[0][1], "step_keys") else _KEYS[:1]


def _rowwise(
    smps: list[Any], payload: Callable[[list], Any], per_row: Callable[[list], Any], given: dict | None = None
) -> Any:
    """A sample of the first one's type from ``smps`` (Samples, SequenceSamples or NStepSamples).

    Each payload field is ``payload(values)``, each per-row array ``per_row(values)`` (``values``:
    that field of every sample), a field in ``given`` that value, every other field the first sample's.
    """
    n = len(smps[0].probabilities)
    fields = dict(given or {})
    for f in dataclasses.fields(smps[0]):
        if f.name in fields:
            continue
        values = [getattr(smp, f.name) for smp in smps]
        if f.name in _PAYLOAD:
            fields[f.name] = payload(values)
        elif isinstance(values[0], np.ndarray) and values[0].ndim >= 1 and values[0].shape[0] == n:
            fields[f.name] = per_row(values)
        else:
            fields[f.name] = values[0]
    return type(smps[0])(**fields)


def mass_is_priority(states: list[State | None], mass: np.ndarray) -> bool:
    """Whether ``mass`` is prioritized mass (not the all-zero fallback to sizes)."""
    known = [st for st in states if st is not None]
    if not known or known[0][3] != "prioritized":
        return False
    return any(float(st[1]) > 0 for st in known)


def rows(value: Any, idx: np.ndarray) -> Any:
    """``value[idx]`` for per-row arguments; scalars and ``None`` unchanged."""
    if value is None or np.ndim(value) == 0:
        return value
    return np.asarray(value)[idx]


def concat_samples(a: Any, b: Any) -> Any:
    """Two merged samples as one (rows of ``b`` after ``a``)."""
    return _rowwise([a, b], concat, np.concatenate)


def fetch_depth(batch_size: int, mass: np.ndarray, ahead: np.ndarray, depth: int) -> int:
    """How many batches (``1..depth``) a fetch may draw: each shard's share fits its ``ahead``.

    Shard ``s`` gets ``j * batch_size * share_s`` rows on average over ``j`` batches; ``j`` is
    allowed while that plus 4 standard deviations of the multinomial count fits the rows the shard
    may draw ahead (its rate limiter's room at its last reply). Chosen before the counts are
    drawn, so it does not bias them; the rare fetch that still asks a shard for more than its
    room waits there as any sample would.
    """
    if depth <= 1:
        return 1
    share = mass / mass.sum()
    j = np.arange(1, depth + 1)[:, None]
    need = j * batch_size * share + 4.0 * np.sqrt(j * batch_size * share * (1.0 - share))
    fits = ((need <= ahead) | (share == 0)).all(axis=1)
    return int(max(1, np.argmin(fits) if not fits.all() else depth))


def draw_plan(rng: np.random.Generator, batch_size: int, mass: np.ndarray, k: int) -> np.ndarray:
    """``k`` independent rows of ``Multinomial(batch_size, mass / mass.sum())`` (int64 counts per shard).

    A ``(k, shards)`` array: the counts of a fetch of ``k`` batches; ``mass.sum() > 0``.
    """
    return rng.multinomial(batch_size, mass / mass.sum(), size=k).astype(np.int64)


def slice_rows(smp: Any, lo: int, hi: int) -> Any:
    """Rows ``lo:hi`` of a Sample, SequenceSample or NStepSample (views where NumPy allows)."""
    n = len(smp.probabilities)
    fields = {}
    for f in dataclasses.fields(smp):  # (not _rowwise: once per batch, this loop is measurably cheaper)
        v = getattr(smp, f.name)
        if f.name in _PAYLOAD:
            fields[f.name] = _slice_payload(v, lo, hi)
        elif isinstance(v, np.ndarray) and v.ndim >= 1 and v.shape[0] == n:
            fields[f.name] = v[lo:hi]
        else:
            fields[f.name] = v
    return type(smp)(**fields)


def _slice_payload(data: Any, lo: int, hi: int) -> Any:
    if isinstance(data, dict):
        return {k: _slice_payload(v, lo, hi) for k, v in data.items()}
    if data is None:
        return None
    return data[lo:hi]


def split_fetch(
    got: dict[int, Any],
    counts: np.ndarray,
    tag: int,
    mass: np.ndarray,
    states: list[State | None],
    shuffles: list[np.random.Generator | None],
) -> list[Any]:
    """The ``k`` batches of a fetch: shard ``s`` drew ``counts[:, s].sum()`` rows (i.i.d.) in one call.

    Batch ``j`` takes the next ``counts[j, s]`` of shard ``s``'s rows, shuffled by ``shuffles[j]``
    (``None``: shard by shard); a batch whose rows all came from shards missing from ``got`` is
    ``None``. Each shard draws with replacement, so its rows split this way are ``k`` independent
    draws of the planned counts, exactly as ``k`` separate calls at the same instant would give.
    The fetch is merged once (:func:`merge`) and every column gathered once, in batch order; the
    batches are views of that.
    """
    shards = [s for s in sorted(got) if counts[:, s].sum()]
    if not shards:
        return [None] * len(counts)
    whole = merge([(s, got[s]) for s in shards], tag, mass, states, None)
    base = dict(zip(shards, np.cumsum([0] + [int(counts[:, s].sum()) for s in shards[:-1]])))
    offsets = np.zeros((len(counts) + 1, counts.shape[1]), dtype=np.int64)
    np.cumsum(counts, axis=0, out=offsets[1:])
    pieces, sizes = [], []
    for j in range(len(counts)):
        idx = np.concatenate([np.arange(offsets[j, s], offsets[j + 1, s]) + base[s] for s in shards])
        if shuffles[j] is not None:
            idx = idx[shuffles[j].permutation(len(idx))]
        pieces.append(idx)
        sizes.append(len(idx))
    rows = np.concatenate(pieces)
    every = _rowwise([whole], lambda v: take(v[0], rows), lambda v: v[0][rows])
    if len(sizes) == 1:
        return [every]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [slice_rows(every, int(bounds[j]), int(bounds[j + 1])) if sizes[j] else None for j in range(len(sizes))]


_MAXED = ("version", "max_priority_seen", "times_sampled_max", "priority_max", "next_stream", "wal_lsn")
_MEANS = ("times_sampled_mean", "priority_mean")


def total_stats(per: list[dict[str, Any] | None], name: str | None = None) -> dict[str, Any]:
    """One Table's ``stats()`` from its shards' (``None``: a shard that did not answer, left out).

    Counters, sizes and capacity summed, every ``*_histogram`` added, ``version`` and the maxima
    the largest, ``priority_min`` the smallest, means weighted by each shard's size,
    ``sample_to_insert_ratio`` of the sums, ``config`` the first shard's; ``name`` (default: the
    first shard's) names the table. Used by :meth:`~replaystore.ray.ShardedClient.stats` and, as
    ``merge_shards``, by :mod:`replaystore.metrics`.
    """
    per = [st for st in per if st]
    total: dict[str, Any] = {"name": name if name is not None or not per else per[0].get("name")}
    live = [st for st in per if st.get("size", 0)]
    for st in per:
        for k, v in st.items():
            if k in _MAXED:
                total[k] = max(total.get(k, v), v)
            elif k.endswith("_histogram") and isinstance(v, dict):
                hist = total.setdefault(k, {})
                for b, c in v.items():
                    hist[b] = hist.get(b, 0) + c
            elif k not in _MEANS and k != "priority_min" and isinstance(v, (int, float)) and not isinstance(v, bool):
                total[k] = total.get(k, 0) + v
    if per and "config" in per[0]:
        total["config"] = per[0]["config"]
    size = sum(st["size"] for st in live)
    for k in _MEANS:
        total[k] = float(sum(st.get(k, 0) * st["size"] for st in live) / size) if live else 0.0
    total["priority_min"] = min(st.get("priority_min", 0.0) for st in live) if live else 0.0
    if not live:
        total["priority_max"] = 0.0
        total["times_sampled_max"] = 0
    total["sample_to_insert_ratio"] = total["samples"] / total["inserts"] if total.get("inserts") else 0.0
    return total
