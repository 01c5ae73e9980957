"""UniformDistinct lives in :mod:`replaystore.samplers.uniform_distinct` (layer 2); re-exported here."""

from __future__ import annotations

from ..samplers.uniform_distinct import UniformDistinct

__all__ = ["UniformDistinct"]
