"""A neighbour's call latency beside a target with thousands of threads, side by side.

    python -m bench.thread_cache [--threads 2000] [--reps 5] [--calls 1000] [--json OUT]

A target with 2,000 threads once raised a neighbour's p50 12x: the per-target thread cache
(1,024 pidfds) swept every entry on each put once full. This runs a real `fhmon serve`
with two real targets (uid 65534 under fhmon's filter): the neighbour makes `--calls`
lookups alone, then while the crowd's `--threads` live threads call in a loop, in paired,
interleaved repetitions (the crowd is SIGSTOPped for the solo runs); ratios are medians of
each pair's ratio. Root only; a minute or two.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support import Agent, Service, build_world


def latency(agent: Agent, calls: int) -> tuple[float, float]:
    out = agent.call("hammer", path="dir/inner", calls=calls, threads=1)
    assert out["results"] == {"0": calls}, out
    return out["p50"] * 1e3, out["p99"] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fhmon-bench-threads-", dir="/tmp"))
    solo: list[tuple[float, float]] = []
    crowded: list[tuple[float, float]] = []
    try:
        world = build_world(base)
        service = Service(base, [str(world.shares / "*")], name="bench-threads")
        neighbour = Agent(world, "fhmon", world.main, service.socket)
        crowd = Agent(world, "fhmon", world.main, service.socket)
        stop = base / "stop"
        try:
            latency(neighbour, args.calls)
            assert crowd.proc.stdin is not None
            crowd.proc.stdin.write(json.dumps({"op": "hammer", "path": "dir/inner",
                                               "threads": args.threads, "until": str(stop),
                                               "seconds": 3600}) + "\n")
            crowd.proc.stdin.flush()
            while len(os.listdir(f"/proc/{crowd.pid}/task")) <= args.threads:
                time.sleep(0.1)
            time.sleep(1)
            for _ in range(args.reps):
                os.kill(crowd.pid, signal.SIGSTOP)
                time.sleep(0.1)
                solo.append(latency(neighbour, args.calls))
                os.kill(crowd.pid, signal.SIGCONT)
                time.sleep(0.3)
                crowded.append(latency(neighbour, args.calls))
            stop.touch()
        finally:
            stop.touch()
            with_crowd_ended = crowd.proc.stdout.readline() if crowd.proc.stdout else ""
            crowd.close()
            neighbour.close()
            service.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    crowd_result = json.loads(with_crowd_ended) if with_crowd_ended else {}
    result: dict[str, Any] = {"threads": args.threads, "calls": args.calls, "reps": args.reps,
                              "crowd_results": crowd_result.get("results")}
    print(f"{'':8} {'p50 ms':>8} {'p99 ms':>8} {'p50 ratio':>10} {'p99 ratio':>10}")
    for name, runs in (("solo", solo), ("crowded", crowded)):
        p50 = statistics.median(r[0] for r in runs)
        p99 = statistics.median(r[1] for r in runs)
        r50 = statistics.median(r[0] / a[0] for r, a in zip(runs, solo, strict=True))
        r99 = statistics.median(r[1] / a[1] for r, a in zip(runs, solo, strict=True))
        result[name] = {"p50_ms": p50, "p99_ms": p99, "p50_ratio": r50, "p99_ratio": r99}
        print(f"{name:8} {p50:8.3f} {p99:8.3f} {r50:9.2f}x {r99:9.2f}x")
    print(f"crowd's answers: {crowd_result.get('results')}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
