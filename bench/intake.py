"""Does intake traffic slow a registered target's calls? A neighbour's p99, side by side.

    python -m bench.intake [--reps N] [--calls N] [--clients N] [--variant K=V ...]

One `fhmon serve` (the defaults, plus --variant lines), one victim target under `fhmon
launch` making n2h calls on one thread, and, in interleaved repetitions, one kind of
intake noise at a time from this process's threads:

  alone      no noise
  pipelined  N connections, each writing PING frames back to back (16 KiB at a time) and
             reading the PONGs
  status     N connections asking STATUS back to back
  slow       N connections that dribble a HELLO one byte every 5 ms (slow loris)

For each kind: the victim's p50 and p99 (median over the repetitions) and the median of
each repetition's p99 ratio to the alone run next to it. Measurements, not assertions
(tests only assert that calls are answered). The noise runs as root, or with --as-uid U
as uid U in a child process (fhmon's socket is then opened to group U).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.procs import Monitor, Pool, run_once
from bench.run import make_base, remove_base
from protocol import intake_wire

KINDS = ("alone", "pipelined", "status", "slow")


def _pipelined(path: str, stop: threading.Event) -> None:
    burst = intake_wire.encode(intake_wire.Ping()) * (16384 // intake_wire.HEADER_SIZE)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(path)
        while not stop.is_set():
            sock.sendall(burst)
            got = 0
            while got < len(burst) // intake_wire.HEADER_SIZE * 10 and not stop.is_set():
                data = sock.recv(1 << 20)  # PONGs (about 100 bytes each): drain some
                if not data:
                    return
                got += len(data)


def _status(path: str, stop: threading.Event) -> None:
    request = intake_wire.encode(intake_wire.StatusRequest())
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(path)
        decoder = intake_wire.FrameDecoder()
        while not stop.is_set():
            sock.sendall(request * 8)
            answered = 0
            while answered < 8:
                data = sock.recv(1 << 20)
                if not data:
                    return
                decoder.feed(data)
                while decoder.next_message() is not None:
                    answered += 1


def _slow(path: str, stop: threading.Event) -> None:
    hello = intake_wire.encode(intake_wire.Hello(1, "/nonexistent", "slow"))
    while not stop.is_set():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            for byte in hello[:-1]:  # never complete: fhmon cuts it at its timeout
                if stop.wait(0.005):
                    return
                try:
                    sock.send(bytes([byte]))
                except OSError:
                    break


NOISE: dict[str, Callable[[str, threading.Event], None]] = {
    "pipelined": _pipelined, "status": _status, "slow": _slow}


def _guarded(work: Callable[[str, threading.Event], None], path: str,
             stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            work(path, stop)
        except OSError:
            time.sleep(0.01)


class Noise:
    """N noise clients of one kind: threads of this process, or (as_uid) of a child
    process running as that uid (fhmon paces and caps each client uid on its own)."""

    def __init__(self, kind: str, path: str, clients: int, as_uid: int | None) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.proc: subprocess.Popen[bytes] | None = None
        if kind == "alone":
            return
        if as_uid is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench.intake", "--noise", kind, "--socket", path,
                 "--clients", str(clients)], user=as_uid, group=as_uid, extra_groups=[],
                cwd=Path(__file__).resolve().parent.parent, stdin=subprocess.PIPE)
            return
        self.threads = [threading.Thread(target=_guarded, args=(NOISE[kind], path, self.stop),
                                         daemon=True) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)


def _noise_main(kind: str, path: str, clients: int) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threads = [threading.Thread(target=_guarded, args=(NOISE[kind], path, stop), daemon=True)
               for _ in range(clients)]
    for t in threads:
        t.start()
    stop.wait()
    return 0


def measure(reps: int, calls: int, clients: int, settings: dict[str, str],
            as_uid: int | None = None) -> dict[str, object]:
    base = make_base()
    if as_uid is not None:
        settings = {**settings, "socket_mode": '"0660"', "socket_group": str(as_uid)}
    monitor = Monitor(base, "intake", settings, base / "share")
    pool = Pool(base, monitor, timeout=120)
    results: dict[str, list[dict[str, float]]] = {k: [] for k in KINDS}
    try:
        victim = pool.ensure(1)
        run_once(victim, monitor, "n2h", 1, 2000, pinned=False)  # warm up
        for _ in range(reps):
            for kind in KINDS:
                noise = Noise(kind, monitor.socket, clients, as_uid)
                time.sleep(0.3 if kind != "alone" else 0)
                try:
                    run = run_once(victim, monitor, "n2h", 1, calls, pinned=False)
                finally:
                    noise.end()
                if run["errors"]:
                    raise RuntimeError(f"victim calls failed under {kind}: {run['errors']}")
                results[kind].append({"p50": run["p50_us"], "p99": run["p99_us"]})
        report: dict[str, object] = {"settings": settings, "reps": reps, "calls": calls,
                                     "clients": clients, "noise_uid": as_uid or 0}
        alone = results["alone"]
        for kind in KINDS:
            runs = results[kind]
            ratios = [r["p99"] / a["p99"] for r, a in zip(runs, alone, strict=True)]
            report[kind] = {"p50_us": round(statistics.median(r["p50"] for r in runs), 1),
                            "p99_us": round(statistics.median(r["p99"] for r in runs), 1),
                            "p99_ratio": round(statistics.median(ratios), 2)}
        return report
    finally:
        pool.stop()
        monitor.stop()
        remove_base(base)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--variant", action="append", default=[],
                        help="a config line KEY=VALUE (TOML value), repeatable")
    parser.add_argument("--as-uid", type=int, default=None,
                        help="make the noise as this uid (fhmon opens its socket to it)")
    parser.add_argument("--noise", choices=sorted(NOISE), help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.noise:
        return _noise_main(args.noise, args.socket, args.clients)
    settings = dict(v.split("=", 1) for v in args.variant)
    print(json.dumps(measure(args.reps, args.calls, args.clients, settings, args.as_uid),
                     indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
