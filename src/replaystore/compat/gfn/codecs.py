"""Codecs: turn a container into batch-first tensors and back.

A codec lets a buffer keep a container type in a preallocated tensor store indexed by slot
(:mod:`replaystore.compat.gfn.store`) and send it to a manager as plain arrays. Every field is a
tensor whose axis 0 is the item; *ragged* fields (``Codec.ragged``) are padded as torchgfn
pads trajectories. The types with a codec, and the others: docs/compat/gfn.md, "How it is built"
(:func:`codec_for` returns ``None`` for the others).

The stale per-sample fields ``log_probs`` and ``estimator_outputs`` are never encoded.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch

from .containers import TensorContainer

Fields = dict[str, torch.Tensor]

#: kinds whose log-rewards are per item (Transitions have ``-inf`` on non-terminal rows)
_KIND_TENSOR = "replaystore.TensorContainer"
_KIND_TRAJ = "gfn.Trajectories"
_KIND_TRANS = "gfn.Transitions"
_KIND_STATES = "gfn.StatesContainer"


class Codec:
    """Base class: see the module docstring. Subclasses set ``kind`` and implement the methods."""

    kind: str = ""
    #: whether ``log_rewards`` is one value per item (baseline filtering and scoring-only need it)
    per_item_rewards: bool = True
    #: ragged fields: name -> fill value (a tensor broadcastable to one time step of the field)
    ragged: dict[str, torch.Tensor] = {}

    def matches(self, container: Any) -> bool:
        """Whether ``container`` is of this codec's type."""
        raise NotImplementedError

    def encode(self, container: Any) -> Fields:
        """Batch-first tensors of the container (shared with it, not copied)."""
        raise NotImplementedError

    def decode(self, fields: Mapping[str, torch.Tensor]) -> Any:
        """A new container from (gathered) fields."""
        raise NotImplementedError

    def empty(self) -> Any:
        """An empty container of this type."""
        raise NotImplementedError

    def terminal_fields(self, fields: Fields) -> tuple[str, Fields]:
        """``(kind, fields)`` of a states container: terminating states and their log-rewards."""
        raise NotImplementedError

    def diversity_repr(self, fields: Fields) -> torch.Tensor:
        """``(n, d)`` float tensor of terminating states (conditions concatenated)."""
        raise NotImplementedError

    def to_file(self, container: Any) -> dict[str, torch.Tensor]:
        """The tensors :meth:`from_file` reads back (torchgfn's ``.pt`` layout; default :meth:`encode`)."""
        return self.encode(container)

    def from_file(self, raw: Mapping[str, torch.Tensor]) -> Any:
        """The container saved by :meth:`to_file` (default: :meth:`decode`)."""
        return self.decode(raw)


def flat_repr(states: torch.Tensor, conditions: torch.Tensor | None) -> torch.Tensor:
    """``(n, d)`` vectors of states (flattened, in the default float dtype), conditions concatenated."""
    n = int(states.shape[0])
    out = states.reshape(n, -1).to(torch.get_default_dtype())
    if conditions is not None:
        out = torch.cat([out, conditions.reshape(n, -1).to(out.dtype)], dim=-1)
    return out


class TensorContainerCodec(Codec):
    """Codec of the built-in :class:`TensorContainer`."""

    kind = _KIND_TENSOR

    def matches(self, container: Any) -> bool:  # noqa: D102
        return type(container) is TensorContainer

    def encode(self, container: TensorContainer) -> Fields:  # noqa: D102
        fields = container.to_dict()
        fields.pop("log_probs", None)
        fields.pop("estimator_outputs", None)
        return fields

    def decode(self, fields: Mapping[str, torch.Tensor]) -> TensorContainer:  # noqa: D102
        return TensorContainer.from_dict(fields)

    def empty(self) -> TensorContainer:  # noqa: D102
        return TensorContainer(torch.empty(0, 0))

    def terminal_fields(self, fields: Fields) -> tuple[str, Fields]:  # noqa: D102
        return self.kind, fields

    def diversity_repr(self, fields: Fields) -> torch.Tensor:  # noqa: D102
        return flat_repr(fields["states"], fields.get("conditions"))


# -- torchgfn ------------------------------------------------------------------------------------------
def _gfn_containers() -> Any | None:
    """``gfn.containers`` if torchgfn is already imported (a gfn container exists), else ``None``."""
    if "gfn" not in sys.modules:
        return None
    try:
        import gfn.containers as gc
    except Exception:  # pragma: no cover - a broken torchgfn install
        return None
    return gc


def _require_gfn() -> Any:
    try:
        import gfn.containers as gc
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("torchgfn is needed for its container types: pip install torchgfn") from exc
    return gc


class _GfnCodec(Codec):
    cls_name = ""

    def __init__(self, env: Any, is_backward: bool = False) -> None:
        self.env = env
        self.is_backward = bool(is_backward)
        self.cls = getattr(_require_gfn(), self.cls_name)

    def matches(self, container: Any) -> bool:  # noqa: D102
        return type(container) is self.cls and bool(getattr(container, "is_backward", False)) == self.is_backward

    def _states(self, tensor: torch.Tensor, conditions: torch.Tensor | None) -> Any:
        states = self.env.states_from_tensor(tensor)
        if conditions is not None:
            states.conditions = conditions
        return states

    def empty(self) -> Any:  # noqa: D102
        if self.cls_name == "StatesContainer":
            return self.cls(self.env)
        return self.cls(self.env, is_backward=self.is_backward)

    def to_file(self, container: Any) -> dict[str, torch.Tensor]:  # noqa: D102
        return dict(container.to_tensordict().to_dict())

    def from_file(self, raw: Mapping[str, torch.Tensor]) -> Any:  # noqa: D102
        from tensordict import TensorDict

        return self.cls.from_tensordict(self.env, TensorDict(dict(raw), batch_size=[]))

    def diversity_repr(self, fields: Fields) -> torch.Tensor:  # noqa: D102
        if not bool(fields["is_terminating"].all()):
            raise ValueError(
                f"the diverse buffer needs one terminating state per item, not {self.cls_name} with "
                "non-terminating rows"
            )
        return flat_repr(fields["states"], fields.get("states_conditions"))


class GfnTrajectoriesCodec(_GfnCodec):
    """torchgfn ``Trajectories``: states ``(T+1, B)`` and actions ``(T, B)`` stored batch-first."""

    kind = _KIND_TRAJ
    cls_name = "Trajectories"

    def __init__(self, env: Any, is_backward: bool = False) -> None:
        super().__init__(env, is_backward)
        self.ragged = {
            "states": torch.as_tensor(env.sf),
            "actions": torch.as_tensor(env.dummy_action),
            "states_conditions": torch.tensor(float("-inf")),
        }

    def encode(self, c: Any) -> Fields:  # noqa: D102
        fields: Fields = {
            "states": c.states.tensor.transpose(0, 1),
            "actions": c.actions.tensor.transpose(0, 1),
            "terminating_idx": c.terminating_idx,
        }
        lr = c.log_rewards
        if lr is not None:
            fields["log_rewards"] = lr
        cond = c.states.conditions
        if cond is not None:
            fields["states_conditions"] = cond.transpose(0, 1)
        return fields

    def decode(self, fields: Mapping[str, torch.Tensor]) -> Any:  # noqa: D102
        tidx = fields["terminating_idx"]
        if len(tidx) == 0:
            return self.empty()
        t = int(tidx.max())
        states = fields["states"][:, : t + 1].transpose(0, 1).contiguous()
        actions = fields["actions"][:, :t].transpose(0, 1).contiguous()
        cond = fields.get("states_conditions")
        if cond is not None:
            cond = cond[:, : t + 1].transpose(0, 1).contiguous()
        return self.cls(
            env=self.env,
            states=self._states(states, cond),
            actions=self.env.actions_from_tensor(actions),
            terminating_idx=tidx,
            is_backward=self.is_backward,
            log_rewards=fields.get("log_rewards"),
        )

    def _terminal_rows(self, fields: Fields, name: str) -> torch.Tensor:
        tidx = fields["terminating_idx"]
        return fields[name][torch.arange(len(tidx), device=tidx.device), tidx - 1]

    def terminal_fields(self, fields: Fields) -> tuple[str, Fields]:  # noqa: D102
        lr = fields.get("log_rewards")
        if lr is None:
            raise ValueError("scoring_only needs log_rewards of shape (n,) (backward trajectories have none)")
        states = self._terminal_rows(fields, "states")
        out: Fields = {
            "states": states,
            "is_terminating": torch.ones(len(states), dtype=torch.bool, device=states.device),
            "log_rewards": lr,
        }
        if "states_conditions" in fields:
            out["states_conditions"] = self._terminal_rows(fields, "states_conditions")
        return _KIND_STATES, out

    def diversity_repr(self, fields: Fields) -> torch.Tensor:  # noqa: D102
        cond = self._terminal_rows(fields, "states_conditions") if "states_conditions" in fields else None
        return flat_repr(self._terminal_rows(fields, "states"), cond)


class GfnTransitionsCodec(_GfnCodec):
    """torchgfn ``Transitions`` (all fields are already batch-first)."""

    kind = _KIND_TRANS
    cls_name = "Transitions"
    per_item_rewards = False

    def encode(self, c: Any) -> Fields:  # noqa: D102
        fields: Fields = {
            "states": c.states.tensor,
            "actions": c.actions.tensor,
            "is_terminating": c.is_terminating,
            "next_states": c.next_states.tensor,
        }
        lr = c.log_rewards
        if lr is not None:
            fields["log_rewards"] = lr
        if c.states.conditions is not None:
            fields["states_conditions"] = c.states.conditions
        if c.next_states.conditions is not None:
            fields["next_states_conditions"] = c.next_states.conditions
        return fields

    def decode(self, fields: Mapping[str, torch.Tensor]) -> Any:  # noqa: D102
        return self.cls(
            env=self.env,
            states=self._states(fields["states"], fields.get("states_conditions")),
            actions=self.env.actions_from_tensor(fields["actions"]),
            is_terminating=fields["is_terminating"],
            next_states=self._states(fields["next_states"], fields.get("next_states_conditions")),
            is_backward=self.is_backward,
            log_rewards=fields.get("log_rewards"),
        )

    def terminal_fields(self, fields: Fields) -> tuple[str, Fields]:  # noqa: D102
        raise ValueError("scoring_only supports Trajectories or StatesContainer only, not Transitions")


class GfnStatesContainerCodec(_GfnCodec):
    """torchgfn ``StatesContainer``."""

    kind = _KIND_STATES
    cls_name = "StatesContainer"

    def __init__(self, env: Any, is_backward: bool = False) -> None:
        super().__init__(env, False)  # (states containers have no direction: matches() then checks the type)

    def encode(self, c: Any) -> Fields:  # noqa: D102
        fields: Fields = {"states": c.states.tensor, "is_terminating": c.is_terminating, "log_rewards": c.log_rewards}
        if c.states.conditions is not None:
            fields["states_conditions"] = c.states.conditions
        return fields

    def decode(self, fields: Mapping[str, torch.Tensor]) -> Any:  # noqa: D102
        return self.cls(
            env=self.env,
            states=self._states(fields["states"], fields.get("states_conditions")),
            is_terminating=fields["is_terminating"],
            log_rewards=fields.get("log_rewards"),
        )

    def terminal_fields(self, fields: Fields) -> tuple[str, Fields]:  # noqa: D102
        mask = fields["is_terminating"]
        return self.kind, {k: v[mask] for k, v in fields.items()}


_GFN_CODECS: dict[str, type[_GfnCodec]] = {
    "Trajectories": GfnTrajectoriesCodec,
    "Transitions": GfnTransitionsCodec,
    "StatesContainer": GfnStatesContainerCodec,
}
_KIND_TO_GFN = {c.kind: c for c in _GFN_CODECS.values()}


def codec_for(container: Any, env: Any) -> Codec | None:
    """The codec of ``container``'s type, or ``None`` (store the container itself)."""
    if type(container) is TensorContainer:
        return TensorContainerCodec()
    gc = _gfn_containers()
    if gc is None:
        return None
    for name, codec_cls in _GFN_CODECS.items():
        if type(container) is getattr(gc, name, None):
            states = container.states
            if not isinstance(getattr(states, "tensor", None), torch.Tensor):
                return None  # graph states and other non-tensor states
            if env is None:
                env = getattr(container, "env", None)
            return codec_cls(env, bool(getattr(container, "is_backward", False)))
    return None


def codec_by_kind(kind: str, env: Any, is_backward: bool = False) -> Codec:
    """The codec named ``kind`` (as in :attr:`Codec.kind`); ``ValueError`` for an unknown kind."""
    if kind == _KIND_TENSOR:
        return TensorContainerCodec()
    if kind in _KIND_TO_GFN:
        return _KIND_TO_GFN[kind](env, is_backward)
    raise ValueError(f"unknown container kind {kind!r}")


def infer_file_kind(raw: Mapping[str, Any]) -> str:
    """Guess the container kind of a ``.pt`` file written by torchgfn (no kind recorded)."""
    if "terminating_idx" in raw:
        return _KIND_TRAJ
    if "next_states" in raw:
        return _KIND_TRANS
    if "is_terminating" in raw:
        return _KIND_STATES
    return _KIND_TENSOR
