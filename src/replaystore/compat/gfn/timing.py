"""Timing instrumentation, as torchgfn's ``Timer``: durations appended to ``dict[key]``."""

from __future__ import annotations

import time
from types import TracebackType


class Timer:
    """Context manager that appends the elapsed seconds to ``data[key]`` when ``enabled``."""

    __slots__ = ("data", "key", "enabled", "_start")

    def __init__(self, data: dict[str, list[float]], key: str, enabled: bool = True) -> None:
        self.data = data
        self.key = key
        self.enabled = enabled
        self._start = 0.0

    def __enter__(self) -> Timer:
        if self.enabled:
            self._start = time.perf_counter()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.enabled:
            self.data.setdefault(self.key, []).append(time.perf_counter() - self._start)


def format_timing(data: dict[str, list[float]], extra_lines: list[str] | None = None) -> str:
    """Total, count and mean per key; ``send_bytes`` in MB and the effective send bandwidth."""
    lines = []
    for key in sorted(data):
        values = data[key]
        if key == "send_bytes":
            lines.append(f"{key}: {sum(values) / 1e6:.3f} MB over {len(values)} sends")
            continue
        total = sum(values)
        mean = total / len(values) if values else 0.0
        lines.append(f"{key}: total {total:.4f}s, count {len(values)}, mean {mean * 1e3:.3f}ms")
    sent = sum(data.get("send_bytes", []))
    send_time = sum(data.get("send_data", []))
    if sent and send_time > 0:
        lines.append(f"effective_send_bandwidth: {sent / 1e6 / send_time:.1f} MB/s")
    lines.extend(extra_lines or [])
    return "\n".join(lines)
