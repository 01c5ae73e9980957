"""The dashboard's HTTP server: a static page, its JSON API and Prometheus ``/metrics``.

Routes (GET): ``/`` the page, ``/static/<file>`` its script and style (files of this package,
no build step, nothing fetched from the internet), ``/api/points?since=<seq>`` the recorder's
points after ``seq`` (JSON), ``/api/info`` the source's kind, name, period and last raw snapshot,
``/metrics`` the Prometheus exposition (503 with a message without ``prometheus_client``).

The server runs on daemon threads (``ThreadingHTTPServer``) and only reads the recorder, so a
slow browser never delays the table.
"""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from ...errors import PortInUse
from ..series import Recorder

STATIC = Path(__file__).with_name("static")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css"}


def _clean(value: Any) -> Any:
    """``value`` with NaN and infinities as ``None`` (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return _clean(value.item())
    return value


def _handler(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "replaystore-dashboard"

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet: no line per poll
            pass

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, obj: Any) -> None:
            self._send(200, json.dumps(_clean(obj)).encode(), "application/json")

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            url = urlparse(self.path)
            path = url.path
            try:
                if path in ("/", "/index.html"):
                    self._file("index.html")
                elif path.startswith("/static/"):
                    self._file(path[len("/static/") :])
                elif path == "/api/points":
                    since = int(parse_qs(url.query).get("since", ["0"])[0])
                    points = recorder.points(since)
                    self._json({"period": recorder.effective_period, "seq": recorder.seq, "points": points})
                elif path == "/api/info":
                    src = recorder.source
                    self._json(
                        {"kind": src.kind, "name": src.name, "period": recorder.period, "snapshot": recorder.latest()}
                    )
                elif path == "/metrics":
                    self._metrics()
                else:
                    self._send(404, b"not found\n", "text/plain")
            except (BrokenPipeError, ConnectionResetError):
                pass
            except ValueError as e:
                self._send(400, f"bad request: {e}\n".encode(), "text/plain")
            except Exception as e:  # noqa: BLE001 - an answer, not a traceback on the console
                self._send(500, f"{type(e).__name__}: {e}\n".encode(), "text/plain")

        def _file(self, name: str) -> None:
            f = (STATIC / name).resolve()
            if f.parent != STATIC.resolve() or not f.is_file():
                self._send(404, b"not found\n", "text/plain")
                return
            self._send(200, f.read_bytes(), _TYPES.get(f.suffix, "application/octet-stream"))

        def _metrics(self) -> None:
            try:
                from ..prometheus import metrics_text

                body = metrics_text(recorder)
            except ImportError as e:
                self._send(503, f"{e}\n".encode(), "text/plain")
                return
            self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")

    return Handler


class DashboardServer:
    """Serves the dashboard of ``recorder`` on ``host:port`` until :meth:`close`.

    Args:
        recorder: a started :class:`~replaystore.metrics.Recorder`.
        host: the address to bind (default loopback only).
        port: the port; ``0`` picks a free one (see :attr:`port`, :attr:`url`).

    Raises:
        PortInUse: another process listens on ``port``.
    """

    def __init__(self, recorder: Recorder, host: str = "127.0.0.1", port: int = 8765) -> None:
        self.recorder = recorder
        try:
            self._httpd = ThreadingHTTPServer((host, port), _handler(recorder))
        except OSError as e:
            raise PortInUse(
                f"the dashboard cannot listen on {host}:{port}: {e.strerror or e} (pass another --port, or 0 for any)"
            ) from None
        self._httpd.daemon_threads = True
        self.host = host
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="replaystore-dashboard", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The page's address, ``http://host:port/``."""
        return f"http://{self.host}:{self.port}/"

    def close(self) -> None:
        """Stop serving (the recorder is left to its owner). Idempotent."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(5.0)
        self._httpd.server_close()
