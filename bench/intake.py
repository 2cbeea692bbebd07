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
  oci        N connections that each send 60 KB of an OCI state message that never ends
             (inside a string), then a byte every ms (issue 37.2)

The noise of pipelined, slow and oci comes from bench/noise.c (compiled here with cc): one
epoll loop in one process for all N clients (--generator c, the default). --generator
python makes it from a thread per client of a Python process instead (status always is):
that generator alone took ~1.2 cores of 2 for 100 oci clients and raised the victim's p99
~19x with nothing but a discard socket behind it (2026-12-06), more than any bound it was
meant to check.

--sink adds a noise floor for the kinds that only write (slow, oci): the same noise sent
to a socket that reads and discards every byte (noise.c's sink, or a selector loop in
Python with --generator python; the noise's uid may connect), while the victim is served
by the first build as before. What the victim loses beside the sink is the noise's own
CPU and the machine's, not fhmon's work.

For each kind: the victim's p50 and p99 (median over the repetitions) and the median of
each repetition's p99 ratio to the alone run next to it. Measurements, not assertions
(tests only assert that calls are answered). The noise runs as root, or with --as-uid U
as uid U in a child process (fhmon's socket is then opened to group U).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.procs import FHMON, Monitor, Pool, compile_c, run_once
from bench.run import make_base, remove_base
from protocol import intake_wire

KINDS = ("alone", "pipelined", "status", "slow", "oci")
GENERATORS = ("c", "python")
NOISE_C = Path(__file__).with_name("noise.c")

PING_BURST = intake_wire.encode(intake_wire.Ping()) * (16384 // intake_wire.HEADER_SIZE)
PONG_BYTES = len(PING_BURST) // intake_wire.HEADER_SIZE * 10  # read this much, write again
SLOW_HELLO = intake_wire.encode(intake_wire.Hello(1, "/nonexistent", "slow"))
OCI_HEAD = b'{"ociVersion":"1.0.2","fds":["seccompFd"],"pid":1,"metadata":"'
OCI_PREFIX = OCI_HEAD + b"a" * (60_000 - len(OCI_HEAD))  # then "a" a ms, never closed


def compile_noise(dest: Path) -> Path:
    """bench/noise.c built into dest (executable by the noise's uid)."""
    return compile_c(NOISE_C, dest / "noise", "bench.intake --generator c")


def c_noise_argv(binary: Path, kind: str, path: str, clients: int) -> list[str]:
    """noise.c's command line for one kind: the same bytes as the Python clients send."""
    if kind == "pipelined":
        return [str(binary), "pingpong", path, str(clients), PING_BURST.hex(), str(PONG_BYTES)]
    if kind == "slow":  # a byte every 5 ms, never the last one: fhmon cuts it, then again
        return [str(binary), "dribble", path, str(clients), "5000", "", SLOW_HELLO[:-1].hex(),
                "0"]
    if kind == "oci":
        return [str(binary), "dribble", path, str(clients), "1000", OCI_PREFIX.hex(),
                b"a".hex(), "1"]
    raise ValueError(f"noise.c makes no {kind} noise")


def _pipelined(path: str, stop: threading.Event) -> None:
    burst = PING_BURST
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(path)
        while not stop.is_set():
            sock.sendall(burst)
            got = 0
            while got < PONG_BYTES and not stop.is_set():
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
    hello = SLOW_HELLO
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


def _oci(path: str, stop: threading.Event) -> None:
    while not stop.is_set():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            try:
                sock.sendall(OCI_PREFIX)
                while not stop.wait(0.001):  # never complete: fhmon ends it, then again
                    sock.send(b"a")
            except OSError:
                continue


NOISE: dict[str, Callable[[str, threading.Event], None]] = {
    "pipelined": _pipelined, "status": _status, "slow": _slow, "oci": _oci}


def _guarded(work: Callable[[str, threading.Event], None], path: str,
             stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            work(path, stop)
        except OSError:
            time.sleep(0.01)


class Noise:
    """N noise clients of one kind: noise.c's one process (`binary`, for the kinds it
    makes), or threads of this process, or (as_uid) of a child process; the child
    processes run as as_uid (fhmon paces and caps each client uid on its own)."""

    def __init__(self, kind: str, path: str, clients: int, as_uid: int | None,
                 binary: Path | None = None) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.proc: subprocess.Popen[bytes] | None = None
        if kind == "alone":
            return
        if binary is not None and kind != "status":
            self.proc = subprocess.Popen(
                c_noise_argv(binary, kind, path, clients), user=as_uid, group=as_uid,
                extra_groups=[] if as_uid is not None else None)
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


WRITE_ONLY = ("slow", "oci")  # kinds whose clients never wait for an answer

_SINK = """
import os, selectors, socket, sys
path, uid = sys.argv[1], int(sys.argv[2])
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
if uid:
    os.chown(path, uid, uid)
server.listen(4096)
server.setblocking(False)
sel = selectors.DefaultSelector()
sel.register(server, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if key.fileobj is server:
            try:
                conn, _ = server.accept()
            except BlockingIOError:
                continue
            conn.setblocking(False)
            sel.register(conn, selectors.EVENT_READ)
        else:
            try:
                data = key.fileobj.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                sel.unregister(key.fileobj)
                key.fileobj.close()
"""


class Sink:
    """A unix socket that reads and discards whatever is written to it, in its own
    process (noise.c's sink, or Python's without `binary`): the noise floor (the noise's
    cost without fhmon behind the socket)."""

    def __init__(self, path: Path, uid: int | None, binary: Path | None = None) -> None:
        self.path = str(path)
        argv = ([str(binary), "sink", self.path, str(uid or 0)] if binary is not None
                else [sys.executable, "-c", _SINK, self.path, str(uid or 0)])
        self.proc = subprocess.Popen(argv)
        deadline = time.monotonic() + 10
        while not path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the sink did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.proc.kill()
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


def measure(reps: int, calls: int, clients: dict[str, int], settings: dict[str, str],
            as_uid: int | None = None, builds: dict[str, str] | None = None,
            kinds: tuple[str, ...] = KINDS, sink: bool = False,
            generator: str = "c") -> dict[str, object]:
    """`builds`: name -> fhmon executable, each its own monitor and victim, measured in
    the same repetitions (before and after a change, interleaved). `sink`: also a "sink"
    row, the write-only kinds' noise sent to a discard socket, the victim on the first
    build. `generator`: "c" (noise.c) or "python" (a thread per client)."""
    builds = builds or {"this": FHMON}
    kinds = ("alone", *(k for k in kinds if k != "alone"))
    base = make_base()
    binary = compile_noise(base) if generator == "c" else None
    if as_uid is not None:
        settings = {**settings, "socket_mode": '"0660"', "socket_group": str(as_uid)}
    monitors: dict[str, Monitor] = {}
    pools: dict[str, Pool] = {}
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        b: {k: [] for k in kinds} for b in builds}
    first = next(iter(builds))  # the build whose victim is measured beside the sink
    sunk = tuple(k for k in kinds if sink and k in WRITE_ONLY)
    if sunk:
        results["sink"] = {k: [] for k in sunk}
    discard: Sink | None = None

    def victim_run(kind: str, name: str, noise_path: str) -> dict[str, float]:
        """The victim's n2h p50 and p99 on build `name` while `kind` noise hits noise_path."""
        noise = Noise(kind, noise_path, clients.get(kind, 16), as_uid, binary)
        time.sleep(0.3 if kind != "alone" else 0)
        try:
            run = run_once(pools[name].ensure(1), monitors[name], "n2h", 1, calls,
                           pinned=False)
        finally:
            noise.end()
        if run["errors"]:
            raise RuntimeError(f"victim calls failed under {kind} ({name}): {run['errors']}")
        return {"p50": run["p50_us"], "p99": run["p99_us"]}

    try:
        if sunk:
            discard = Sink(base / "sink.sock", as_uid, binary)
        for name, executable in builds.items():
            monitors[name] = Monitor(base, f"intake-{name}", settings, base / "share",
                                     executable=executable)
            pools[name] = Pool(base, monitors[name], timeout=120)
            run_once(pools[name].ensure(1), monitors[name], "n2h", 1, 2000, pinned=False)
        for _ in range(reps):
            for kind in kinds:
                for name, monitor in monitors.items():
                    results[name][kind].append(victim_run(kind, name, monitor.socket))
                if kind in sunk and discard is not None:
                    results["sink"][kind].append(victim_run(kind, first, discard.path))
        report: dict[str, object] = {"settings": settings, "reps": reps, "calls": calls,
                                     "clients": {k: clients.get(k, 16) for k in kinds[1:]},
                                     "noise_uid": as_uid or 0, "generator": generator,
                                     "load": os.getloadavg()}
        for name in results:
            # the sink's runs are paired with its victim's build's quiet runs
            alone = results[first if name == "sink" else name]["alone"]
            rows: dict[str, object] = {}
            for kind in results[name]:
                runs = results[name][kind]
                ratios = [r["p99"] / a["p99"] for r, a in zip(runs, alone, strict=True)]
                rows[kind] = {"p50_us": round(statistics.median(r["p50"] for r in runs), 1),
                              "p99_us": round(statistics.median(r["p99"] for r in runs), 1),
                              "p99_ratio": round(statistics.median(ratios), 2)}
            report[name] = rows
        return report
    finally:
        if discard is not None:
            discard.stop()
        for pool in pools.values():
            pool.stop()
        for monitor in monitors.values():
            monitor.stop()
        remove_base(base)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    # 20,000 n2h (~0.4 s): runs of 5,000 (~85 ms) land in or out of the OCI kind's
    # reconnect bursts and gave 0.7x or 17x for the same build (2026-12-07)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--kind-clients", action="append", default=[], metavar="KIND=N",
                        help="clients of one kind (default --clients), repeatable")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds")
    parser.add_argument("--build", action="append", default=[], metavar="NAME=FHMON",
                        help="compare builds: each NAME served by the fhmon executable "
                             "FHMON, interleaved (default: this checkout's)")
    parser.add_argument("--variant", action="append", default=[],
                        help="a config line KEY=VALUE (TOML value), repeatable")
    parser.add_argument("--as-uid", type=int, default=None,
                        help="make the noise as this uid (fhmon opens its socket to it)")
    parser.add_argument("--sink", action="store_true",
                        help="add the noise floor: the write-only kinds (slow, oci) sent to "
                             "a discard socket instead of fhmon")
    parser.add_argument("--generator", choices=GENERATORS, default="c",
                        help="the noise's maker: noise.c's one epoll loop (default) or a "
                             "Python thread per client")
    parser.add_argument("--noise", choices=sorted(NOISE), help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.noise:
        return _noise_main(args.noise, args.socket, args.clients)
    settings = dict(v.split("=", 1) for v in args.variant)
    clients = {k: args.clients for k in KINDS}
    clients.update({k: int(n) for k, n in (kc.split("=", 1) for kc in args.kind_clients)})
    builds = dict(b.split("=", 1) for b in args.build) or None
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if unknown := set(kinds) - set(KINDS):
        raise SystemExit(f"--kinds: unknown {sorted(unknown)}")
    print(json.dumps(measure(args.reps, args.calls, clients, settings, args.as_uid, builds,
                             kinds, args.sink, args.generator), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
