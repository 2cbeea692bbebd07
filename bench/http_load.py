"""A target's call latency while the metrics endpoint is under attack, side by side.

    python -m bench.http_load [--reps 7] [--calls 1000] [--connections 100] [--json OUT]

100 connections trickling bytes to the metrics port once raised a registered target's p99
7-13x. This runs a real `fhmon serve --metrics-address` and a real target (uid 65534 under
fhmon's filter), and measures the target's p50/p99 over `--calls` lookups, in paired,
interleaved repetitions: alone, then with an attacker (a thread of this process) holding
`--connections` slowloris connections (one byte every `--interval` s, reopened when
closed), and with an idle-connection flood. A control row runs the same slowloris attacker
against a socket of this process that accepts nothing (the bytes wait in the kernel): what
the attacker's own CPU (2 cores shared with fhmon and the target) costs the target. The
ratios are medians of each pair's ratio (outside load lands on both runs of a pair). Root
only; a few minutes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.support import Agent, Service, build_world
from tests.support.http_attack import Attacker, free_port


def latency(agent: Agent, calls: int) -> tuple[float, float]:
    out = agent.call("hammer", path="dir/inner", calls=calls, threads=1)
    assert out["results"] == {"0": calls}, out
    return out["p50"] * 1e3, out["p99"] * 1e3


def under(attacker: Attacker, agent: Agent, calls: int) -> tuple[float, float]:
    thread = threading.Thread(target=attacker.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while attacker.holding < min(attacker.count, 64) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        measured = latency(agent, calls)
        attacker.check()  # a figure measured after the attack died is not one under attack
        return measured
    finally:
        attacker.stop.set()
        thread.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.2,
                        help="seconds between two bytes of one slowloris connection")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fhmon-bench-http-", dir="/tmp"))
    try:
        world = build_world(base)
        port = free_port()
        service = Service(base, [str(world.shares / "*")], name="bench-http",
                          extra=["--metrics-address", f"127.0.0.1:{port}"])
        agent = Agent(world, "fhmon", world.main, service.socket)
        try:
            latency(agent, args.calls)  # warm up
            rows: dict[str, list[tuple[float, float]]] = {"alone": [], "slowloris": [],
                                                          "flood": [], "control": []}
            control = socket.create_server(("127.0.0.1", 0), backlog=4096)
            for _ in range(args.reps):
                rows["alone"].append(latency(agent, args.calls))
                rows["slowloris"].append(under(Attacker(port, args.connections, trickle=True,
                                                        interval=args.interval),
                                               agent, args.calls))
                rows["flood"].append(under(Attacker(port, args.connections, trickle=False,
                                                    interval=0.05), agent, args.calls))
                rows["control"].append(under(Attacker(control.getsockname()[1],
                                                      args.connections, trickle=True,
                                                      interval=args.interval),
                                             agent, args.calls))
            control.close()
        finally:
            agent.close()
            service.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result: dict[str, Any] = {"connections": args.connections, "interval": args.interval,
                              "calls": args.calls,
                              "reps": args.reps}
    alone = rows["alone"]
    print(f"{'':10} {'p50 ms':>8} {'p99 ms':>8} {'p99 ratio':>10}")
    for name, runs in rows.items():
        p50 = statistics.median(r[0] for r in runs)
        p99 = statistics.median(r[1] for r in runs)
        ratio = statistics.median(r[1] / a[1] for r, a in zip(runs, alone, strict=True))
        result[name] = {"p50_ms": p50, "p99_ms": p99, "p99_ratio": ratio}
        print(f"{name:10} {p50:8.3f} {p99:8.3f} {ratio:9.2f}x")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
