"""fhmon benchmark: the kernel, fhmon and fhmon's variants side by side in one run.

    python -m bench.run [--quick | --full] [--repeat N] [--calls N] [--json PATH]
                        [--plot PNG] [--report MD] [--soak CALLS] [--variant NAME:K=V,...]

Cells are (op, target threads, targets, pinning). op, as virtiofsd makes the calls: n2h
(name_to_handle_at on an O_PATH fd with AT_EMPTY_PATH, a LOOKUP), obh (open_by_handle_at)
or mix (1 n2h : 3 obh); n2h-path (a relative path from AT_FDCWD) on request with --ops.
N targets are N processes, each under its own `fhmon launch` (uid 65534), released
together; latency percentiles are over every call of every target, calls/s is all calls
over the wall time from the first start to the last end. Pinned: fhmon (every thread) and
the target's threads on CPU 0, like `taskset -c 0` on both; unpinned: every CPU. Each cell
runs once per configuration:

  kernel        the syscalls called directly by root (the floor)
  refmon        bench/refmon, a minimal Rust monitor (RECV, the kernel's call, HMAC, SEND or
                ADDFD|SEND; no confinement): what fhmon is compared against
  fhmon         through fhmon, signing on, SYNC_WAKE_UP on (the defaults)
  fhmon-nosign  signing = false
  fhmon-nosync  sync_wakeup = false
  fhmon-KEY     every other boolean config key of `fhmon serve --print-config` (a lever
                such as recv_thread) flipped from its default; a worker count too
  (more with --variant NAME:key=value,...)
  NAME          with --build NAME=FHMON: the defaults served by another build's `fhmon`
                executable (say a checkout of the commit before a change: its
                .venv/bin/fhmon), so that two builds are compared in one interleaved run;
                the targets' `fhmon launch` is this checkout's

fhmon CPU per call is the CPU time of fhmon's process tree over a run divided by its calls.
Every cell is repeated (--repeat, configurations interleaved) and the medians reported;
the machine's load average is printed at start and end. These are measurements, never
assertions: the exit status is 0 when every call succeeded.

Modes: --quick (a small smoke run for CI), default (what the issue's targets need: 1
thread pinned and unpinned, 4 threads, 8 targets, every configuration; plus the mix at 16
threads and at 64 targets for the kernel and the signing configurations), --full (ops x
threads 1,4,16 x targets 1,8,64 x pinned/unpinned). --ops/--threads/--targets/--pinning
replace the mode's cells by their product. bench.levers' micro-benchmarks run too (skip
them with --no-levers). --soak N adds N calls against a fresh fhmon, sampling its fd count
and RSS every 50,000 calls. --report MD rewrites the part of MD between
<!-- bench:begin --> and <!-- bench:end --> and draws the plot next to it (MD with .png).

Regenerate docs/performance.md's numbers and plot:

    python -m bench.run --soak 1000000 --report docs/performance.md
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import math
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import levers as levers_mod
from bench import report as rep
from bench.procs import (
    FHMON,
    SYSTEM_PYTHON,
    BenchError,
    Monitor,
    Pool,
    ReferenceMonitor,
    build_refmon,
    loadavg,
    print_config_keys,
    run_once,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OPS = ("n2h", "obh", "mix")
ALL_OPS = (*OPS, "n2h-path")
BASE_CONFIGS: dict[str, dict[str, str]] = {
    "fhmon": {},
    "fhmon-python": {"data_plane": '"python"'},
    "fhmon-nosign": {"signing": "false"},
    "fhmon-nosync": {"sync_wakeup": "false"},
}
REFMON = "refmon"  # bench/refmon: the minimal monitor, fhmon's reference
LIVE_TARGETS = 64  # above this many target processes at once, run configurations in turn


@dataclass(frozen=True)
class Cell:
    op: str
    threads: int
    targets: int
    pinned: bool
    signed_only: bool = False  # only the kernel and the configurations that sign

    def wants(self, config: str, variants: dict[str, dict[str, str]]) -> bool:
        if not self.signed_only or config in ("kernel", REFMON):
            return True
        return variants.get(config, {}).get("signing", "true") == "true" and \
            variants.get(config, {}).get("sync_wakeup", "true") == "true"

    def describe(self) -> str:
        return (f"{self.op} {self.threads} thr x {self.targets} tgt "
                f"{'pinned' if self.pinned else 'unpinned'}")


def mode_cells(mode: str) -> list[Cell]:
    if mode == "quick":
        return [*(Cell(op, 1, 1, False) for op in OPS), Cell("mix", 1, 1, True),
                Cell("mix", 2, 2, False)]
    if mode == "full":
        return [Cell(op, t, n, p) for op, n, t, p in
                itertools.product(OPS, (1, 8, 64), (1, 4, 16), (True, False))]
    return [*(Cell(op, 1, 1, p) for op in OPS for p in (True, False)),
            *(Cell(op, 4, 1, False) for op in OPS),
            *(Cell(op, 1, 8, False) for op in OPS),
            # how the cost grows: the virtiofsd-like mix at 16 threads and at 64 targets
            Cell("mix", 16, 1, False, True), Cell("mix", 1, 64, False, True)]


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """NAME:key=value,key=value (values as TOML: true, 2, "text")."""
    name, sep, rest = text.partition(":")
    if not sep or not name:
        raise SystemExit(f"--variant {text!r}: expected NAME:key=value[,key=value]")
    settings = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"--variant {text!r}: {item!r} is not key=value")
        settings[key.strip()] = value.strip()
    return name, settings


def parse_build(text: str) -> tuple[str, str]:
    """NAME=PATH: PATH an executable `fhmon` (another checkout's .venv/bin/fhmon)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise SystemExit(f"--build {text!r}: expected NAME=PATH of an fhmon executable")
    if not os.access(path, os.X_OK):
        raise SystemExit(f"--build {name}: {path} is not an executable fhmon")
    return name, path


NOT_LEVERS = {"signing", "sync_wakeup", "drop_capabilities"}


def detect_variants(keys: dict[str, str]) -> dict[str, dict[str, str]]:
    """Levers fhmon exposes as config keys beyond signing and sync_wakeup: each boolean
    key flipped from its default (recv_thread = true -> fhmon-recv-thread), and a worker
    count (workers > 1 -> fhmon-workers, or = 1 when more is the default)."""
    out: dict[str, dict[str, str]] = {}
    ncpu = os.cpu_count() or 1
    for key, default in keys.items():
        name = "fhmon-" + key.replace("_", "-")
        if key in NOT_LEVERS:
            continue
        if default in ("true", "false"):
            flipped = "false" if default == "true" else "true"
            out[name if default == "false" else f"fhmon-no-{key.replace('_', '-')}"] = {
                key: flipped}
        elif "worker" in key and default.isdigit():
            if int(default) <= 1:
                out["fhmon-workers"] = {key: str(max(2, ncpu))}
            else:
                out["fhmon-1worker"] = {key: "1"}
    return out


SHARE_KINDS = ("filesystem", "mount")


def make_base(kind: str = "filesystem") -> Path:
    """The bench's tree. The share is a filesystem of its own (a loop-mounted ext4 image),
    as a block-backed PVC is in KubeVirt: fhmon then confines by mount alone. A bind mount
    of a subdirectory, or a plain directory, makes every lookup and every directory open
    walk '..' up to the share root (monitor/policy.py), as a share served from a directory
    does (the e2e guest's): kind "mount" asks for that, and it is the fallback when
    no loop device can be had; the report's machine.share says which one ran."""
    base = Path(tempfile.mkdtemp(prefix="fhmon-bench-", dir="/tmp"))
    base.chmod(0o755)
    share = base / "share"
    share.mkdir(mode=0o755)
    image = base / "share.img"
    if not (kind == "filesystem" and _mount_image(image, share)):
        image.unlink(missing_ok=True)
        subprocess.run(["mount", "--bind", str(share), str(share)], capture_output=True,
                       text=True)
    share.chmod(0o755)
    for i in range(64):
        (share / f"f{i:03d}").write_text(f"file {i}\n")
        (share / f"f{i:03d}").chmod(0o644)
    shutil.copy(HERE / "target.py", base / "target.py")
    (base / "target.py").chmod(0o644)
    (base / "logs").mkdir()
    return base


def _mount_image(image: Path, share: Path) -> bool:
    """A 64 MiB ext4 image made at image and loop-mounted on share; False (and said why on
    stderr) when either step fails."""
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    done = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True)
    if done.returncode == 0:
        done = subprocess.run(["mount", "-o", "loop", str(image), str(share)],
                              capture_output=True, text=True)
    if done.returncode != 0:
        print(f"bench: the share is a bind mount of a directory, not a filesystem of its own "
              f"(loop mount: {done.stderr.strip() or done.returncode}); lookups then pay the "
              f"subtree walk", file=sys.stderr, flush=True)
    return done.returncode == 0


def share_kind(base: Path) -> str:
    """"filesystem" if the bench's share is a filesystem of its own, "mount" if it is a bind
    mount of a directory, else "directory"."""
    if not _is_mount_point(base / "share"):
        return "directory"
    return "filesystem" if (base / "share.img").exists() else "mount"


def _is_mount_point(path: Path) -> bool:
    """From /proc/self/mountinfo: os.path.ismount misses a bind mount within one fs."""
    with open("/proc/self/mountinfo") as mountinfo:
        return any(line.split()[4] == str(path) for line in mountinfo)


def remove_base(base: Path) -> None:
    if _is_mount_point(base / "share"):
        subprocess.run(["umount", "-l", str(base / "share")], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


def per_thread_calls(cell: Cell, calls: int, minimum: int) -> int:
    return max(minimum, math.ceil(calls / (cell.threads * cell.targets)))


def summarize(cell: Cell, config: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"op": cell.op, "threads": cell.threads, "targets": cell.targets,
                           "pinned": cell.pinned, "config": config}
    for key in ("p50_us", "p99_us", "calls_per_s"):
        row[key] = statistics.median(r[key] for r in runs)
    cpu = [r["cpu_us_per_call"] for r in runs if r["cpu_us_per_call"] is not None]
    row["cpu_us_per_call"] = statistics.median(cpu) if cpu else None
    errors: dict[str, int] = {}
    for r in runs:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    row["errors"] = errors
    row["calls_per_run"] = runs[0]["calls"]
    row["other_cpus"] = statistics.median(r["other_cpus"] for r in runs)
    row["runs"] = [{k: r[k] for k in ("p50_us", "p99_us", "calls_per_s", "cpu_us_per_call",
                                      "wall_s", "load1", "other_cpus")} for r in runs]
    return row


def run_matrix(base: Path, cells: list[Cell], configs: list[str],
               variants: dict[str, dict[str, str]], monitors: dict[str, Monitor],
               args: argparse.Namespace) -> list[dict[str, Any]]:
    runs: dict[tuple[Cell, str], list[dict[str, Any]]] = {}

    def one(pool: Pool, cell: Cell, config: str) -> None:
        targets = pool.ensure(cell.targets)
        r = run_once(targets, pool.monitor, cell.op, cell.threads,
                     per_thread_calls(cell, args.calls, args.min_per_thread), cell.pinned,
                     warmup=args.warmup)
        r["load1"] = loadavg()[0]
        runs.setdefault((cell, config), []).append(r)
        print(f"  {cell.describe():<28} {config:<18} p50 {r['p50_us']:8.1f} us  p99 "
              f"{r['p99_us']:8.1f} us  {r['calls_per_s']:9.0f}/s  cpu "
              f"{rep.fmt(r['cpu_us_per_call']):>6} us  others {r['other_cpus']:.2f} CPUs",
              file=sys.stderr, flush=True)

    def pool_for(config: str) -> Pool:
        return Pool(base, monitors.get(config), args.timeout,
                    no_new_privs=args.no_new_privs == "on")

    for count in sorted({c.targets for c in cells}):
        group = [c for c in cells if c.targets == count]
        used = [c for c in configs if any(cell.wants(c, variants) for cell in group)]
        if count * len(used) <= LIVE_TARGETS:
            pools = {config: pool_for(config) for config in used}
            try:
                for cell in group:
                    wanted = [c for c in used if cell.wants(c, variants)]
                    for rep_i in range(args.repeat):
                        shift = rep_i % len(wanted)  # vary the order between repeats
                        for config in wanted[shift:] + wanted[:shift]:
                            one(pools[config], cell, config)
            finally:
                for p in pools.values():
                    p.stop()
        else:
            for config in used:
                pool = pool_for(config)
                try:
                    for cell in group:
                        if cell.wants(config, variants):
                            for _ in range(args.repeat):
                                one(pool, cell, config)
                finally:
                    pool.stop()
    return [summarize(cell, config, runs[(cell, config)]) for cell in cells for config in configs
            if (cell, config) in runs]


def soak(base: Path, total: int, args: argparse.Namespace) -> dict[str, Any]:
    """`total` calls against a fresh fhmon (signing on); its fds and RSS every chunk."""
    monitor = Monitor(base, "soak", {}, base / "share")
    pool = Pool(base, monitor, args.timeout)
    chunk = args.soak_chunk
    threads, ntargets = args.soak_threads, args.soak_targets
    per_thread = max(1, chunk // (threads * ntargets))
    try:
        targets = pool.ensure(ntargets)
        samples = [{"calls": 0, "fds": monitor.fds(), "rss_kib": monitor.rss()}]
        done = 0
        t0 = time.monotonic()
        while done < total:
            r = run_once(targets, monitor, args.soak_op, threads, per_thread, False,
                         warmup=0, latencies=False, fresh=args.soak_churn)
            if r["errors"]:
                raise BenchError(f"soak: calls failed: {r['errors']}")
            done += r["calls"]
            samples.append({"calls": done, "fds": monitor.fds(), "rss_kib": monitor.rss()})
            print(f"  soak {done:>9,} calls: fhmon fds {samples[-1]['fds']}, RSS "
                  f"{samples[-1]['rss_kib'] / 1024:.1f} MiB, {r['calls_per_s']:,.0f}/s",
                  file=sys.stderr, flush=True)
        wall = time.monotonic() - t0
    finally:
        pool.stop()
        monitor.stop()
    after = samples[1:] if len(samples) > 2 else samples
    fds = [s["fds"] for s in after]
    growth = after[-1]["rss_kib"] - after[0]["rss_kib"]
    return {"calls": done, "op": args.soak_op, "threads": threads, "targets": ntargets,
            "config": "fhmon", "churn": args.soak_churn, "wall_s": wall, "samples": samples,
            "fds_first": after[0]["fds"], "fds_last": after[-1]["fds"],
            "fds_range": max(fds) - min(fds), "fds_flat": max(fds) - min(fds) <= 2,
            "rss_first_kib": after[0]["rss_kib"], "rss_last_kib": after[-1]["rss_kib"],
            "rss_growth_kib": growth, "rss_flat": growth <= 1024}


@contextlib.contextmanager
def one_fhmon(name: str, timeout: float,
              profiled: bool = False) -> Iterator[tuple[Path, Monitor, Pool]]:
    """The bench's tree, one fhmon with its defaults (under cProfile, writing base /
    "fhmon.prof", if profiled) and its pool of targets; all stopped and removed after."""
    base = make_base()
    try:
        monitor = Monitor(base, name, {}, base / "share",
                          profile=base / "fhmon.prof" if profiled else None)
        pool = Pool(base, monitor, timeout)
        try:
            yield base, monitor, pool
        finally:
            pool.stop()
            monitor.stop()
    finally:
        remove_base(base)


def profile(op: str, calls: int, args: argparse.Namespace) -> int:
    """fhmon (signing on) under cProfile for `calls` calls of op: where does its time go?"""
    import pstats

    with one_fhmon("profiled", args.timeout, profiled=True) as (base, monitor, pool):
        r = run_once(pool.ensure(1), monitor, op, 1, calls, False, warmup=args.warmup)
        print(f"{op}: p50 {r['p50_us']:.1f} us, fhmon CPU {rep.fmt(r['cpu_us_per_call'])} "
              f"us per call under cProfile (which slows Python calls down)")
        pool.stop()
        monitor.stop()  # cProfile writes its stats as fhmon serve ends
        stats = pstats.Stats(str(base / "fhmon.prof"))
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(25)
    return 0


def cpu_split(op: str, calls: int, args: argparse.Namespace) -> int:
    """fhmon (defaults), pinned like the targets' cells, sampled by perf for `calls` calls of
    op: the share of its CPU in the kernel (by syscall), the interpreter and each library."""
    from bench import cpu_split as split_mod
    from bench.procs import tree

    why_not = split_mod.Recorder.available()
    if why_not:
        print(f"bench --perf: {why_not}", file=sys.stderr)
        return 2
    runs: list[dict[str, Any]] = []
    splits: list[split_mod.Split] = []
    with one_fhmon("perf", args.timeout) as (base, monitor, pool):
        targets = pool.ensure(1)
        run_once(targets, monitor, op, 1, min(calls, 2000), True, warmup=args.warmup)
        fhmon = set(tree(monitor.pid))
        for chains in (False, True):
            recorder = split_mod.Recorder(base / f"perf-{chains}.data", kernel_chains=chains)
            with recorder:
                runs.append(run_once(targets, monitor, op, 1, calls, True,
                                     warmup=args.warmup))
            splits.append(split_mod.parse(recorder.script(), fhmon))
        r = runs[0]
        print(f"{op}, 1 thread, pinned, fhmon with its defaults, {calls} calls under perf: "
              f"p50 {r['p50_us']:.1f} us, fhmon CPU {rep.fmt(r['cpu_us_per_call'])} us per "
              f"call (sampling adds a few us)")
        print(split_mod.render(splits[0], splits[1], (r["calls"], runs[1]["calls"])))
    return 0 if not any(run["errors"] for run in runs) else 1


def machine() -> dict[str, Any]:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    git = "unknown"
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "monitor",
                                "protocol"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
        git = f"{head}{' + uncommitted changes in monitor/ or protocol/' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        pass
    target_python = subprocess.run([SYSTEM_PYTHON, "-c", "import platform;"
                                    "print(platform.python_version())"],
                                   capture_output=True, text=True, timeout=30).stdout.strip()
    return {"kernel": platform.release(), "cpus": os.cpu_count(), "cpu_model": model,
            "python": platform.python_version(), "target_python": target_python, "git": git}


def parse_list(text: str | None, kind: type = int) -> list[Any] | None:
    return None if text is None else [kind(x) for x in text.split(",") if x]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a small CI smoke run")
    mode.add_argument("--full", action="store_true", help="the whole matrix (long)")
    p.add_argument("--repeat", type=int, help="runs per cell, medians reported (default 3)")
    p.add_argument("--calls", type=int, help="calls per run of a cell, over all its threads "
                   "and targets (default 6000; quick 400)")
    p.add_argument("--min-per-thread", type=int, help="at least this many calls per thread "
                   "(default 40)")
    p.add_argument("--warmup", type=int, default=20, help="untimed calls per thread per run")
    p.add_argument("--ops", help="comma list of n2h,obh,mix (with --threads/--targets/"
                   "--pinning: replaces the mode's cells by their product)")
    p.add_argument("--threads", help="comma list of target threads, e.g. 1,4,16")
    p.add_argument("--targets", help="comma list of target counts, e.g. 1,8,64")
    p.add_argument("--pinning", choices=("both", "pinned", "unpinned"))
    p.add_argument("--configs", help="comma list of configurations to run (default all)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:K=V,...",
                   help="another fhmon configuration, e.g. fhmon-w2:workers=2")
    p.add_argument("--build", action="append", default=[], metavar="NAME=FHMON",
                   help="one more configuration: fhmon's defaults served by the `fhmon` "
                        "executable FHMON of another build (before/after a change)")
    p.add_argument("--no-levers", action="store_true", help="skip bench.levers")
    p.add_argument("--no-matrix", action="store_true", help="only levers and/or soak")
    p.add_argument("--soak", type=int, default=0, metavar="CALLS",
                   help="also run CALLS calls against a fresh fhmon, sampling fds and RSS")
    p.add_argument("--soak-chunk", type=int, default=50_000)
    p.add_argument("--soak-threads", type=int, default=4)
    p.add_argument("--soak-targets", type=int, default=2)
    p.add_argument("--soak-op", default="mix", choices=OPS)
    p.add_argument("--soak-churn", action="store_true",
                   help="new target threads for every chunk (default: one thread pool)")
    p.add_argument("--profile", metavar="OP", choices=ALL_OPS,
                   help="no matrix: run --calls calls of OP (1 thread, unpinned) through "
                   "fhmon under cProfile and print where its time goes")
    p.add_argument("--perf", metavar="OP", choices=ALL_OPS,
                   help="no matrix: run --calls calls of OP (1 thread, pinned) through fhmon "
                   "under `perf record` and print its CPU by layer: kernel (by syscall), "
                   "interpreter, libraries (needs linux-perf)")
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for a target")
    p.add_argument("--no-new-privs", choices=("on", "off"), default="on",
                   help="off: the targets' filter is loaded while they are root, and they "
                        "run as uid 65534 without no_new_privs (a container without "
                        "noNewPrivileges); registered by the bench's own HELLO")
    p.add_argument("--share", choices=SHARE_KINDS, default="filesystem",
                   help="filesystem: the share is an ext4 image of its own (confined by "
                        "mount alone); mount: a bind mount of a directory, whose lookups "
                        "pay the subtree walk, as a share served from a directory does")
    p.add_argument("--json", default=str(HERE / "results" / "latest.json"),
                   help="write the results here (default bench/results/latest.json)")
    p.add_argument("--plot", help="draw latency and calls/s against threads into this PNG")
    p.add_argument("--report", help="rewrite the bench section of this markdown file "
                   "(and draw the plot next to it unless --plot says where)")
    p.add_argument("--from-json", help="no run: render --report/--plot from this JSON")
    return p


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)  # stop fhmon and the targets on the way out
    command = "python -m bench.run " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.from_json:
        return render(json.loads(Path(args.from_json).read_text()), args)
    if os.geteuid() != 0:
        print("bench: run as root (fhmon serve and the kernel baseline need it)",
              file=sys.stderr)
        return 2
    if args.profile:
        return profile(args.profile, args.calls or 20000, args)
    if args.perf:
        return cpu_split(args.perf, args.calls or 20000, args)
    mode = "quick" if args.quick else "full" if args.full else "default"
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.calls = args.calls or (400 if args.quick else 6000)
    args.min_per_thread = args.min_per_thread or (50 if args.quick else 40)
    cells = mode_cells(mode)
    if any(x is not None for x in (args.ops, args.threads, args.targets, args.pinning)):
        ops = parse_list(args.ops, str) or sorted({c.op for c in cells}, key=ALL_OPS.index)
        if set(ops) - set(ALL_OPS):
            raise SystemExit(f"--ops: unknown {sorted(set(ops) - set(ALL_OPS))}")
        threads = parse_list(args.threads) or sorted({c.threads for c in cells})
        targets = parse_list(args.targets) or sorted({c.targets for c in cells})
        pinning = {"pinned": [True], "unpinned": [False]}.get(args.pinning or "",
                                                               [True, False])
        cells = [Cell(op, t, n, p) for op, n, t, p in
                 itertools.product(ops, targets, threads, pinning)]
    keys = print_config_keys()
    variants = dict(BASE_CONFIGS)
    variants.update(detect_variants(keys))
    variants.update(parse_variant(v) for v in args.variant)
    for name, settings in variants.items():
        unknown = [k for k in settings if k not in keys]
        if unknown and name in dict(parse_variant(v) for v in args.variant):
            raise SystemExit(f"--variant {name}: fhmon has no config key {unknown}")
    builds = dict(parse_build(b) for b in args.build)
    for name in builds:
        if name in variants or name in ("kernel", REFMON):
            raise SystemExit(f"--build {name}: that name is a configuration already")
        variants[name] = {}
    configs = ["kernel", REFMON, *variants]
    if args.configs:
        wanted = args.configs.split(",")
        configs = [c for c in configs if c in wanted]
    report: dict[str, Any] = {
        "command": command, "mode": mode,
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "machine": machine(), "load_start": loadavg(), "repeat": args.repeat,
        "targets_no_new_privs": args.no_new_privs,
        "calls_per_cell": args.calls, "min_per_thread": args.min_per_thread,
        "configs": {c: variants[c] for c in configs if c in variants}, "results": []}
    what = "no matrix" if args.no_matrix else \
        f"{len(cells)} cells x {len(configs)} configs x {args.repeat}"
    print(f"bench: mode {mode}, {what}; load average {report['load_start']}", file=sys.stderr,
          flush=True)
    base = make_base(args.share)
    report["machine"]["share"] = share_kind(base)
    monitors: dict[str, Monitor] = {}
    status = 0
    try:
        if not args.no_matrix:
            refmon = build_refmon() if REFMON in configs else None
            if refmon is None and REFMON in configs:
                configs.remove(REFMON)
            for name in configs:
                if name == REFMON and refmon is not None:
                    monitors[name] = ReferenceMonitor(base, name, refmon, base / "share")
                elif name != "kernel":
                    monitors[name] = Monitor(base, name, variants[name], base / "share",
                                             executable=builds.get(name, FHMON))
            report["results"] = run_matrix(base, cells, configs, variants, monitors, args)
            report["signing"] = levers_mod.signing_costs(2000 if args.quick else 20000)
        for m in monitors.values():
            m.stop()
        monitors.clear()
        if not args.no_levers:
            print("bench: levers", file=sys.stderr, flush=True)
            report["levers"] = levers_mod.measure(args.quick, args.repeat)
        if args.soak:
            print(f"bench: soak, {args.soak:,} calls", file=sys.stderr, flush=True)
            report["soak"] = soak(base, args.soak, args)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        status = 1
    finally:
        for m in monitors.values():
            m.stop()
        remove_base(base)
    report["load_end"] = loadavg()
    bad = [r for r in report["results"] if r["errors"]]
    if bad:
        print(f"bench: calls failed: {[(r['config'], r['op'], r['errors']) for r in bad]}",
              file=sys.stderr)
        status = 1
    return render(report, args) or status


def render(report: dict[str, Any], args: argparse.Namespace) -> int:
    if report.get("results"):
        rep.print_table(report)
    if report.get("levers"):
        levers_mod.print_levers(report["levers"])
    print(f"load average: start {report['load_start']}, end {report['load_end']}")
    print("targets:")
    rep.print_verdicts(report)
    if args.json and not args.from_json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1))
        print(f"bench: results in {path}")
    plot_path = Path(args.plot) if args.plot else None
    if plot_path is None and args.report:
        plot_path = Path(args.report).with_suffix(".png")
    if not report.get("results"):
        plot_path = None  # nothing to draw
    if plot_path is not None:
        try:
            rep.plot(report, plot_path)
            print(f"bench: plot in {plot_path}")
        except ImportError:
            print("bench: matplotlib is missing: pip install matplotlib", file=sys.stderr)
            plot_path = None
    if args.report:
        md = Path(args.report)
        name = None
        if plot_path is not None:
            name = os.path.relpath(plot_path, md.parent)
        rep.write_section(md, rep.markdown(report, name))
        print(f"bench: wrote the bench section of {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
