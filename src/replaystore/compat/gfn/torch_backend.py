"""The torch.distributed backend: the manager is a rank, trainers talk to it point-to-point.

A message is a header ``int64[2] = (type, json_length)``, a JSON description, then one raw tensor
per field, on the tags below; timeouts under gloo: docs/compat/gfn.md, "The remote buffer".
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import torch
import torch.distributed as dist

from .timing import Timer
from .wire import encode, from_wire

TAG_DATA, TAG_SCORE, TAG_META = 0, 1, 2
MSG_DATA, MSG_EXIT, MSG_METADATA, MSG_BASELINE_SYNC, MSG_SHUTDOWN, MSG_REPLY = 1, 2, 3, 4, 5, 6


def _wait(work: Any, timeout: float | None, what: str) -> None:
    try:
        if timeout is None:
            work.wait()
        else:
            work.wait(timeout=datetime.timedelta(seconds=timeout))
    except RuntimeError as exc:
        if "imeout" in str(exc) or "unbound_buffer" in str(exc):
            raise TimeoutError(f"torch.distributed {what} did not complete within {timeout}s") from exc
        raise


def _send(tensor: torch.Tensor, dst: int, tag: int, timeout: float | None) -> None:
    _wait(dist.isend(tensor.contiguous(), dst=dst, tag=tag), timeout, f"send to rank {dst}")


def _recv(tensor: torch.Tensor, src: int | None, tag: int, timeout: float | None) -> int:
    work = dist.irecv(tensor, src=src, tag=tag)
    _wait(work, timeout, "receive" if src is None else f"receive from rank {src}")
    return int(work._source_rank()) if src is None else src


def _send_json(obj: Any, msg_type: int, dst: int, tag: int, timeout: float | None) -> int:
    payload = json.dumps(obj).encode() if obj is not None else b""
    _send(torch.tensor([msg_type, len(payload)], dtype=torch.int64), dst, tag, timeout)
    if payload:
        _send(torch.frombuffer(bytearray(payload), dtype=torch.uint8), dst, tag, timeout)
    return len(payload)


def _recv_json(src: int, length: int, tag: int, timeout: float | None) -> Any:
    if length == 0:
        return None
    buf = torch.empty(length, dtype=torch.uint8)
    _recv(buf, src, tag, timeout)
    return json.loads(bytes(buf.numpy()).decode())


def _encode(container: Any, env: Any) -> tuple[dict, list[torch.Tensor]]:
    encoded = encode(container, env)
    if encoded is None:
        raise TypeError(f"the torch backend sends containers with a codec only, not {type(container).__name__}")
    header, fields = encoded
    header["fields"] = [[name, str(t.dtype).replace("torch.", ""), list(t.shape)] for name, t in fields.items()]
    return header, [t.to(torch.uint8) if t.dtype == torch.bool else t.contiguous() for t in fields.values()]


def _recv_container(header: dict, src: int, env: Any, timeout: float | None) -> tuple[Any, int]:
    fields, nbytes = {}, 0
    for name, dtype, shape in header["fields"]:
        want = getattr(torch, dtype)
        buf = torch.empty(shape, dtype=torch.uint8 if want == torch.bool else want)
        _recv(buf, src, TAG_DATA, timeout)
        nbytes += buf.numel() * buf.element_size()
        fields[name] = buf.to(torch.bool) if want == torch.bool else buf
    return from_wire({**header, "fields": fields}, env), nbytes


def serve(core: Any, idle_timeout: float | None = None) -> dict[str, Any]:
    """The manager rank's loop: handle messages until every trainer said goodbye (or shutdown)."""
    head = torch.empty(2, dtype=torch.int64)
    while core.is_running:
        with Timer(core.timing_data, "recv", core.timing):
            try:
                src = _recv(head, None, TAG_DATA, idle_timeout)
            except TimeoutError:
                core.stop()
                break
            msg_type, length = int(head[0]), int(head[1])
            body = _recv_json(src, length, TAG_DATA, None)
        if msg_type == MSG_DATA:
            container, nbytes = _recv_container(body, src, core.env, None)
            score = core.handle_data(container, src, nbytes)
            with Timer(core.timing_data, "send", core.timing):
                _send_json(score, MSG_REPLY, src, TAG_SCORE, None)
        elif msg_type == MSG_EXIT:
            core.handle_exit(src)
        elif msg_type == MSG_METADATA:
            _send_json(core.compute_metadata(), MSG_REPLY, src, TAG_META, None)
        elif msg_type == MSG_BASELINE_SYNC:
            core.handle_baseline_sync(body)
        elif msg_type == MSG_SHUTDOWN:
            core.stop()
        else:
            raise ValueError(f"manager rank {core.rank} received unknown message type {msg_type}")
    return core.summary()


def send_exit(manager_rank: int, timeout: float | None = 60.0) -> None:
    """Say goodbye to the manager at ``manager_rank``."""
    _send_json(None, MSG_EXIT, manager_rank, TAG_DATA, timeout)


def send_shutdown(manager_rank: int, timeout: float | None = 60.0) -> None:
    """Ask the manager at ``manager_rank`` to stop now."""
    _send_json(None, MSG_SHUTDOWN, manager_rank, TAG_DATA, timeout)


def send_baseline_sync(manager_rank: int, value: float, timeout: float | None = 60.0) -> None:
    """Send ``{"global_baseline_log_reward": value}`` to a manager."""
    _send_json({"global_baseline_log_reward": float(value)}, MSG_BASELINE_SYNC, manager_rank, TAG_DATA, timeout)


def request_metadata(manager_rank: int, timeout: float | None = 60.0) -> dict:
    """The manager's metadata (reply on its own tag, never mixed with a pending score)."""
    _send_json(None, MSG_METADATA, manager_rank, TAG_DATA, timeout)
    head = torch.empty(2, dtype=torch.int64)
    _recv(head, manager_rank, TAG_META, timeout)
    return _recv_json(manager_rank, int(head[1]), TAG_META, timeout)


class TorchTrainerTransport:
    """Trainer side of the torch backend (one per buffer)."""

    def __init__(self, manager_rank: int, buffer: Any) -> None:
        if not dist.is_initialized():
            raise RuntimeError("communication_backend='torch' needs an initialised torch.distributed process group")
        self.manager = int(manager_rank)
        self.buffer = buffer
        self._works: list[Any] = []
        self._keep: list[torch.Tensor] = []
        self._said_goodbye = False

    def _wait_previous_send(self, timeout: float) -> None:
        with Timer(self.buffer.timing_data, "wait_previous_send", self.buffer.timing):
            for w in self._works:
                _wait(w, timeout, f"send to rank {self.manager}")
        self._works, self._keep = [], []

    def send(self, container: Any, wait: bool) -> dict | None:
        """Send a container; with ``wait`` return the score (else :meth:`collect` gets it)."""
        b = self.buffer
        timeout = b.remote_timeout
        self._wait_previous_send(timeout)
        with Timer(b.timing_data, "serialize_objs", b.timing):
            header, tensors = _encode(container, b.env)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        if b.timing:
            b.timing_data.setdefault("send_bytes", []).append(float(nbytes))
        with Timer(b.timing_data, "send_data" if not b.async_comm else "isend_data", b.timing):
            _send_json(header, MSG_DATA, self.manager, TAG_DATA, timeout)
            if b.async_comm:
                for t in tensors:
                    self._works.append(dist.isend(t, dst=self.manager, tag=TAG_DATA))
                    self._keep.append(t)
            else:
                for t in tensors:
                    _send(t, self.manager, TAG_DATA, timeout)
        if not wait:
            return None
        return self.collect(timeout)

    def collect(self, timeout: float) -> dict | None:
        """Receive the score of the last send."""
        with Timer(self.buffer.timing_data, "recv_score", self.buffer.timing):
            head = torch.empty(2, dtype=torch.int64)
            _recv(head, self.manager, TAG_SCORE, timeout)
            score = _recv_json(self.manager, int(head[1]), TAG_SCORE, timeout)
        return score

    def abandon(self) -> None:
        """Forget pending sends (after a timeout the connection is not reusable anyway)."""
        self._works, self._keep = [], []

    def goodbye(self, timeout: float) -> None:
        """Send EXIT once (after the outstanding sends complete)."""
        if self._said_goodbye:
            return
        self._said_goodbye = True
        self._wait_previous_send(timeout)
        send_exit(self.manager, timeout)
