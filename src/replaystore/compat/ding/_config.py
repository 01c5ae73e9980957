"""Configuration helpers: an EasyDict work-alike, deep merging, and the compat error type."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


class CompatError(ValueError, AssertionError):
    """Raised where DI-engine used ``assert`` to reject an argument.

    It derives from both ``ValueError`` (what the check means) and ``AssertionError`` (what
    DI-engine raised), so code written against either keeps working, and the check does not vanish
    under ``python -O`` as an ``assert`` would.
    """


def _convert(value: Any) -> Any:
    if isinstance(value, Mapping) and not isinstance(value, EasyDict):
        return EasyDict(value)
    if isinstance(value, list):
        return [_convert(v) for v in value]
    return value


class EasyDict(dict):
    """A dict whose keys are also attributes, recursively (like the ``easydict`` package).

    ``cfg.replay_buffer_size`` and ``cfg['replay_buffer_size']`` are the same entry; nested dicts
    (also inside lists) become ``EasyDict`` when stored. Reading a missing attribute raises
    ``AttributeError``.
    """

    def __init__(self, d: Mapping | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.update({} if d is None else d, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, _convert(value))

    def update(self, *args: Any, **kwargs: Any) -> None:  # noqa: D102
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def setdefault(self, key: Any, default: Any = None) -> Any:  # noqa: D102
        if key not in self:
            self[key] = default
        return self[key]

    def copy(self) -> EasyDict:  # noqa: D102
        return EasyDict(self)

    def __deepcopy__(self, memo: dict) -> EasyDict:
        out = EasyDict()
        memo[id(self)] = out
        for k, v in self.items():
            dict.__setitem__(out, copy.deepcopy(k, memo), copy.deepcopy(v, memo))
        return out

    def __reduce__(self) -> tuple:
        return (EasyDict, (dict(self),))


def deep_merge_dicts(original: Mapping, new_dict: Mapping | None) -> EasyDict:
    """A deep copy of ``original`` updated recursively with ``new_dict`` (DI-engine's helper).

    Nested mappings are merged key by key; every other value in ``new_dict`` replaces the original.
    Neither argument is modified.
    """
    merged = EasyDict(copy.deepcopy(dict(original)))
    if new_dict:
        _merge_into(merged, new_dict)
    return merged


def _merge_into(target: EasyDict, new: Mapping) -> None:
    for k, v in new.items():
        if isinstance(v, Mapping) and isinstance(target.get(k), Mapping):
            _merge_into(target[k], v)  # (an EasyDict: setting a mapping converts it)
        else:
            target[k] = copy.deepcopy(v)
