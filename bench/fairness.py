"""A neighbour's p99 alone and beside a hostile target, on the native and python planes.

    python -m bench.fairness [--reps 7] [--calls 2000] [--planes native,python]
                             [--attackers storm,long_paths,symlinks,lease] [--json OUT]
                             [--variant NAME:key=value,...]

The bounds: a neighbour's p99 within 3x of alone under amplification, and its isolation
target (<= 2x beside a target blocking its own calls). One `fhmon serve` per data plane;
the neighbour (uid 65534 under `fhmon launch`) makes `--calls` lookups on one thread; the
attackers, each a real target of uid 65534:

  storm       name_to_handle_at of a short path on 4 threads in the tightest loop it can
  long_paths  the same with 4 KiB paths of 2,041 components ("./" x 2040 + "file")
  symlinks    the same through 40 symlinks, each 4 KiB of "./" (about 82,000 components
              a call; the kernel follows at most 40)
  lease       a target holding a write lease on its own file whose open by handle waits
              for the lease break (lease-break-time raised to 600 s for the run, restored):
              on the native plane its call blocks its own thread; the python plane
              answers it EAGAIN at once (docs/semantics.md)

--variant NAME:key=value,... defines one more configuration (the native plane unless it
sets data_plane) that --planes may name, e.g. `--variant t2:data_plane_threads=2`.

Paired, interleaved repetitions: alone (the storm SIGSTOPped, the lease holder not
started), then beside; each pair gives a ratio of p99s and the median ratio is reported,
so that other load on the machine weighs on both runs of a pair alike. Measurements only
(tests assert that calls are answered, tests/adversarial/test_availability.py and
test_exhaustion.py). Root only; a few minutes.
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
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from tests.support import NOBODY, Agent, Service, World, build_world
from tests.support.handles import N2HResult
from tests.support.world import lease_break_time

ATTACKERS = ("storm", "long_paths", "symlinks", "lease")
TARGETS = {"storm": 3.0, "long_paths": 3.0, "symlinks": 3.0, "lease": 2.0}
AT_SYMLINK_FOLLOW = 0x400
SYMLINKS = 40


def p99_ms(agent: Agent, calls: int) -> float:
    out = agent.call("hammer", path="dir/inner", calls=calls, threads=1)
    assert out["results"] == {"0": calls}, out
    return float(out["p99"]) * 1e3


def build_links(world: World) -> str:
    """40 symlinks, each "./" x 2040 then the next; the last ends at a file."""
    links = world.main / "bench-links"
    links.mkdir(mode=0o755)
    (links / "leaf").write_text("leaf\n")
    (links / "leaf").chmod(0o644)
    for i in range(SYMLINKS):
        nxt = f"s{i + 1}" if i < SYMLINKS - 1 else "leaf"
        os.symlink("./" * 2040 + nxt, links / f"s{i}")
    return "bench-links/s0"


def send(agent: Agent, op: str, **cmd: Any) -> None:
    assert agent.proc.stdin is not None
    agent.proc.stdin.write(json.dumps({"op": op, **cmd}) + "\n")
    agent.proc.stdin.flush()


def kill(agent: Agent) -> None:
    with suppress(ProcessLookupError):
        os.kill(agent.pid, signal.SIGKILL)
    agent.proc.kill()
    agent.proc.wait(10)


def storm_pairs(world: World, service: Service, neighbour: Agent, spec: dict[str, Any],
                reps: int, calls: int) -> list[tuple[float, float]]:
    attacker = Agent(world, "fhmon", world.main, service.socket)
    pairs = []
    try:
        one = attacker.call("n2h", path=spec["path"], flags=spec.get("flags", 0))
        if one["errno"] != 0:  # the attacker's calls must reach the kernel's walk
            raise RuntimeError(f"the attacker's call fails: errno {one['errno']}")
        send(attacker, "storm", calls=10**9, threads=4, **spec)
        time.sleep(0.5)
        for _ in range(reps):
            os.kill(attacker.pid, signal.SIGSTOP)
            time.sleep(0.1)
            alone = p99_ms(neighbour, calls)
            os.kill(attacker.pid, signal.SIGCONT)
            time.sleep(0.1)
            pairs.append((alone, p99_ms(neighbour, calls)))
    finally:
        kill(attacker)
    return pairs


def lease_pairs(world: World, service: Service, neighbour: Agent, reps: int,
                calls: int) -> list[tuple[float, float]]:
    leased = world.main / "bench-leased"
    leased.write_text("the lease holder's own file\n")
    os.chown(leased, NOBODY, NOBODY)
    pairs = []
    for _ in range(reps):
        alone = p99_ms(neighbour, calls)
        holder = Agent(world, "fhmon", world.main, service.socket)
        try:
            got = N2HResult.of(holder.call("n2h", path=leased.name))
            assert got.errno == 0, got
            htype, f_handle = int(got.handle_type or 0), got.f_handle
            assert holder.call("lease", path=str(leased), name="lease")["errno"] == 0
            send(holder, "obh", handle_type=htype, f_handle=f_handle.hex(), flags=os.O_RDONLY)
            time.sleep(0.2)
            pairs.append((alone, p99_ms(neighbour, calls)))
        finally:
            kill(holder)  # its lease goes with it: fhmon's open completes, answers no one
    return pairs


def summarize(pairs: list[tuple[float, float]]) -> dict[str, float]:
    return {"alone_p99_ms": statistics.median(a for a, _ in pairs),
            "beside_p99_ms": statistics.median(b for _, b in pairs),
            "ratio": statistics.median(b / a for a, b in pairs)}


def config_text(plane: str, variants: dict[str, dict[str, str]]) -> str:
    """A plane's config file: `data_plane = ...` for native/python, or a variant's keys."""
    settings = {"data_plane": '"native"', **variants.get(plane, {})} \
        if plane in variants else {"data_plane": f'"{plane}"'}
    return "".join(f"{k} = {v}\n" for k, v in settings.items())


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """NAME:key=value,... (values as TOML), as bench.run's --variant."""
    name, sep, rest = text.partition(":")
    if not sep or not name:
        raise SystemExit(f"--variant {text!r}: expected NAME:key=value[,key=value]")
    pairs = [item.partition("=") for item in rest.split(",") if item]
    if any(not eq for _, eq, _ in pairs):
        raise SystemExit(f"--variant {text!r}: every item must be key=value")
    return name, {k.strip(): v.strip() for k, _, v in pairs}


def run_plane(world: World, base: Path, plane: str, attackers: list[str], reps: int,
              calls: int, long_path: str, links: str,
              variants: dict[str, dict[str, str]]) -> dict[str, dict[str, float]]:
    config = base / f"{plane}.toml"
    config.write_text(config_text(plane, variants))
    service = Service(base, [str(world.shares / "*")], name=f"bench-fair-{plane}",
                      extra=["--config", str(config)])
    neighbour = Agent(world, "fhmon", world.main, service.socket)
    results: dict[str, dict[str, float]] = {}
    runs: dict[str, Callable[[], list[tuple[float, float]]]] = {
        "storm": lambda: storm_pairs(world, service, neighbour, {"path": "dir/deep/leaf"},
                                     reps, calls),
        "long_paths": lambda: storm_pairs(world, service, neighbour, {"path": long_path},
                                          reps, calls),
        "symlinks": lambda: storm_pairs(world, service, neighbour,
                                        {"path": links, "flags": AT_SYMLINK_FOLLOW},
                                        reps, calls),
        "lease": lambda: lease_pairs(world, service, neighbour, reps, calls)}
    try:
        p99_ms(neighbour, calls)  # warm up
        for name in attackers:
            pairs = runs[name]()
            results[name] = summarize(pairs)
            results[name]["pairs"] = [[round(a, 4), round(b, 4)] for a, b in pairs]  # type: ignore[assignment]
            r = results[name]
            print(f"{plane:7} {name:11} alone {r['alone_p99_ms']:8.3f} ms  beside "
                  f"{r['beside_p99_ms']:8.3f} ms  ratio {r['ratio']:6.2f}x "
                  f"(target <= {TARGETS[name]:.0f}x)", flush=True)
    finally:
        neighbour.close()
        service.stop(signal.SIGKILL)  # a lease holder's open may still be in the kernel
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--planes", default="native,python")
    parser.add_argument("--attackers", default=",".join(ATTACKERS))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:K=V,...")
    args = parser.parse_args(argv)
    variants = dict(parse_variant(v) for v in args.variant)
    bad = [p for p in args.planes.split(",") if p not in ("native", "python", *variants)]
    if bad:
        parser.error(f"unknown planes (not native, python or a --variant): {bad}")
    attackers = [a for a in args.attackers.split(",") if a]
    unknown = set(attackers) - set(ATTACKERS)
    if unknown:
        parser.error(f"unknown attackers: {', '.join(sorted(unknown))}")
    base = Path(tempfile.mkdtemp(prefix="fhmon-bench-fair-", dir="/tmp"))
    report: dict[str, Any] = {"reps": args.reps, "calls": args.calls, "variants": variants,
                              "loadavg_before": os.getloadavg(), "planes": {}}
    try:
        world = build_world(base)
        links = build_links(world)
        with lease_break_time(600):
            for plane in args.planes.split(","):
                report["planes"][plane] = run_plane(world, base, plane, attackers, args.reps,
                                                    args.calls, "./" * 2040 + "file", links,
                                                    variants)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report["loadavg_after"] = os.getloadavg()
    planes = list(report["planes"])
    print(f"\nneighbour p99 beside / alone (median of {args.reps} paired ratios, "
          f"{args.calls} calls each); load average {report['loadavg_before'][0]:.1f} -> "
          f"{report['loadavg_after'][0]:.1f}")
    print(f"{'attacker':11} {'target':>7} " + " ".join(f"{p:>16}" for p in planes))
    for name in attackers:
        cells = []
        for p in planes:
            r = report["planes"][p][name]
            cells.append(f"{r['ratio']:5.2f}x ({r['beside_p99_ms']:.2f} ms)")
        print(f"{name:11} {'<= ' + str(int(TARGETS[name])) + 'x':>7} "
              + " ".join(f"{c:>16}" for c in cells))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
