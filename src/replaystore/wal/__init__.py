"""The write-ahead log and the logged table (no Ray: the Ray service uses them for ``serve(wal=...)``).

- :mod:`replaystore.wal.log`: :class:`WriteAheadLog`, the group-commit writer;
- :mod:`replaystore.wal.format`: one record's bytes; :mod:`replaystore.wal.files`: segments, and
  reading them back with recovery; :mod:`replaystore.wal.config`: :class:`WalConfig`;
- :mod:`replaystore.wal.logged`: :class:`LoggedTable`, a Table whose every write is logged first.
"""

from .config import WalConfig
from .log import WriteAheadLog
from .logged import LoggedTable

__all__ = ["LoggedTable", "WalConfig", "WriteAheadLog"]
