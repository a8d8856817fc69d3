"""The judge and the candidate's host talk over one SOCK_SEQPACKET socket pair: a JSON object per packet,
file descriptors (shared buffers, the done page) beside it.

JSON only, in both directions: the judge never unpickles what the candidate's process sends, so a reply
can carry data but never code. Replies are checked by their reader (`Reply` below).
"""

from __future__ import annotations

import json
import select
import socket
from dataclasses import dataclass
from typing import Any

MAX_PACKET = 1 << 20
MAX_FDS = 64


class ChannelClosed(Exception):
    """The other end has gone (its process exited or was killed)."""


@dataclass
class Reply:
    kind: str
    data: dict[str, Any]
    fds: list[int]

    def floats(self, key: str) -> list[float]:
        """A list of finite non-negative numbers from the candidate's side, or a ValueError naming the key."""
        v = self.data.get(key)
        if not isinstance(v, list) or not all(isinstance(x, (int, float)) and 0 <= x < 1e9 for x in v):
            raise ValueError(f"malformed {self.kind!r} reply: {key} is not a list of times")
        return [float(x) for x in v]


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    @classmethod
    def pair(cls) -> tuple[Channel, socket.socket]:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        return cls(a), b

    def send(self, kind: str, fds: list[int] | None = None, **fields: Any) -> None:
        data = json.dumps({"kind": kind, **fields}).encode()
        if len(data) > MAX_PACKET:
            raise ValueError(f"message {kind!r} is {len(data)} bytes; at most {MAX_PACKET}")
        try:
            socket.send_fds(self.sock, [data], fds or [])
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ChannelClosed(str(exc)) from exc

    def recv(self, timeout_s: float | None = None) -> Reply:
        """The next message; ChannelClosed when the other end is gone, TimeoutError past the limit."""
        if timeout_s is not None:
            ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout_s))
            if not ready:
                raise TimeoutError(f"no message within {timeout_s:.0f} s")
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, MAX_PACKET, MAX_FDS)
        except (ConnectionResetError, OSError) as exc:
            raise ChannelClosed(str(exc)) from exc
        if not data:
            raise ChannelClosed("end of stream")
        try:
            msg = json.loads(data)
            kind = msg.pop("kind")
        except (ValueError, KeyError, AttributeError, TypeError) as exc:
            raise ValueError(f"malformed message from the other end: {data[:120]!r}") from exc
        return Reply(str(kind), msg, list(fds))

    def expect(self, kind: str, timeout_s: float | None = None) -> Reply:
        """The next message, which must be `kind`; the other end's own error is raised as RemoteError."""
        reply = self.recv(timeout_s)
        if reply.kind == "error":
            message = str(reply.data.get("message", "no reason given"))[:4000]
            raise RemoteError(message, "framework" if reply.data.get("framework") else str(reply.data.get("where", "")))
        if reply.kind != kind:
            raise ValueError(f"expected a {kind!r} message, got {reply.kind!r}")
        return reply


class RemoteError(Exception):
    """The candidate's host reported a failure of the candidate (an exception, a non-zero return)."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(message)
        self.where = where
