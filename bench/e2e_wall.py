"""The real guest workload's wall time: root virtiofsd with file handles against fhmon.

    python -m bench.e2e_wall [--rounds 3] [--arms root,fhmon,fhmon-workers1]
                             [--mode prefer] [--json OUT]

The target: the guest workload of tests/e2e (an unmodified virtiofsd 1.13.2 serving a QEMU
guest that boots, creates, appends, reads back, stats, renames, links, chmods, unlinks,
lists and checksums a tree, then drops its caches and walks it again) within 1.1x of root
virtiofsd's wall time. Each round runs every arm once, in an order that rotates from round
to round (so that drift of the machine's load weighs on every arm), with the same
virtiofsd command line (--inode-file-handles=MODE, --sandbox=none):

  root            virtiofsd as root: the kernel's own file handles
  fhmon           virtiofsd as uid 65534 under `fhmon launch`, `fhmon serve` with its
                  defaults (the native data plane in fhmon serve)
  fhmon-workers1  the same with `workers = 1` (the native plane in one worker process)

The VM wall time is QEMU's, from its start to its exit (the guest powers off at the end of
the workload); reported: each arm's median over the rounds, the ratio of medians to root's,
and the median of the per-round ratios. A run whose workload fails is reported and left out.
QEMU uses KVM where it can, TCG otherwise (slow and noisy: note the load average printed).
Measurements, never assertions (tests/e2e asserts the workload's outcome). Root only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from tests.e2e import harness

ARMS = {"root": None, "fhmon": "", "fhmon-workers1": "workers = 1\n",
        "fhmon-t1": "data_plane_threads = 1\n"}


def run_arm(env: harness.Env, arm: str, mode: str, config_dir: Path) -> dict[str, Any]:
    extra = ARMS[arm]
    if extra is None:
        with harness.run_dir(0) as rd:
            res = harness.run_scenario(env, rd, mode=mode, uid=0)
        served = None
    else:
        config = config_dir / f"{arm}.toml"
        config.write_text(extra)
        config.chmod(0o644)
        with harness.run_dir(harness.NOBODY) as rd:
            with harness.fhmon_service(rd, serve_args=["--config", str(config)]) as svc:
                res = harness.run_scenario(env, rd, mode=mode, uid=harness.NOBODY,
                                           wrapper=svc.wrapper(rd.share, harness.NOBODY))
            shutdown = svc.shutdown_event() or {}
        served = shutdown.get("counters", {})
    ok = res.workload_passed and res.host_check_passed and res.qemu_rc == 0
    return {"arm": arm, "ok": ok, "accel": res.accel, "vm_s": res.timings.get("qemu_s"),
            "total_s": res.timings.get("total_s"), "timings": res.timings,
            "fhmon_counters": served, "summary": None if ok else res.summary()[-3000:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--arms", default="root,fhmon")
    parser.add_argument("--mode", default="prefer", choices=("prefer", "mandatory"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    if set(arms) - set(ARMS) or "root" not in arms:
        parser.error(f"arms from {', '.join(ARMS)}, root among them")
    env = harness.ensure_env()
    accel = harness.accelerator(env)
    report: dict[str, Any] = {"accel": accel, "mode": args.mode, "rounds": args.rounds,
                              "loadavg_before": os.getloadavg(), "runs": []}
    print(f"e2e wall: {args.rounds} rounds of {', '.join(arms)}, accel {accel}, load "
          f"{report['loadavg_before'][0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="fhmon-bench-e2e-") as tmp:
        for i in range(args.rounds):
            order = arms[i % len(arms):] + arms[:i % len(arms)]
            for arm in order:
                r = run_arm(env, arm, args.mode, Path(tmp))
                r["round"] = i
                r["loadavg"] = os.getloadavg()[0]
                report["runs"].append(r)
                print(f"  round {i + 1} {arm:15} VM {r['vm_s']} s, total {r['total_s']} s"
                      f"{'' if r['ok'] else '  FAILED: ' + str(r['summary'])[:400]} "
                      f"(load {r['loadavg']:.2f})", flush=True)
    report["loadavg_after"] = os.getloadavg()
    report["summary"] = summarize(report["runs"], arms)
    for arm, s in report["summary"].items():
        line = f"{arm:15} median VM {s['median_vm_s']} s over {s['runs']} runs"
        if arm != "root":
            line += (f": {s['ratio_of_medians']}x root's (median of per-round ratios "
                     f"{s['median_round_ratio']}x; target <= 1.1x)")
        print(line)
    print(f"load average {report['loadavg_before'][0]:.2f} -> "
          f"{report['loadavg_after'][0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(r["ok"] for r in report["runs"]) else 1


def summarize(runs: list[dict[str, Any]], arms: list[str]) -> dict[str, dict[str, Any]]:
    good = [r for r in runs if r["ok"] and r["vm_s"] is not None]
    by_round: dict[int, dict[str, float]] = {}
    for r in good:
        by_round.setdefault(r["round"], {})[r["arm"]] = r["vm_s"]
    out: dict[str, dict[str, Any]] = {}
    root = statistics.median(r["vm_s"] for r in good if r["arm"] == "root") if any(
        r["arm"] == "root" for r in good) else None
    for arm in arms:
        times = [r["vm_s"] for r in good if r["arm"] == arm]
        if not times:
            out[arm] = {"runs": 0, "median_vm_s": None}
            continue
        med = statistics.median(times)
        entry: dict[str, Any] = {"runs": len(times), "median_vm_s": round(med, 2),
                                 "vm_s": times}
        if arm != "root" and root:
            ratios = [t[arm] / t["root"] for t in by_round.values() if arm in t and "root" in t]
            entry["ratio_of_medians"] = round(med / root, 3)
            entry["median_round_ratio"] = (round(statistics.median(ratios), 3) if ratios
                                           else None)
        out[arm] = entry
    return out


if __name__ == "__main__":
    raise SystemExit(main())
