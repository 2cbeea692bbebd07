"""Bogus answers per kill of `fhmon serve` under load, for each process layout.

    python -m bench.sigkill [--kills 20] [--threads 4] [--layouts inproc,workers1]
                            [--signals KILL,TERM] [--json OUT]

What a target sees when its monitor dies. A target (the tests' agent, uid 65534 under
`fhmon launch`) calls open_by_handle_at on --threads threads without pause; meanwhile
`fhmon serve` is stopped with the signal (SIGKILL: what the OOM killer or `kill -9`
does; SIGTERM: a graceful restart or an upgrade) --kills times, at a random moment
0.2-0.5 s after it started serving the target again, and restarted after 0.2 s (calls
wait in the kernel meanwhile: `fhmon launch` holds a copy of the listener and makes the
calls the dead fhmon had received trap again). Every call's outcome is counted:

  ok            the call returned an fd that is really the target's
  answered 0    the call returned 0 (or another fd number it already had) with no new fd:
                the kernel's race when the answering process dies inside ADDFD|SEND
                (docs/semantics.md)
  failed        the call returned an errno

Layouts: inproc (`workers = 0`: the native plane's threads answer inside `fhmon serve`)
and workers1 (`workers = 1`: one worker process answers on the native plane; only
`fhmon serve` is killed, as the OOM killer or `kill -9 PID` would). Measurements, not
assertions (tests/kernel/test_restart.py asserts the bounds); root only; a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.support import Agent, Service, World
from tests.support.handles import N2HResult
from tests.support.world import build_world as _build_world

LAYOUTS = {"inproc": "workers = 0\n", "workers1": "workers = 1\n"}
SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM}


def registrations(service: Service) -> int:
    return sum(1 for e in service.events() if e.get("event") == "target_registered")


def run_one(world: World, base: Path, layout: str, sig: str, kills: int, threads: int,
            rng: random.Random) -> dict[str, Any]:
    config = base / f"{layout}.toml"
    config.write_text(f'data_plane = "native"\n{LAYOUTS[layout]}')
    config.chmod(0o644)
    service = Service(world.base, [str(world.shares / "*")], name=f"sigkill-{layout}-{sig}",
                      extra=["--config", str(config)])
    agent = Agent(world, "fhmon", world.main, service.socket)
    done = world.base / f"sigkill-{layout}-{sig}.done"
    outcome: dict[str, Any] = {}
    try:
        h = N2HResult.of(agent.call("n2h", path="dir/inner"))
        if h.errno != 0:
            raise RuntimeError(f"the first lookup failed: errno {h.errno}")
        obh = {"handle_type": h.handle_type, "f_handle": h.f_handle.hex()}

        def hammer() -> None:
            outcome["result"] = agent.call("hammer", op2="obh", path="dir/inner", obh=obh,
                                           until=str(done), threads=threads,
                                           seconds=60 + 10 * kills)

        load = threading.Thread(target=hammer)
        load.start()
        t0 = time.monotonic()
        for i in range(kills):
            time.sleep(rng.uniform(0.2, 0.5))  # calls in flight, a random moment
            if not load.is_alive():
                raise RuntimeError(f"the load ended before kill {i + 1}")
            expected = registrations(service) + 1
            service.stop(SIGNALS[sig])
            time.sleep(0.2)  # calls pile up while no fhmon serve runs
            service.start()
            deadline = time.monotonic() + 30
            while registrations(service) < expected and time.monotonic() < deadline:
                time.sleep(0.02)
            if registrations(service) < expected:
                raise RuntimeError(f"the launcher did not register again after kill {i + 1}")
        time.sleep(0.3)
        done.touch()
        load.join(timeout=120)
        wall = time.monotonic() - t0
        if load.is_alive():
            raise RuntimeError("a target thread hung")
    finally:
        agent.close()
        service.stop()
    results: dict[str, int] = outcome["result"]["results"]
    total = sum(results.values())
    zero = results.get("-1", 0)
    failed = total - results.get("0", 0) - zero
    return {"layout": layout, "signal": sig, "kills": kills, "threads": threads,
            "calls": total, "ok": results.get("0", 0), "answered_zero": zero,
            "failed": failed, "bogus_per_kill": (zero + failed) / kills,
            "errnos": {k: v for k, v in results.items() if k not in ("0", "-1")},
            "wall_s": round(wall, 1), "calls_per_s": round(total / wall),
            "examples": outcome["result"]["failures"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--signals", default=",".join(SIGNALS))
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    layouts = [x for x in args.layouts.split(",") if x]
    sigs = [x for x in args.signals.split(",") if x]
    if set(layouts) - set(LAYOUTS) or set(sigs) - set(SIGNALS):
        parser.error(f"layouts: {', '.join(LAYOUTS)}; signals: {', '.join(SIGNALS)}")
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="fhmon-bench-sigkill-", dir="/tmp"))
    report: dict[str, Any] = {"loadavg_before": os.getloadavg(), "runs": []}
    try:
        world = _build_world(base)
        for sig in sigs:
            for layout in layouts:
                r = run_one(world, base, layout, sig, args.kills, args.threads, rng)
                report["runs"].append(r)
                print(f"SIG{sig:4} {layout:9} {r['kills']} stops, {r['calls']:,} calls "
                      f"({r['calls_per_s']:,}/s): ok {r['ok']:,}, answered 0 "
                      f"{r['answered_zero']}, failed {r['failed']} -> "
                      f"{r['bogus_per_kill']:.2f} bogus answers per stop", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report["loadavg_after"] = os.getloadavg()
    print(f"load average {report['loadavg_before'][0]:.2f} -> "
          f"{report['loadavg_after'][0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
