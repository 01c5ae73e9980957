"""The writers of a MultiAgentTable: one environment step (a dict per agent, PettingZoo's output) as one row."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import MissingAgent, MultiAgentError
from .layout import AGENT_PRIORITY
from .priorities import check_priorities, step_mass


class AgentWrites:
    """``add_step``, ``add_steps``, ``add_parallel_step``, ``end_episode`` of :class:`MultiAgentTable`.

    A mixin: it uses the table's ``layout``, ``table``, ``priorities``, ``alpha``, ``_lock``,
    ``_globals``, ``_names`` and ``_max_priority``.
    """

    def add_step(
        self,
        step: Mapping[Hashable, Mapping[str, Any]],
        stream: int = 0,
        state: Mapping[str, Any] | None = None,
        terminated: bool | None = None,
        truncated: bool | None = None,
        priority: float | Mapping[Hashable, float] | None = None,
        timeout: float | None = None,
    ) -> int:
        """Store one environment step of the agents that acted in it; return its key.

        Args:
            step: ``{agent: {field: value}}``; absent agents are stored as zeros with
                ``alive=False``.
            stream: the environment (one stream per environment; its steps form its episodes).
            state: global fields of the step (``{"state": ..., "next_state": ...}``), stored once.
            terminated: the environment episode terminated; ``None``: derived from the agents'
                ``terminated``/``truncated`` fields (the episode ends when every agent of the step
                is done; it is ``terminated`` when all of them terminated).
            truncated: the environment episode was cut; ``None``: derived the same way.
            priority: ``priorities="joint"``: the step's priority (``None``: the table's default).
                ``"agents"``: one value for every agent or ``{agent: value}`` (``None``: the
                largest per-agent priority this object has seen, 1.0 at first).
            timeout: for the table's rate limiter.

        Raises:
            UnknownAgent: an agent id that is not one of the table's.
            MissingAgent: a required agent is absent.
            AgentShapeMismatch: agents give a field different shapes, or shapes or dtypes that do
                not fit the stored field.
            MultiAgentError: no agent, agents with different fields, reserved or unknown field names.
            InvalidPriority: a bad priority.
            Timeout: the table's rate limiter did not allow the write in time (the table's other
                errors, e.g. ``SpecError``, ``EpisodeError``, pass through). Nothing is written on
                any error.
        """
        with self._lock:
            row, idx, fields, globals_ = self.layout.pack(step, state)
            extra = set(globals_) - self._globals if self._globals else set()
            if self._globals and extra:
                raise MultiAgentError(f"global fields {sorted(extra)} are not the table's {sorted(self._globals)}")
            if terminated is None or truncated is None:
                term, trunc = self._episode_end(row, idx)
                terminated = term if terminated is None else terminated
                truncated = trunc if truncated is None else truncated
            prio = self._write_priority(row, idx, priority)
            key = self.table.add_step(
                row, stream=stream, terminated=terminated, truncated=truncated, priority=prio, timeout=timeout
            )
            self.layout.learn(fields, globals_)
            self._globals |= set(globals_)
            return int(key)

    def add_steps(
        self,
        steps: Sequence[Mapping[Hashable, Mapping[str, Any]]],
        streams: Sequence[int],
        states: Sequence[Mapping[str, Any] | None] | None = None,
        priorities: Sequence[Any] | None = None,
        timeout: float | None = None,
    ) -> np.ndarray:
        """Store one step of each of several environments (a vectorised env) in one table call.

        ``steps[e]`` is environment ``e``'s step as for :meth:`add_step`, written to
        ``streams[e]``; the episode ends are derived from the agents' flags. Every step is checked
        before anything is written.

        Returns:
            int64 keys, one per step.

        Raises:
            MultiAgentError: the lists differ in length, steps whose field specs differ, priorities
                given for some steps only; and every error of :meth:`add_step`, for any step.
        """
        n = len(steps)
        states = [None] * n if states is None else list(states)
        priorities = [None] * n if priorities is None else list(priorities)
        if len(streams) != n or len(states) != n or len(priorities) != n:
            raise MultiAgentError(
                f"{n} steps, {len(streams)} streams, {len(states)} states, {len(priorities)} priorities"
            )
        if n == 0:
            return np.zeros(0, np.int64)
        with self._lock:
            rows, term, trunc, prio, specs = [], np.zeros(n, bool), np.zeros(n, bool), [], None
            for e in range(n):
                row, idx, fields, globals_ = self.layout.pack(steps[e], states[e])
                if specs is None:
                    specs = (fields, globals_)
                elif (fields, globals_) != specs:
                    raise MultiAgentError(f"step {e}'s fields differ from step 0's")
                term[e], trunc[e] = self._episode_end(row, idx)
                prio.append(self._write_priority(row, idx, priorities[e]))
                rows.append(row)
            extra = set(specs[1]) - self._globals if self._globals else set()
            if extra:
                raise MultiAgentError(f"global fields {sorted(extra)} are not the table's {sorted(self._globals)}")
            batch = {name: np.stack([r[name] for r in rows]) for name in rows[0]}
            if any(p is None for p in prio) and not all(p is None for p in prio):
                raise MultiAgentError("give a priority for every step or for none")
            keys = self.table.extend_steps(
                batch,
                streams=np.asarray(streams, np.int64),
                terminated=term,
                truncated=trunc,
                priorities=None if prio[0] is None else np.asarray(prio, np.float64),
                timeout=timeout,
            )
            self.layout.learn(*specs)
            self._globals |= set(specs[1])
            return np.asarray(keys, np.int64)

    def add_parallel_step(
        self,
        obs: Mapping[Hashable, Any],
        actions: Mapping[Hashable, Any],
        step_output: tuple,
        stream: int = 0,
        state: Mapping[str, Any] | None = None,
        priority: float | Mapping[Hashable, float] | None = None,
        timeout: float | None = None,
    ) -> int:
        """Store a PettingZoo ``parallel_env.step`` as it comes; return the step's key.

        ``obs`` are the observations the ``actions`` were chosen from, ``step_output`` is
        ``env.step(actions)``'s ``(observations, rewards, terminations, truncations, infos)``. The
        agents of the step are those in ``actions``; each gets ``obs``, ``action``, ``reward``,
        ``next_obs``, ``terminated``, ``truncated``.

        Raises:
            MissingAgent: an acting agent lacks an observation, reward, termination, truncation or
                next observation.
            MultiAgentError: ``step_output`` is not a 5-tuple; and every error of :meth:`add_step`.
        """
        try:
            next_obs, rewards, terms, truncs, _ = step_output
        except (TypeError, ValueError) as e:
            raise MultiAgentError("step_output must be parallel_env.step's 5-tuple") from e
        step = {}
        for a, act in actions.items():
            for what, d in (("observation", obs), ("reward", rewards), ("termination", terms),
                            ("truncation", truncs), ("next observation", next_obs)):  # fmt: skip
                if a not in d:
                    raise MissingAgent(f"agent {a!r} acted but has no {what}")
            step[a] = {
                "obs": obs[a],
                "action": act,
                "reward": rewards[a],
                "next_obs": next_obs[a],
                "terminated": bool(terms[a]),
                "truncated": bool(truncs[a]),
            }
        return self.add_step(step, stream=stream, state=state, priority=priority, timeout=timeout)

    def end_episode(self, streams: Any, truncated: bool = False) -> int:
        """Close the open episodes of ``streams`` (the table's ``end_episode``)."""
        return self.table.end_episode(streams, truncated=truncated)

    def _episode_end(self, row: dict, idx: np.ndarray) -> tuple[bool, bool]:
        _, _, tf, uf = self._names
        term = row[tf][idx].astype(bool) if tf in row else np.zeros(len(idx), bool)
        trunc = row[uf][idx].astype(bool) if uf in row else np.zeros(len(idx), bool)
        done = bool((term | trunc).all())
        return done and bool(term.all()), done and not bool(term.all())

    def _write_priority(self, row: dict, idx: np.ndarray, priority: Any) -> float | None:
        if self.priorities == "joint":
            return None if priority is None else float(check_priorities(priority, 1)[0])
        p = np.full(self.layout.n_agents, np.nan)
        if priority is None:
            p[idx] = self._max_priority
        elif isinstance(priority, Mapping):
            ai = self.layout.indices(list(priority))
            vals = check_priorities(list(priority.values()), len(ai))
            p[idx] = self._max_priority
            absent = np.setdiff1d(ai, idx)
            if len(absent):
                raise MultiAgentError(f"priorities given for agents absent from the step: {absent.tolist()}")
            p[ai] = vals
        else:
            p[idx] = check_priorities(priority, 1)[0]
        row[AGENT_PRIORITY] = p
        return float(step_mass(p[None], self.alpha)[0])
