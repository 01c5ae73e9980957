"""The buffer registry and the factories ``create_buffer`` / ``get_buffer_cls``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from ._config import CompatError, EasyDict


class Registry(dict):
    """A name -> class map with a decorator to fill it (DI-engine's ``Registry``).

    Registering a name twice raises :class:`CompatError` unless ``force_overwrite=True``.
    """

    def register(self, module_name: str, module: Any = None, force_overwrite: bool = False) -> Any:
        """Register ``module`` under ``module_name``; without ``module``, return a decorator."""

        def decorator(obj: Any) -> Any:
            if not force_overwrite and module_name in self and self[module_name] is not obj:
                raise CompatError(f"{module_name!r} is already registered (to {self[module_name]!r})")
            self[module_name] = obj
            return obj

        return decorator if module is None else decorator(module)

    def build(self, obj_type: str, *args: Any, **kwargs: Any) -> Any:
        """Instantiate the class registered as ``obj_type``.

        Raises:
            KeyError: ``obj_type`` is not registered.
        """
        return self._lookup(obj_type)(*args, **kwargs)

    def _lookup(self, obj_type: str) -> Any:
        if obj_type not in self:
            raise KeyError(f"not support buildable-object type: {obj_type!r}; registered: {sorted(self)}")
        return self[obj_type]


BUFFER_REGISTRY = Registry()


def _type_of(cfg: Any) -> str:
    """``cfg['type']``, after importing the modules of ``cfg['import_names']``."""
    if not isinstance(cfg, Mapping):
        raise TypeError(f"buffer config must be a dict or EasyDict, got {type(cfg).__name__}")
    if "type" not in cfg:
        raise KeyError("buffer config has no 'type' (one of: " + ", ".join(sorted(BUFFER_REGISTRY)) + ")")
    for name in cfg.get("import_names", None) or []:
        importlib.import_module(name)
    return cfg["type"]


def create_buffer(cfg: Mapping, *args: Any, **kwargs: Any) -> Any:
    """Build the buffer named by ``cfg['type']`` with ``(cfg, *args, **kwargs)``.

    Modules listed in ``cfg['import_names']`` are imported first (so they can register buffers).
    As in DI-engine, a ``'naive'`` buffer is built without the ``tb_logger`` keyword.
    """
    cfg = cfg if isinstance(cfg, EasyDict) else EasyDict(cfg) if isinstance(cfg, Mapping) else cfg
    buffer_type = _type_of(cfg)
    if buffer_type == "naive":
        kwargs.pop("tb_logger", None)
    return BUFFER_REGISTRY.build(buffer_type, cfg, *args, **kwargs)


def get_buffer_cls(cfg: Mapping) -> Callable[..., Any]:
    """The class registered as ``cfg['type']`` (after importing ``cfg['import_names']``)."""
    return BUFFER_REGISTRY._lookup(_type_of(cfg))
