"""fhmon benchmark: the same call mix, side by side in one run.

    python -m bench.run [--quick] [--calls N] [--threads 1,4] [--json OUT]

Configurations, each measured in the same run on the same files:
  kernel        the syscalls called directly by root (the floor)
  fhmon         through fhmon, caller uid 65534, signing on
  fhmon-nosign  through fhmon with signing off (measures what the MAC costs end to end)
plus the cost of signing and of verifying alone, in-process. Reports medians of per-call
latency (p50, p99), calls/s, fhmon CPU per call, and ratios to the kernel. These are
measurements, not assertions: machines here are noisy, so compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FHMON = str(Path(sys.executable).with_name("fhmon"))
SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Monitor:
    def __init__(self, base: Path, name: str, signing: bool) -> None:
        self.dir = base / name
        self.dir.mkdir(mode=0o755)
        self.socket = str(self.dir / "s.sock")
        keys = self.dir / "keys"
        subprocess.run([FHMON, "keygen", "--key-dir", str(keys)], check=True,
                       capture_output=True)
        config = self.dir / "c.toml"
        config.write_text(f"signing = {'true' if signing else 'false'}\n"
                          f'log_level = "warning"\n')
        self.log = open(self.dir / "log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([FHMON, "serve", "--config", str(config), "--socket",
                                      self.socket, "--key-dir", str(keys), "--allow",
                                      str(base / "share")], stdout=self.log, stderr=self.log)
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None:
                raise SystemExit(f"fhmon did not start: {(self.dir / 'log').read_text()}")
            time.sleep(0.02)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=10)
        self.log.close()


def run_target(base: Path, op: str, calls: int, threads: int,
               monitor: Monitor | None) -> dict[str, Any]:
    target = [SYSTEM_PYTHON, str(base / "target.py"), str(base / "share"), op, str(calls),
              str(threads)]
    if monitor is None:
        argv, kwargs = target, {}
    else:
        argv = [FHMON, "launch", "--socket", monitor.socket, "--share", str(base / "share"),
                "--user", "65534", "--", *target]
        kwargs = {}
    cpu0 = cpu_seconds(monitor.proc.pid) if monitor else 0.0
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kwargs)
    cpu1 = cpu_seconds(monitor.proc.pid) if monitor else 0.0
    if out.returncode != 0:
        raise SystemExit(f"target failed: {out.stderr}")
    data = json.loads(out.stdout)
    ns = sorted(data["ns"])
    total = len(ns)
    # fhmon's CPU also covers the start-up name_to_handle_at of each file (64 calls)
    setup_calls = 64 if op != "n2h" else 0
    return {"p50_us": ns[total // 2] / 1000, "p99_us": ns[int(total * 0.99)] / 1000,
            "calls_per_s": total / data["wall"], "errors": data["errors"], "calls": total,
            "cpu_us_per_call": (cpu1 - cpu0) * 1e6 / (total + setup_calls) if monitor
            else None}


def signing_costs(rounds: int) -> dict[str, float]:
    sys.path.insert(0, str(HERE.parent))
    from monitor.signing import KeyRing

    ring = KeyRing({1: os.urandom(32)}, 1)
    share = os.urandom(32)
    kernel_handle = os.urandom(8)
    signed = ring.sign(share, 1, kernel_handle)
    out = {}
    for name, fn in (("sign_us", lambda: ring.sign(share, 1, kernel_handle)),
                     ("verify_us", lambda: ring.verify(share, 1, signed))):
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(rounds):
                fn()
            samples.append((time.perf_counter() - t0) / rounds * 1e6)
        out[name] = statistics.median(samples)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small CI smoke run")
    parser.add_argument("--calls", type=int, default=20000, help="calls per thread")
    parser.add_argument("--threads", default="1,4")
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell (median)")
    parser.add_argument("--json", help="write results here")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench: run as root", file=sys.stderr)
        return 2
    calls = 500 if args.quick else args.calls
    repeat = 1 if args.quick else args.repeat
    threads = [1] if args.quick else [int(t) for t in args.threads.split(",")]
    base = Path(tempfile.mkdtemp(prefix="fhmon-bench-", dir="/tmp"))
    base.chmod(0o755)
    share = base / "share"
    share.mkdir(mode=0o755)
    for i in range(64):
        (share / f"f{i:03d}").write_text(f"file {i}\n")
        (share / f"f{i:03d}").chmod(0o644)
    shutil.copy(HERE / "target.py", base / "target.py")
    (base / "target.py").chmod(0o644)
    monitors = {"fhmon": Monitor(base, "signed", True),
                "fhmon-nosign": Monitor(base, "unsigned", False)}
    results: list[dict[str, Any]] = []
    try:
        for op in ("n2h", "obh", "mix"):
            for n in threads:
                for config in ("kernel", "fhmon", "fhmon-nosign"):
                    runs = [run_target(base, op, calls, n, monitors.get(config))
                            for _ in range(repeat)]
                    cell = {"op": op, "threads": n, "config": config}
                    for key in ("p50_us", "p99_us", "calls_per_s"):
                        cell[key] = statistics.median(r[key] for r in runs)
                    cpu = [r["cpu_us_per_call"] for r in runs if r["cpu_us_per_call"]]
                    cell["cpu_us_per_call"] = statistics.median(cpu) if cpu else None
                    cell["errors"] = runs[-1]["errors"]
                    results.append(cell)
    finally:
        for m in monitors.values():
            m.stop()
        shutil.rmtree(base, ignore_errors=True)
    costs = signing_costs(2000 if args.quick else 20000)
    report = {"machine": {"kernel": platform.release(), "cpus": os.cpu_count(),
                          "python": platform.python_version()},
              "calls_per_thread": calls, "repeat": repeat, "results": results,
              "signing": costs}
    print_table(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    bad = [r for r in results if r["errors"]]
    if bad:
        print(f"bench: calls failed: {bad}", file=sys.stderr)
        return 1
    return 0


def print_table(report: dict[str, Any]) -> None:
    kernel = {(r["op"], r["threads"]): r for r in report["results"] if r["config"] == "kernel"}
    print(f"{'op':<5}{'thr':>4} {'config':<13}{'p50 us':>9}{'p99 us':>9}{'calls/s':>10}"
          f"{'cpu us':>8}{'p50/kern':>10}")
    for r in report["results"]:
        k = kernel[(r["op"], r["threads"])]
        cpu = f"{r['cpu_us_per_call']:.1f}" if r["cpu_us_per_call"] else "-"
        print(f"{r['op']:<5}{r['threads']:>4} {r['config']:<13}{r['p50_us']:>9.1f}"
              f"{r['p99_us']:>9.1f}{r['calls_per_s']:>10.0f}{cpu:>8}"
              f"{r['p50_us'] / k['p50_us']:>10.1f}")
    s = report["signing"]
    print(f"signing alone: sign {s['sign_us']:.2f} us/handle, verify {s['verify_us']:.2f} "
          f"us/handle")


if __name__ == "__main__":
    sys.exit(main())
