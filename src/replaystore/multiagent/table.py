"""MultiAgentTable: many agents' steps in one episodic table, sampled per agent or jointly.

It wraps any object offering the Table's public calls (an in-process ``Table``, a
``SharedTable``, the Ray service's ``ReplayClient``, a ``ShardedClient``): one row per environment
step (see :mod:`.layout`), one stream per environment, so an episode's agents are one row and never
span shards. Everything the table does (eviction, rate limits, checkpoints, the service) applies
unchanged; this class adds only the agent axis on the way in and out.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgument, MultiAgentError
from .layout import AGENT_PRIORITY, ALIVE, RESERVED, AgentLayout
from .nstep import check_nstep, later_rows, nstep
from .priorities import AgentPriorities, agent_shares, check_priorities, step_mass
from .samples import AgentBatch, JointBatch
from .writes import AgentWrites

PRIORITY_MODES = ("joint", "agents")


class MultiAgentTable(AgentWrites):
    """Multi-agent replay on one episodic table: independent and synchronized sampling.

    Args:
        table: an episodic table (``episodes=rs.Episodes(...)``) or a client of one.
        agents: the agent ids (the agent axis); PettingZoo: ``env.possible_agents``.
        required: agents every step must contain.
        fields: per-agent field specs ``{name: (shape, dtype)}`` (``None``: learnt from the first
            step written through this object). Needed by readers only for :meth:`spec`.
        global_fields: global fields stored once per step: a spec ``{name: (shape, dtype)}`` or
            just their names. A reader that neither wrote nor got ``fields=`` tells the per-agent
            fields by their agent axis: name the global fields whose first axis has the agent
            count.
        priorities: ``"joint"``: the table's sampler draws steps as it does for any table (uniform,
            or prioritized by joint priorities); an independent draw then takes an alive agent of
            the step uniformly. ``"agents"``: one priority per (step, agent); the table's sampler
            must be ``Prioritized(alpha=1.0)`` and this object applies ``alpha`` (see
            :mod:`.priorities`); with ``alpha=0`` independent draws are uniform over all
            (step, alive agent) pairs.
        alpha: the exponent of per-agent priorities (``priorities="agents"``).
        beta: the exponent of the importance weights of independent draws.
        reward_field: the per-agent reward field (n-step returns).
        next_obs_field: the per-agent next observation field (n-step bootstraps).
        terminated_field: the per-agent termination flag (the agent's own end, no bootstrap).
        truncated_field: the per-agent truncation flag (the agent's own end, bootstrap).
        seed: seeds the agent draws of this object.

    Thread-safety: every method may be called from several threads (the object's own state is
    under one lock; the table's calls are thread-safe themselves).

    Raises:
        InvalidArgument: bad agents, priorities mode, alpha or beta.
        MultiAgentError: ``priorities="agents"`` with an in-process table whose sampler is not
            ``Prioritized(alpha=1.0)``.
    """

    def __init__(
        self,
        table: Any,
        agents: Sequence[Hashable],
        *,
        required: Sequence[Hashable] = (),
        fields: Mapping[str, Any] | None = None,
        global_fields: Mapping[str, Any] | Sequence[str] | None = None,
        priorities: str = "joint",
        alpha: float = 0.6,
        beta: float = 0.4,
        reward_field: str = "reward",
        next_obs_field: str = "next_obs",
        terminated_field: str = "terminated",
        truncated_field: str = "truncated",
        seed: int | None = None,
    ) -> None:
        if priorities not in PRIORITY_MODES:
            raise InvalidArgument(f"priorities must be one of {PRIORITY_MODES}, got {priorities!r}")
        if not (np.isfinite(alpha) and alpha >= 0 and np.isfinite(beta) and beta >= 0):
            raise InvalidArgument(f"alpha and beta must be finite and >= 0, got {alpha}, {beta}")
        if isinstance(global_fields, Mapping) or global_fields is None:
            specs, names = global_fields, set(global_fields or ())
        else:
            specs, names = None, set(global_fields)
        self.layout = AgentLayout(agents, required, fields, specs)
        self.table = table
        self.priorities = priorities
        self.alpha, self.beta = float(alpha), float(beta)
        self._globals = names
        self._names = (reward_field, next_obs_field, terminated_field, truncated_field)
        self._lock = threading.Lock()
        self._rng = np.random.default_rng(seed)
        self._book = AgentPriorities()
        self._max_priority = 1.0
        if priorities == "agents":
            sampler = getattr(table, "sampler", None)
            if sampler is not None and getattr(sampler, "alpha", None) != 1.0:
                raise MultiAgentError(
                    "priorities='agents' needs the table's sampler to be rs.Prioritized(alpha=1.0), "
                    f"got {type(sampler).__name__}(alpha={getattr(sampler, 'alpha', None)})"
                )

    @property
    def agents(self) -> tuple:
        """The agent ids, in the order of the agent axis."""
        return self.layout.agents

    def spec(self) -> dict:
        """The table's row spec (``SharedTable.create`` needs it up front).

        Raises:
            MultiAgentError: ``fields``/``global_fields`` specs were not given and nothing was written.
        """
        return self.layout.spec(agent_priorities=self.priorities == "agents")

    # -- independent sampling -----------------------------------------------------------------------

    def _shares(self, keys: np.ndarray, rows: dict) -> np.ndarray:
        alive = np.asarray(rows[ALIVE], bool)
        if self.priorities == "agents":
            written = np.where(alive, np.asarray(rows[AGENT_PRIORITY], np.float64), np.nan)
            return agent_shares(self._book.current(keys, written), self.alpha)
        return alive / np.maximum(alive.sum(axis=-1, keepdims=True), 1)

    def _draw(self, keys: np.ndarray, rows: dict, probabilities: np.ndarray) -> tuple[np.ndarray, ...]:
        q = self._shares(keys, rows)
        b = len(keys)
        if b and not (np.asarray(rows[ALIVE]).any(axis=-1)).all():
            raise MultiAgentError("a sampled step has no alive agent (not written through MultiAgentTable?)")
        cum = np.cumsum(q, axis=1)
        u = self._rng.random(b) * cum[:, -1]
        agents = np.minimum((cum <= u[:, None]).sum(axis=1), q.shape[1] - 1)
        share = q[np.arange(b), agents]
        bad = share <= 0  # rounding at the top of the cumulative sum: take the last alive agent
        if bad.any():
            agents[bad] = q.shape[1] - 1 - np.argmax(q[bad][:, ::-1] > 0, axis=1)
            share = q[np.arange(b), agents]
        p = np.asarray(probabilities, np.float64) * share
        w = np.power(p / p.min(), -self.beta) if b else p
        return agents, p, w

    def _per_agent(self, name: str, col: Any, axis: int) -> bool:
        """Whether a sampled column is per agent (its agent axis at ``axis``)."""
        if self.layout.fields is not None:
            return name in self.layout.fields
        shape = np.shape(col)
        return name not in self._globals and len(shape) > axis and shape[axis] == self.layout.n_agents

    def _split(self, data: dict, pick: Any, axis: int = 1) -> dict:
        out = {}
        for name, col in data.items():
            if name in RESERVED:
                continue
            out[name] = pick(col) if self._per_agent(name, col, axis) else col
        return out

    def sample(self, batch_size: int, timeout: float | None = None) -> AgentBatch:
        """Draw ``batch_size`` (step, agent) transitions: all agents' data pooled (parameter sharing).

        Returns:
            An :class:`AgentBatch`: the drawn agent's fields ``(B, ...)``, its position ``agents``,
            the exact pair probabilities and importance weights.

        Raises:
            Timeout: the table's rate limiter did not allow the sample in time (the table's other
                errors, e.g. ``Closed``, pass through).
            MultiAgentError: a sampled step holds no alive agent (not written by this class).
        """
        s = self.table.sample(batch_size, timeout=timeout)
        with self._lock:
            agents, p, w = self._draw(s.keys, s.data, s.probabilities)
        ar = np.arange(len(agents))
        return AgentBatch(
            data=self._split(s.data, lambda c: c[ar, agents]),
            agents=agents,
            agent_ids=self.agents,
            mask=np.ones(len(agents), bool),
            keys=s.keys,
            probabilities=p,
            weights=w,
            step_probabilities=s.probabilities,
        )

    def sample_nstep(self, batch_size: int, n: int, gamma: float, timeout: float | None = None) -> AgentBatch:
        """Draw ``batch_size`` (step, agent) pairs and their ``n``-step transitions for that agent.

        The agent's return ``sum_{j<k} gamma**j r_{t+j}`` stops at its own termination (``done``,
        ``discount = 0``), its truncation, a step it did not act in, or the newest stored step of
        the episode; ``next_obs`` is its next observation at step ``t+k-1`` and
        ``discount = gamma**k``.

        Raises:
            MultiAgentError: bad ``n``/``gamma``; ``n > 1`` on a table without
                ``episode_info``/``episode_keys`` (raised before anything is sampled).
            Timeout: as :meth:`sample`.
        """
        n, gamma = check_nstep(n, gamma, self.table)  # before anything is sampled
        s = self.table.sample(batch_size, timeout=timeout)
        with self._lock:
            agents, p, w = self._draw(s.keys, s.data, s.probabilities)
        ar = np.arange(len(agents))
        returns, steps, done, nxt = self._nstep(s, n, gamma, lambda c: c[ar, agents][:, None], 1)
        return AgentBatch(
            data=self._split(s.data, lambda c: c[ar, agents]),
            agents=agents,
            agent_ids=self.agents,
            mask=np.ones(len(agents), bool),
            keys=s.keys,
            probabilities=p,
            weights=w,
            step_probabilities=s.probabilities,
            returns=returns[:, 0],
            discount=np.where(done[:, 0], 0.0, gamma ** steps[:, 0].astype(np.float64)),
            done=done[:, 0],
            steps=steps[:, 0],
            next_obs=nxt[:, 0],
        )

    def _nstep(self, s: Any, n: int, gamma: float, pick: Any, width: int) -> tuple:
        names = self._names + (ALIVE,)
        first = {f: pick(np.asarray(s.data[f])) for f in names}
        later = present = None
        if n > 1:
            rows, present = later_rows(self.table, np.asarray(s.keys, np.int64), n, names)
            later = {f: np.stack([pick(r) for r in rows[f]]) for f in names}
        return nstep(first, later, present, gamma, self._names)

    def sample_sequences(
        self, batch_size: int, length: int, burn_in: int = 0, mode: str = "strict", timeout: float | None = None
    ) -> AgentBatch:
        """Draw ``batch_size`` sequences of one agent each (recurrent parameter sharing).

        The table draws the windows (see ``Table.sample_sequences``); the agent is drawn among those
        alive at the sequence's start after the burn-in (its share of that step). ``mask`` is False
        where the agent did not act (dead, not joined yet) or the position is padding.

        Raises:
            NoValidSequence: no stored episode holds the window (nothing is counted).
            EpisodeError: a window the table's sampler cannot draw (see ``Table.sample_sequences``).
            Timeout: the table's rate limiter did not allow the sample in time.
        """
        s = self.table.sample_sequences(batch_size, length, burn_in=burn_in, mode=mode, timeout=timeout)
        start = {k: np.asarray(v)[:, burn_in] for k, v in s.data.items() if k in RESERVED}
        with self._lock:
            agents, p, w = self._draw(s.keys, start, s.probabilities)
        ar = np.arange(len(agents))
        alive = np.asarray(s.data[ALIVE])[ar, :, agents]
        return AgentBatch(
            data=self._split(s.data, lambda c: c[ar, :, agents], axis=2),
            agents=agents,
            agent_ids=self.agents,
            mask=np.asarray(s.mask, bool) & alive,
            keys=s.keys,
            probabilities=p,
            weights=w,
            step_probabilities=s.probabilities,
            step_keys=s.step_keys,
            burn_in=s.burn_in,
        )

    # -- synchronized sampling ----------------------------------------------------------------------

    def sample_joint(
        self, batch_size: int, n: int = 1, gamma: float = 0.99, timeout: float | None = None
    ) -> JointBatch:
        """Draw ``batch_size`` environment steps with every agent (VDN, QMIX, MADDPG).

        ``mask`` ``(B, A)`` is the ``alive`` column. Every agent's ``n``-step transition (as
        :meth:`sample_nstep`, per agent; ``n=1``: the step's own) is in ``returns``/``discount``/
        ``done``/``steps``/``next_obs`` ``(B, A, ...)`` when the rows hold the reward, next
        observation, terminated and truncated fields (zeros, ``steps=0`` for absent agents).
        Probabilities and weights are the table's.

        Raises:
            MultiAgentError: bad ``n``/``gamma``, or ``n > 1`` on a table without
                ``episode_info``/``episode_keys`` (before anything is sampled).
            Timeout: as :meth:`sample`.
        """
        n, gamma = check_nstep(n, gamma, self.table)  # before anything is sampled
        s = self.table.sample(batch_size, timeout=timeout)
        mask = np.asarray(s.data[ALIVE], bool)
        extra: dict[str, Any] = {}
        if n > 1 or all(f in s.data for f in self._names):
            returns, steps, done, nxt = self._nstep(s, n, gamma, lambda c: c, self.layout.n_agents)
            discount = np.where(done, 0.0, gamma ** steps.astype(np.float64))
            extra = dict(returns=returns, discount=discount, done=done, steps=steps, next_obs=nxt)
        data = {k: v for k, v in s.data.items() if k != AGENT_PRIORITY}
        return JointBatch(
            data=data,
            mask=mask,
            agent_ids=self.agents,
            keys=s.keys,
            probabilities=s.probabilities,
            weights=s.weights,
            priorities=s.priorities,
            **extra,
        )

    def sample_joint_sequences(
        self, batch_size: int, length: int, burn_in: int = 0, mode: str = "strict", timeout: float | None = None
    ) -> JointBatch:
        """Draw ``batch_size`` windows of ``burn_in + length`` environment steps with every agent.

        For recurrent value decomposition (R2D2-style burn-in). ``mask`` ``(B, T, A)`` is the
        window's mask and each agent's ``alive``.

        Raises:
            NoValidSequence: no stored episode holds ``burn_in + length`` steps (nothing is counted).
            EpisodeError: a window the table's sampler cannot draw (see ``Table.sample_sequences``).
            Timeout: the table's rate limiter did not allow the sample in time.
        """
        s = self.table.sample_sequences(batch_size, length, burn_in=burn_in, mode=mode, timeout=timeout)
        mask = np.asarray(s.mask, bool)[:, :, None] & np.asarray(s.data[ALIVE], bool)
        data = {k: v for k, v in s.data.items() if k != AGENT_PRIORITY}
        return JointBatch(
            data=data,
            mask=mask,
            agent_ids=self.agents,
            keys=s.keys,
            probabilities=s.probabilities,
            weights=s.weights,
            priorities=s.priorities,
            step_keys=s.step_keys,
            burn_in=s.burn_in,
        )

    # -- priorities ---------------------------------------------------------------------------------

    def update_priorities(self, keys: Any, priorities: Any, agents: Any = None) -> int:
        """Set priorities: per (step, agent) with ``agents``, else joint (one per step).

        ``priorities="joint"``: only joint updates; they go to the table as they are.
        ``priorities="agents"``: with ``agents`` (ids or positions, one per key) the pairs' values
        change; without, every alive agent of the step gets the value. The step's row is rewritten
        (``Table.update_fields``: its ``agent_priority``, so checkpoints, the write-ahead log and
        a new ``MultiAgentTable`` keep it), then its mass (``update_priorities``). The other agents'
        values of a step come from this object's last sample, else from the row. Keys no longer
        stored are skipped.

        Returns:
            The number of steps updated.

        Raises:
            InvalidPriority: NaN, infinite or negative values.
            UnknownAgent: an unknown agent.
            MultiAgentError: per-agent values on a ``"joint"`` table; lengths that differ.
                Nothing changes on any error.
        """
        keys = np.asarray(keys, np.int64).reshape(-1)
        values = check_priorities(priorities, len(keys))
        if self.priorities == "joint":
            if agents is not None:
                raise MultiAgentError("per-agent priorities need MultiAgentTable(priorities='agents')")
            return int(self.table.update_priorities(keys, values))
        idx = None
        if agents is not None:
            idx = self.layout.indices(np.asarray(agents) if not isinstance(agents, list) else agents)
            if len(idx) != len(keys):
                raise MultiAgentError(f"{len(idx)} agents for {len(keys)} keys")
        if len(keys) == 0:
            return 0
        with self._lock:
            uk, rows, found = self._book.update(keys, idx, values, self._fetch)
            uk, rows = uk[found], rows[found]
            if len(uk) == 0:
                return 0
            self.table.update_fields(uk, {AGENT_PRIORITY: rows})  # (the truth: kept by checkpoints and logs)
            applied = self.table.update_priorities(uk, step_mass(rows, self.alpha))
            self._book.commit(uk, rows)
            self._max_priority = max(self._max_priority, float(values.max()))
            return int(applied)

    def _fetch(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        data, found = self.table.get(keys)
        found = np.asarray(found, bool)
        if not found.any():
            return np.zeros((0, self.layout.n_agents)), found
        alive = np.asarray(data[ALIVE], bool)
        return np.where(alive, np.asarray(data[AGENT_PRIORITY], np.float64), np.nan), found
