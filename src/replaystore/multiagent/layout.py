"""One environment step as one table row: every agent's fields stacked on an agent axis.

A multi-agent table stores a row per environment step. Each per-agent field ``f`` of shape ``S``
becomes a column of shape ``(A, *S)`` (``A``: the number of agents the table knows), with the
agents absent from the step zero-filled; ``alive`` (bool ``(A,)``) says which agents acted, and
global fields (the environment state) are stored once per step with their own shape.
:class:`AgentLayout` turns a step given per agent (a dict per agent, PettingZoo's dicts) into
that row, or names what is wrong with it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import AgentShapeMismatch, InvalidArgument, MissingAgent, MultiAgentError, UnknownAgent

ALIVE = "alive"
AGENT_PRIORITY = "agent_priority"
RESERVED = (ALIVE, AGENT_PRIORITY)

FieldSpecs = dict[str, tuple[tuple[int, ...], np.dtype]]


def _as_specs(fields: Mapping[str, Any] | None, what: str) -> FieldSpecs | None:
    if fields is None:
        return None
    out: FieldSpecs = {}
    for name, spec in fields.items():
        if not isinstance(name, str) or not name or name in RESERVED:
            raise InvalidArgument(f"{what} field name {name!r} is empty, not a string or reserved ({RESERVED})")
        try:
            shape, dtype = spec
            out[name] = (tuple(int(d) for d in shape), np.dtype(dtype))
        except (TypeError, ValueError) as e:
            raise InvalidArgument(f"{what} field {name!r}: expected (shape, dtype), got {spec!r}") from e
    return out


class AgentLayout:
    """The agents of a multi-agent table and the shapes of their fields (learnt or given).

    Args:
        agents: the agent ids, in the order of the agent axis (PettingZoo: ``env.possible_agents``).
            Any hashable ids; unique; at least one.
        required: agents every step must contain (:class:`~replaystore.MissingAgent` otherwise).
        fields: per-agent field specs ``{name: (shape, dtype)}`` of one agent; ``None``: learnt from
            the first step written through this layout.
        global_fields: the same for global fields (stored once per step); ``None``: learnt.

    Not thread-safe on its own: :class:`~replaystore.multiagent.MultiAgentTable` calls it under
    its lock.
    """

    def __init__(
        self,
        agents: Sequence[Hashable],
        required: Sequence[Hashable] = (),
        fields: Mapping[str, Any] | None = None,
        global_fields: Mapping[str, Any] | None = None,
    ) -> None:
        agents = tuple(agents)
        if not agents:
            raise InvalidArgument("a multi-agent table needs at least one agent")
        if len(set(agents)) != len(agents):
            raise InvalidArgument(f"agent ids must be unique, got {agents!r}")
        self.agents = agents
        self.index = {a: i for i, a in enumerate(agents)}
        self.required = self.indices(required)
        self.fields = _as_specs(fields, "agent")
        self.global_fields = _as_specs(global_fields, "global")
        if self.fields is not None and self.global_fields is not None:
            both = set(self.fields) & set(self.global_fields)
            if both:
                raise InvalidArgument(f"fields {sorted(both)} are both per-agent and global")

    @property
    def n_agents(self) -> int:
        """The size of the agent axis."""
        return len(self.agents)

    def indices(self, agents: Any) -> np.ndarray:
        """Agent ids (or, for integer agent axes, positions) -> int64 positions on the agent axis.

        Raises:
            UnknownAgent: an id that is not one of the table's agents.
        """
        if isinstance(agents, np.ndarray) and agents.dtype.kind in "iu" and not self._int_ids():
            out = agents.astype(np.int64)
            bad = (out < 0) | (out >= self.n_agents)
            if bad.any():
                raise UnknownAgent(f"agent positions {out[bad][:5].tolist()} outside [0, {self.n_agents})")
            return out
        out = np.empty(len(agents), np.int64)
        for j, a in enumerate(agents):
            i = self.index.get(a.item() if isinstance(a, np.generic) else a)
            if i is None:
                raise UnknownAgent(f"agent {a!r} is not one of the table's agents {self.agents!r}")
            out[j] = i
        return out

    def _int_ids(self) -> bool:
        return all(isinstance(a, (int, np.integer)) for a in self.agents)

    def spec(self, agent_priorities: bool = False) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """The table's row spec (for tables sized up front, e.g. ``SharedTable.create``).

        Raises:
            MultiAgentError: the field specs were not given and no step was written yet.
        """
        if self.fields is None or self.global_fields is None:
            raise MultiAgentError("the row spec needs fields= and global_fields= (or a first step written)")
        a = self.n_agents
        out = {name: ((a, *shape), dtype) for name, (shape, dtype) in self.fields.items()}
        out.update(self.global_fields)
        out[ALIVE] = ((a,), np.dtype(bool))
        if agent_priorities:
            out[AGENT_PRIORITY] = ((a,), np.dtype(np.float64))
        return out

    def pack(
        self, step: Mapping[Hashable, Mapping[str, Any]], global_values: Mapping[str, Any] | None
    ) -> tuple[dict[str, np.ndarray], np.ndarray, FieldSpecs, FieldSpecs]:
        """Build the row of one environment step; change nothing.

        Returns:
            ``(row, idx, fields, global_fields)``: the row's columns (``alive`` included), the
            positions of the agents present, and the field specs it implies (commit them with
            :meth:`learn` once the row is stored).

        Raises:
            MultiAgentError: no agent, agents with different field names, a field named like a
                reserved column or a global field, a field missing against the known ones.
            UnknownAgent: an agent id that is not one of the table's.
            MissingAgent: a required agent is absent.
            AgentShapeMismatch: agents give a field different shapes, or a value does not fit the
                known spec (shape, or a dtype that does not cast ``same_kind``).
        """
        if not isinstance(step, Mapping) or not step:
            raise MultiAgentError("a step needs at least one agent: a non-empty dict {agent: {field: value}}")
        ids = list(step)
        idx = self.indices(ids)
        if len(self.required):
            missing = np.setdiff1d(self.required, idx)
            if len(missing):
                raise MissingAgent(f"the step lacks required agents {[self.agents[i] for i in missing]!r}")
        names = None
        for a in ids:
            fields = step[a]
            if not isinstance(fields, Mapping) or not fields:
                raise MultiAgentError(f"agent {a!r}: expected a non-empty dict of fields, got {type(fields).__name__}")
            if names is None:
                names = set(fields)
            elif set(fields) != names:
                raise MultiAgentError(f"agents give different fields: {sorted(names)} vs {a!r}: {sorted(fields)}")
        assert names is not None
        for name in names:
            if not isinstance(name, str) or name in RESERVED:
                raise MultiAgentError(f"field name {name!r} is not a string or is reserved ({RESERVED})")
        if self.fields is not None and names != set(self.fields):
            raise MultiAgentError(f"the step's fields {sorted(names)} differ from the table's {sorted(self.fields)}")
        global_values = dict(global_values or {})
        if self.global_fields is not None and set(global_values) != set(self.global_fields):
            raise MultiAgentError(
                f"global fields {sorted(global_values)} differ from the table's {sorted(self.global_fields)}"
            )
        clash = names & set(global_values)
        if clash:
            raise MultiAgentError(f"fields {sorted(clash)} given both per agent and globally")
        a_n = self.n_agents
        row: dict[str, np.ndarray] = {}
        fields_out: FieldSpecs = {}
        for name in sorted(names):
            values = [np.asarray(step[a][name]) for a in ids]
            shapes = {v.shape for v in values}
            if len(shapes) != 1:
                raise AgentShapeMismatch(f"field {name!r}: agents give shapes {sorted(shapes)}")
            shape = values[0].shape
            known = self.fields.get(name) if self.fields is not None else None
            dtype = _dtype(name, values, known, shape)
            col = np.zeros((a_n, *shape), dtype)
            col[idx] = np.stack(values).astype(dtype, copy=False)
            row[name] = col
            fields_out[name] = (shape, dtype)
        globals_out: FieldSpecs = {}
        for name, value in global_values.items():
            if not isinstance(name, str) or name in RESERVED:
                raise MultiAgentError(f"global field name {name!r} is not a string or is reserved ({RESERVED})")
            v = np.asarray(value)
            known = self.global_fields.get(name) if self.global_fields is not None else None
            dtype = _dtype(name, [v], known, v.shape)
            row[name] = v.astype(dtype, copy=False)
            globals_out[name] = (v.shape, dtype)
        alive = np.zeros(a_n, bool)
        alive[idx] = True
        row[ALIVE] = alive
        return row, idx, fields_out, globals_out

    def learn(self, fields: FieldSpecs, global_fields: FieldSpecs) -> None:
        """Record the field specs of a step that was stored (the first one fixes them)."""
        if self.fields is None:
            self.fields = dict(fields)
        if self.global_fields is None:
            self.global_fields = dict(global_fields)


def _dtype(name: str, values: list[np.ndarray], known: Any, shape: tuple[int, ...]) -> np.dtype:
    if known is None:
        return np.result_type(*values)
    kshape, kdtype = known
    if shape != kshape:
        raise AgentShapeMismatch(f"field {name!r}: shape {shape} differs from the table's {kshape}")
    for v in values:
        if not np.can_cast(v.dtype, kdtype, casting="same_kind"):
            raise AgentShapeMismatch(f"field {name!r}: dtype {v.dtype} does not cast to the table's {kdtype}")
    return kdtype
