"""One JSON object per line over a local socket: how a side and the coordinator talk.

A side asks and waits; the coordinator answers when that side may go on.  Only the
coordinator's own socket in a private temporary folder is ever connected to, and the
messages are plain JSON (never pickle): a side's data is checked where it is read.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from typing import Any

from ..errors import LLMEnergyError

# The environment variable through which ``llmenergy ab`` tells a pytest session that it
# is one side of a paired run: ``<socket path>|<side>|<pairing id>``.
ENV = "LLMENERGY_AB"
BASE, HEAD = "base", "head"
SIDES = (BASE, HEAD)
# A line longer than this is not a message of ours (a case's JSON stays far below).
MAX_LINE = 64 * 1024 * 1024


class ChannelClosed(LLMEnergyError):
    """The other end went away (the coordinator stopped, or a side died)."""


class Channel:
    """A connected socket read and written one JSON line at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""

    def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, allow_nan=False, separators=(",", ":")).encode() + b"\n"
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise ChannelClosed(f"the paired run's coordinator went away: {exc}") from None

    def receive(self) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError as exc:
                raise ChannelClosed(f"the other end of the paired run went away: {exc}") from None
            if not chunk:
                raise ChannelClosed("the other end of the paired run closed the connection")
            self._buffer += chunk
            if len(self._buffer) > MAX_LINE:
                raise ChannelClosed("a message of the paired run is too long")
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError:
            raise ChannelClosed("a message of the paired run is not JSON") from None
        if not isinstance(message, dict):
            raise ChannelClosed("a message of the paired run is not a JSON object")
        return message

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        self.send(message)
        return self.receive()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def connect(path: str) -> Channel:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise ChannelClosed(
            f"cannot reach the paired run's coordinator at {path}: {exc.strerror or exc}; "
            f"{ENV} is set by llmenergy ab, do not set it by hand"
        ) from None
    return Channel(sock)


def side_from_env() -> tuple[str, str, str] | None:
    """(socket path, side, pairing id) when this process is a side of ``llmenergy ab``."""
    text = os.environ.get(ENV)
    if not text:
        return None
    parts = text.split("|")
    if len(parts) != 3 or parts[1] not in SIDES:
        raise LLMEnergyError(
            f"{ENV}={text!r} is not <socket>|base or head|<id>; it is set by llmenergy ab, "
            "do not set it by hand"
        )
    return parts[0], parts[1], parts[2]
