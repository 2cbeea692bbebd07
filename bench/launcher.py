"""What the launcher costs a VM pod: disk, memory beside the command, and start-up time.

    python -m bench.launcher [--runs 30] [--json OUT]

For each launcher, as `fhmon install-launcher` installs it and as KubeVirt's
injected container runs it (`--fail-open --virtiofsd-handles=prefer`, registered with a
real `fhmon serve`, CMD as uid 65534):

  disk     bytes in the launcher directory (the emptyDir the init container fills)
  RSS/PSS  the launcher's resident and proportional set while CMD (`sleep`) runs: what it
           adds to the virtiofs container's memory cgroup beside virtiofsd
  start    median wall time of the launcher running /bin/true, minus that of /bin/true run
           directly: exec to CMD's exec (registration with fhmon and the start-up probe
           included) plus the few microseconds from CMD's exit to the launcher's

Launchers: `native` (monitor/_bin/fhmon-launch, one static file: what pods run) and `cli`
(`fhmon launch`: CPython's argparse, then exec of the native one). The CPython bundle the
native launcher replaced (monitor/kubevirt/bundle.py, removed since) was measured by this
benchmark in the same runs before it went; its figures are in docs/performance.md. Runs are
interleaved (one of each in turn) so that a busy machine weighs on all alike. Root only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.procs import FHMON, Monitor, loadavg
from monitor import launcher

NOBODY = "65534"


def tree_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def install_native(dest: Path) -> list[str]:
    dest.mkdir()
    shutil.copy2(launcher.NATIVE_LAUNCHER, dest / "fhmon-launch")
    return [str(dest / "fhmon-launch"), "launch"]


def memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process, KiB."""
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    fields = {line.split(":")[0]: int(line.split()[1]) for line in rollup[1:] if ":" in line}
    return fields["Rss"], fields["Pss"]


def resident(prefix: list[str], options: list[str]) -> tuple[int, int]:
    """The launcher's memory once CMD runs (the launcher stays its parent)."""
    # sh ignores the --inode-file-handles=prefer the launcher appends (sleep would not)
    proc = subprocess.Popen([*prefix, *options, "--", "sh", "-c", "exec sleep 600", "sh"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            if children and Path(f"/proc/{children[0]}/cmdline").read_bytes().startswith(
                    b"sleep\0"):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{prefix[0]} did not start sleep")
            time.sleep(0.01)
        time.sleep(0.2)  # settled
        return memory_kib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        assert proc.stderr is not None
        proc.stderr.close()


def run_once(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {done.returncode}: {done.stderr!r}")
    if b"without fhmon" in done.stderr:
        raise RuntimeError(f"{argv[0]} fell back: {done.stderr!r}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.launcher")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fhmon-bench-launcher-"))
    base.chmod(0o755)
    share = base / "share"
    share.mkdir(mode=0o755)
    monitor = Monitor(base, "launcher", {}, share)
    load_before = loadavg()
    try:
        options = ["--socket", monitor.socket, "--share", str(share), "--user", NOBODY,
                   "--fail-open", "--virtiofsd-handles=prefer"]
        launchers: dict[str, list[str]] = {"native": install_native(base / "native")}
        disk = {"native": tree_size(base / "native")}
        launchers["cli"] = [FHMON, "launch"]
        memory = {name: resident(prefix, options) for name, prefix in launchers.items()}
        times: dict[str, list[float]] = {name: [] for name in [*launchers, "direct"]}
        for _ in range(args.runs):
            times["direct"].append(run_once(["/bin/true"]))
            for name, prefix in launchers.items():
                times[name].append(run_once([*prefix, *options, "--", "/bin/true"]))
    finally:
        monitor.stop()
        shutil.rmtree(base, ignore_errors=True)
    direct = statistics.median(times["direct"])
    result: dict[str, Any] = {"runs": args.runs, "loadavg": [load_before, loadavg()],
                              "direct_true_ms": round(direct * 1000, 3), "launchers": {}}
    print(f"{'launcher':<8} {'disk':>10} {'RSS':>9} {'PSS':>9} {'start (ms)':>11} "
          f"{'p90 (ms)':>9}")
    for name in launchers:
        rss, pss = memory[name]
        start_ms = (statistics.median(times[name]) - direct) * 1000
        p90_ms = (statistics.quantiles(times[name], n=10)[-1] - direct) * 1000
        size = disk.get(name)
        result["launchers"][name] = {"disk_bytes": size, "rss_kib": rss, "pss_kib": pss,
                                     "start_ms": round(start_ms, 3),
                                     "start_p90_ms": round(p90_ms, 3)}
        shown = f"{size / 1e6:.2f} MB" if size is not None else "-"
        print(f"{name:<8} {shown:>10} {rss / 1024:>5.2f} MiB {pss / 1024:>5.2f} MiB "
              f"{start_ms:>11.2f} {p90_ms:>9.2f}")
    print(f"(/bin/true alone: {direct * 1000:.2f} ms; median of {args.runs}; load "
          f"{load_before[0]:.2f} -> {result['loadavg'][1][0]:.2f})")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    raise SystemExit(main())
