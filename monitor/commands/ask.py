"""`fhmon probe` and `fhmon status`: questions to a running fhmon over its intake socket."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from typing import Any


def _exchange(sock: socket.socket, decoder: Any, request: Any) -> Any:
    """Send one request and read frames until its answer is whole (a reply is one frame)."""
    from protocol import intake_wire

    sock.sendall(intake_wire.encode(request))
    while (message := decoder.next_message()) is None:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("fhmon closed the connection")
        decoder.feed(data)
    return message


def _connect(socket_path: str, timeout: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(socket_path)
    except BaseException:
        sock.close()
        raise
    return sock


def ask(socket_path: str, request: Any, timeout: float) -> Any:
    from protocol import intake_wire

    with _connect(socket_path, timeout) as sock:
        return _exchange(sock, intake_wire.FrameDecoder(), request)


def ask_json(command: str, args: argparse.Namespace, request: Any) -> Any:
    """Send one request, return the decoded JSON answer; None (reported) on failure."""
    from protocol import intake_wire

    try:
        return json.loads(ask(args.socket, request, args.timeout).json)
    except (OSError, intake_wire.ProtocolError, ValueError, AttributeError) as exc:
        print(f"fhmon {command}: {args.socket}: {exc}", file=sys.stderr)
        return None


def probe(args: argparse.Namespace) -> int:
    """Readiness by default: fhmon answers and its key directory loaded. --liveness: it
    answers. A refused key reload leaves the old keys serving, and a restarted fhmon would
    exit on the same directory, so a key error must not fail a liveness probe."""
    from protocol import intake_wire

    health = ask_json("probe", args, intake_wire.Ping())
    if health is None:
        return 1
    print(json.dumps(health))
    if not health.get("ok"):
        print(f"fhmon probe: key error (the keys loaded before keep serving): "
              f"{health.get('key_error')}", file=sys.stderr)
        return 0 if getattr(args, "liveness", False) else 1
    return 0


def ask_status(args: argparse.Namespace) -> Any:
    """The whole status, page by page over one connection (a reply is one bounded frame)."""
    from protocol import intake_wire

    pages = intake_wire.StatusPages()
    try:
        with _connect(args.socket, args.timeout) as sock:
            decoder = intake_wire.FrameDecoder()
            while pages.request is not None:
                pages.feed(_exchange(sock, decoder, pages.request))
        return pages.status
    except (OSError, intake_wire.ProtocolError) as exc:
        print(f"fhmon status: {args.socket}: {exc}", file=sys.stderr)
        return None


def status(args: argparse.Namespace) -> int:
    status = ask_status(args)
    if status is None:
        return 1
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    print(f"fhmon pid {status['pid']}, signer {status['signer']}, keys {status['keys']}, "
          f"{status['fds']} fds")
    print(f"{'ID':>4} {'PID':>8} {'CALLS':>8}  SHARE")
    for t in status["targets"]:
        print(f"{t['id']:>4} {t['pid']:>8} {t['calls']:>8}  {t['share']}")
    for syscall, results in status["counters"].items():
        print(f"{syscall}: " + ", ".join(f"{k}={v}" for k, v in sorted(results.items())))
    return 0
