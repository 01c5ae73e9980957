"""MixedSampler: batches drawn from several tables in a fixed ratio (offline-to-online RL).

```python
mix = rs.MixedSampler({"offline": offline_table, "online": online_table}, ratios=(0.25, 0.75))
s = mix.sample(256)                  # exactly 64 offline rows, then 192 online rows
s.data["obs"], s.source, s.names     # source: int index into names, per row
mix.update_priorities(s, td_errors)  # each row's priority goes back to its own table
```

**Exact counts.** Every batch holds a fixed number of rows from each source, computed from the
ratios by the largest-remainder rule: source ``j`` gets ``floor(r_j * B)`` rows, and the
``B - sum_j floor(r_j * B)`` rows left go one each to the sources with the largest fractional
parts ``r_j * B - floor(r_j * B)`` (ties: the earlier source). So the counts are the same for every
batch of size ``B`` and each is within 1 of ``r_j * B``. With ``rounding="stochastic"`` the left-over
rows are instead given to sources drawn with probability equal to their fractional part (systematic
sampling), so each count is ``floor(r_j B)`` or ``ceil(r_j B)`` and its **expectation** is exactly
``r_j * B`` (use it when ``B`` is so small that fixed rounding would bias the mix, e.g. ``B = 1``).

**Rows and weights** (the batch is the per-source samples concatenated in source order, each row
keeping its own source's metadata, importance weights included): :class:`MixedSample`. Specs that
differ (checked when the sampler is built, or cast with ``cast=True``) and what the mix does not
promise (it is not atomic across sources): docs/offline_to_online.md, "When the specs differ" and
"What the mix guarantees". Argument errors are raised before any source is sampled.

Sources are :class:`~replaystore.Table` objects or anything with the same ``sample`` and
``update_priorities`` methods (a :class:`replaystore.ray.ReplayClient`). The sampler itself is
thread-safe when its sources are (it holds only a random generator behind a lock).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InvalidArgument, SpecError
from .storage.spec import Field, normalize_spec, unflatten
from .table.args import as_priorities


class InvalidMix(InvalidArgument):
    """Ratios or sources of a :class:`MixedSampler` are invalid (negative, all zero, mismatched)."""


def mix_counts(ratios: Sequence[float], batch_size: int) -> np.ndarray:
    """Rows per source for a batch of ``batch_size`` by the largest-remainder rule (module doc)."""
    r = np.asarray(ratios, dtype=np.float64)
    exact = r / r.sum() * batch_size
    counts = np.floor(exact).astype(np.int64)
    left = int(batch_size - counts.sum())
    if left:
        order = np.argsort(-(exact - counts), kind="stable")  # stable: ties go to the earlier source
        counts[order[:left]] += 1
    return counts


@dataclass(frozen=True)
class MixedSample:
    """A batch from a :class:`MixedSampler`: the per-source samples concatenated in source order.

    Attributes:
        data: the concatenated data (nested dicts of arrays with the batch as leading axis).
        source: int64 per row, the index of its source in ``names``.
        names: the source names, in order.
        counts: rows per source (``counts[j]`` rows from ``names[j]``).
        keys, indices, probabilities, weights, priorities, times_sampled, versions: each source's
            own metadata, concatenated (keys are only unique within a source).
        mixture_probabilities: ``counts[j] / B * probabilities`` per row.
        extra: the other fields of the sources' samples: per-row arrays concatenated (``mask``,
            ``step_keys`` of sequence samples; ``returns``, ``next_obs`` of n-step samples), and
            per-sample constants (``burn_in``) once.
        indices: storage slots; -1 for sample types that have none (sequence samples).
    """

    data: Any
    source: np.ndarray
    names: tuple[str, ...]
    counts: np.ndarray
    keys: np.ndarray
    indices: np.ndarray
    probabilities: np.ndarray
    weights: np.ndarray
    priorities: np.ndarray
    times_sampled: np.ndarray
    versions: np.ndarray
    mixture_probabilities: np.ndarray
    extra: dict[str, Any]

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def rows(self, name: str) -> slice:
        """The rows of source ``name`` (a slice: sources are contiguous)."""
        j = self.names.index(name)
        start = int(self.counts[:j].sum())
        return slice(start, start + int(self.counts[j]))


_META = ("keys", "indices", "probabilities", "weights", "priorities", "times_sampled", "versions")


def spec_of(source: Any) -> dict | None:
    """The spec of a source's storage as a nested dict of :class:`~replaystore.Field`, or ``None``.

    ``None`` when the source has no column storage or its spec is not known yet (no item and no
    ``spec=``). The result is a valid ``spec=`` for a new Table: ``rs.Table(n, spec=spec_of(offline))``
    makes a table whose fields (dtypes included) match ``offline``'s.
    """
    storage = getattr(source, "storage", None)
    describe = getattr(storage, "describe", None)
    if describe is None:
        return None
    flat = describe().get("spec")
    if not flat:
        return None
    return unflatten({path: Field.from_json(f) for path, f in flat.items()})


def _check_specs(specs: dict[str, dict[str, Field]], cast: bool) -> dict[str, np.dtype]:
    """Compare the known flat specs; return the reference dtype per field path.

    Raises:
        SpecError: fields, or shapes, differ; or dtypes differ and ``cast`` is false (or cannot
            be cast ``same_kind``).
    """
    if not specs:
        return {}
    ref_name, ref = next(iter(specs.items()))
    for name, spec in specs.items():
        if spec.keys() != ref.keys():
            raise SpecError(
                f"sources {ref_name!r} and {name!r} have different fields: {sorted(ref)} and {sorted(spec)}"
            )
        for path, f in spec.items():
            r = ref[path]
            if f.shape != r.shape:
                raise SpecError(
                    f"field {path!r}: source {ref_name!r} has item shape {r.shape}, "
                    f"source {name!r} {f.shape}; the shapes of mixed sources must agree"
                )
            if f.dtype == r.dtype:
                continue
            if not cast:
                raise SpecError(
                    f"field {path!r}: source {ref_name!r} stores {r.dtype}, source {name!r} {f.dtype}; "
                    f"pass cast=True to cast each batch to {r.dtype}, or build {name!r} with "
                    f"spec=replaystore.mixing.spec_of(<table {ref_name!r}>) so its inserts are cast "
                    f"(a gymnasium float reward is float64 unless the spec says float32)"
                )
            if not np.can_cast(f.dtype, r.dtype, "same_kind"):
                raise SpecError(
                    f"field {path!r}: source {name!r} stores {f.dtype}, which cannot be cast "
                    f"same_kind to {r.dtype} (source {ref_name!r})"
                )
    return {path: f.dtype for path, f in ref.items()}


def _concat(parts: list, path: str = "data", ref: Mapping[str, np.dtype] | None = None, cast: bool = False) -> Any:
    first = parts[0]
    if isinstance(first, Mapping):
        if any(not isinstance(p, Mapping) or p.keys() != first.keys() for p in parts):
            raise SpecError(
                f"sources sampled different fields at {path!r}: "
                f"{[sorted(p) if isinstance(p, Mapping) else type(p).__name__ for p in parts]}"
            )
        return {k: _concat([p[k] for p in parts], f"{path}/{k}", ref, cast) for k in first}
    if isinstance(first, np.ndarray):
        shapes = {p.shape[1:] for p in parts}
        dtypes = {p.dtype for p in parts}
        if cast and len(shapes) == 1:
            field = path.split("/", 1)[1] if "/" in path else path
            target = (ref or {}).get(field, first.dtype)
            if all(np.can_cast(d, target, "same_kind") for d in dtypes):
                return np.concatenate([p.astype(target, copy=False) for p in parts])
        if len(shapes) > 1 or len(dtypes) > 1:
            raise SpecError(
                f"sources differ at {path!r}: shapes {sorted(map(str, shapes))}, "
                f"dtypes {sorted(map(str, dtypes))}"
                + (
                    ""
                    if cast or len(shapes) > 1
                    else "; pass cast=True to MixedSampler to cast to the first source's dtype"
                )
            )
        return np.concatenate(parts)
    if isinstance(first, list):
        return [x for p in parts for x in p]
    raise SpecError(f"cannot concatenate {type(first).__name__} at {path!r}")


class MixedSampler:
    """Sample a fixed ratio of rows from several tables per batch.

    Args:
        sources: name -> Table (or Ray client), in the order rows are concatenated.
        ratios: one non-negative weight per source (a sequence in source order, or a mapping by
            name); normalised to sum to 1.
        rounding: ``"largest_remainder"`` (fixed counts per batch size) or ``"stochastic"``
            (counts whose expectation is exact); see the module doc.
        seed: seed of the stochastic rounding.
        cast: cast each batch's fields to the reference dtype (the first source's with a known
            spec) when the sources' dtypes differ and NumPy can cast ``same_kind``; without it a
            dtype difference raises ``SpecError`` (docs/offline_to_online.md, "When the specs differ").

    Raises:
        InvalidMix: no sources, a ratio per source missing, negative/NaN ratios, all zero, or an
            unknown rounding.
        SpecError: the known specs of the sources differ in fields or shapes, or in dtypes without
            ``cast=True`` (the message names the field and both fixes).
    """

    def __init__(
        self,
        sources: Mapping[str, Any],
        ratios: Sequence[float] | Mapping[str, float],
        rounding: str = "largest_remainder",
        seed: int | None = None,
        cast: bool = False,
    ) -> None:
        if not sources:
            raise InvalidMix("a MixedSampler needs at least one source")
        self.names = tuple(sources)
        self.sources = dict(sources)
        if isinstance(ratios, Mapping):
            if set(ratios) != set(self.names):
                raise InvalidMix(f"ratios name {sorted(ratios)}, sources are {sorted(self.names)}")
            ratios = [ratios[n] for n in self.names]
        r = np.asarray(list(ratios), dtype=np.float64)
        if r.shape != (len(self.names),):
            raise InvalidMix(f"{len(self.names)} sources need {len(self.names)} ratios, got {r.shape[0]}")
        if not np.isfinite(r).all() or (r < 0).any() or r.sum() <= 0:
            raise InvalidMix(f"ratios must be finite, non-negative and not all zero, got {r.tolist()}")
        if rounding not in ("largest_remainder", "stochastic"):
            raise InvalidMix(f"rounding must be 'largest_remainder' or 'stochastic', got {rounding!r}")
        known = {name: spec for name in self.names if (spec := spec_of(self.sources[name])) is not None}
        self._ref_dtypes = _check_specs({n: normalize_spec(s) for n, s in known.items()}, bool(cast))
        self.cast = bool(cast)
        self.ratios = r / r.sum()
        self.rounding = rounding
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()

    def counts(self, batch_size: int) -> np.ndarray:
        """Rows per source for one batch of ``batch_size`` (random only with stochastic rounding)."""
        if int(batch_size) < 1:
            raise InvalidArgument(f"batch_size must be >= 1, got {batch_size}")
        b = int(batch_size)
        if self.rounding == "largest_remainder":
            return mix_counts(self.ratios, b)
        exact = self.ratios * b
        counts = np.floor(exact).astype(np.int64)
        frac = exact - counts
        left = int(round(b - counts.sum()))
        if left:
            with self._lock:
                u = self._rng.random()
            # systematic sampling: points u, u+1, ..., u+left-1 over the cumulative fractions pick
            # exactly `left` distinct sources, source j with probability frac[j] (each frac < 1)
            edges = np.concatenate([[0.0], np.cumsum(frac)])
            edges[-1] = left  # guard the top edge against rounding
            hits = np.searchsorted(edges, u + np.arange(left), side="right") - 1
            counts[hits] += 1
        return counts

    def _draw(self, method: str, batch_size: int, args: tuple, kwargs: dict, what: str = "sample") -> MixedSample:
        missing = [n for n in self.names if not hasattr(self.sources[n], method)]
        if missing:
            raise InvalidMix(f"sources {missing} cannot {what} (not episodic tables)")
        counts = self.counts(batch_size)
        samples = []
        for name, n in zip(self.names, counts.tolist()):
            if n:
                samples.append(getattr(self.sources[name], method)(n, *args, **kwargs))
        total = int(counts.sum())
        meta = {}
        for m in _META:  # a sample type without a field (sequence samples have no indices): -1
            meta[m] = (
                np.concatenate([np.asarray(getattr(s, m)) for s in samples])
                if all(hasattr(s, m) for s in samples)
                else np.full(total, -1, dtype=np.int64)
            )
        source = np.repeat(np.arange(len(self.names), dtype=np.int64), counts)
        share = (counts / batch_size)[source]
        extra = {}
        for f in dataclasses.fields(samples[0]):
            if f.name in _META or f.name == "data":
                continue
            values = [getattr(s, f.name) for s in samples]
            if all(isinstance(v, (np.ndarray, Mapping, list)) for v in values):
                extra[f.name] = _concat(values, f.name)
            elif all(v == values[0] for v in values):
                extra[f.name] = values[0]  # a per-sample constant (e.g. a sequence sample's burn_in)
            else:
                raise SpecError(f"sources returned different {f.name!r}: {values}")
        data = _concat([s.data for s in samples], ref=self._ref_dtypes, cast=self.cast)
        return MixedSample(
            data=data,
            source=source,
            names=self.names,
            counts=counts,
            mixture_probabilities=share * meta["probabilities"],
            extra=extra,
            **meta,
        )

    def sample(self, batch_size: int, timeout: float | None = None) -> MixedSample:
        """Draw one batch: ``counts(batch_size)[j]`` rows from source ``j`` (each via its ``sample``).

        Raises:
            InvalidArgument: ``batch_size < 1``.
            SpecError: the sources' data differ in fields, shapes or dtypes.
            Timeout, Closed: from a source; the sources sampled before it stay counted (not atomic).
        """
        return self._draw("sample", batch_size, (), {"timeout": timeout})

    def sample_sequences(self, batch_size: int, length: int, **kwargs: Any) -> MixedSample:
        """Draw sequences from episodic sources: ``counts(batch_size)[j]`` from source ``j``.

        ``kwargs`` (``burn_in``, ``mode``, ``timeout``) go to each source's ``sample_sequences``;
        the per-row extras of a sequence sample (``mask``, ``step_keys``, ``streams``,
        ``episodes``) are concatenated into ``extra``. ``keys`` are the start steps' keys, usable
        with :meth:`update_priorities`.
        """
        return self._draw("sample_sequences", batch_size, (length,), kwargs, "sample sequences")

    def sample_nstep(self, batch_size: int, n: int, gamma: float, **kwargs: Any) -> MixedSample:
        """Draw n-step transitions from episodic sources: ``counts(batch_size)[j]`` from source ``j``.

        ``kwargs`` (``timeout``) go to each source's ``sample_nstep``; ``returns``, ``next_obs``,
        ``steps``, ``done`` and ``discount`` are concatenated into ``extra``.
        """
        return self._draw("sample_nstep", batch_size, (n, gamma), kwargs, "sample n-step transitions")

    def update_priorities(self, sample: MixedSample | Mapping[str, Any], priorities: Any) -> dict[str, int]:
        """Send each row's priority back to the source it came from.

        Args:
            sample: the :class:`MixedSample` the priorities are for, or a batch of it as a mapping
                with its ``source`` and ``keys`` (what a :class:`~replaystore.integrations.dataloader.ReplayDataset`
                yields).
            priorities: one per row (array-like, or a scalar for all).

        Returns:
            name -> number of priorities the source applied (stale keys are skipped by the source).

        Raises:
            InvalidPriority: a priority is NaN, infinite or negative (checked before any source
                changes), or their number differs from the sample's rows.
        """
        rows = (sample["source"], sample["keys"]) if isinstance(sample, Mapping) else (sample.source, sample.keys)
        source, keys = map(np.asarray, rows)
        p = as_priorities(priorities, len(keys), True, "a mixture's sources")
        out = {}
        for j, name in enumerate(self.names):
            rows = source == j
            if rows.any():
                out[name] = int(self.sources[name].update_priorities(keys[rows], p[rows]))
        return out
