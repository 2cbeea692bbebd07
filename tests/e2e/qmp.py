"""A minimal QMP client (QEMU's JSON control protocol) for the live migration test.

Why a few lines of our own: the test needs a handful of commands (migrate, query-migrate,
query-status, quit) on a unix socket, one at a time, and QMP is one JSON object per line; the
tests stay free of extra dependencies.  Asynchronous events that arrive while waiting for an
answer are kept in `events`.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any


class QmpError(RuntimeError):
    """QEMU answered a command with an error, or the connection broke."""


class Qmp:
    """One QMP connection: greeting read and capabilities negotiated on connect."""

    def __init__(self, path: Path, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        while True:
            try:
                self.sock.connect(str(path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    self.sock.close()
                    raise QmpError(f"no QMP socket at {path} after {timeout:.0f}s") from None
                time.sleep(0.05)
        self.sock.settimeout(timeout)
        self.reader = self.sock.makefile("rb")
        self.events: list[dict[str, Any]] = []
        greeting = self._read()
        if "QMP" not in greeting:
            raise QmpError(f"not a QMP greeting: {greeting}")
        self.version: dict[str, Any] = greeting["QMP"]["version"]
        self.command("qmp_capabilities")

    def _read(self) -> dict[str, Any]:
        line = self.reader.readline()
        if not line:
            raise QmpError("QEMU closed the QMP connection")
        message: dict[str, Any] = json.loads(line)
        return message

    def command(self, name: str, **arguments: Any) -> Any:
        """Runs one command and returns its "return" value; raises QmpError on "error"."""
        request: dict[str, Any] = {"execute": name}
        if arguments:
            request["arguments"] = arguments
        self.sock.sendall(json.dumps(request).encode() + b"\n")
        while True:
            message = self._read()
            if "event" in message:
                self.events.append(message)
            elif "error" in message:
                raise QmpError(f"{name}: {message['error']}")
            elif "return" in message:
                return message["return"]

    def close(self) -> None:
        self.reader.close()
        self.sock.close()
