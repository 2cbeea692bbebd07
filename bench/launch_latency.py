"""Launch to first answered call: how long a VM pod's virtiofsd waits for fhmon at start.

    python -m bench.launch_latency [--launches 200] [--build NAME=FHMON ...] [--json OUT]

Each launch runs the native launcher as KubeVirt's injected container does (`fhmon-launch
launch --fail-open --virtiofsd-handles=prefer`, CMD as uid 65534) with a real `fhmon serve`
on its defaults, and CMD a small C program (compiled here with cc) that calls
name_to_handle_at on the share as soon as it runs and prints CLOCK_MONOTONIC once the call
is answered (then open_by_handle_at, which only fhmon can answer for uid 65534, so a launch
that fell back fails). The figure is that time minus the moment just before the launcher's
spawn: the launcher's start, its registration (HELLO to ACCEPT), its start-up probe, the
exec of CMD and the first answer. `direct` is the same program run as uid 65534 without the
launcher (the kernel answers n2h itself): the spawn and exec alone.

Two conditions, interleaved in blocks of --block launches so that the host's noise weighs
on both:
  quiet   nothing else runs
  loaded  a neighbour target under each fhmon of the run calls n2h on 2 threads without
          pause, and one busy process per CPU spins beside
--build NAME=FHMON adds another build's `fhmon serve` (e.g. a worktree's .venv/bin/fhmon),
launched in turn with this checkout's, launch by launch (the launcher is this checkout's).
Prints p50, p90, p99 and max for each; the goal (issue 36) is p99 under 50 ms loaded.
Root only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.procs import FHMON, Monitor, compile_c, loadavg
from monitor import launcher

NOBODY = 65534
TARGET_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
    struct file_handle *fh = malloc(sizeof *fh + 128);
    int mount_id, dir, fd;
    long long answered;
    if (argc < 2 || fh == NULL) return 2;
    fh->handle_bytes = 128;
    if (name_to_handle_at(AT_FDCWD, argv[1], fh, &mount_id, 0) != 0) { perror("n2h"); return 3; }
    answered = now_ns();
    if (argc > 2 && argv[2][0] == 'd') { printf("%lld\n", answered); return 0; }
    dir = open(argv[1], O_RDONLY | O_DIRECTORY);
    fd = open_by_handle_at(dir, fh, O_RDONLY | O_DIRECTORY);
    if (fd < 0) { perror("obh"); return 4; }
    printf("%lld\n", answered);
    return 0;
}
"""

# the neighbour: n2h on 2 threads until killed (ctypes, the share given as argv[1])
NEIGHBOUR_PY = r"""
import ctypes, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
path = sys.argv[1].encode()
def spin():
    buf = ctypes.create_string_buffer(8 + 128)
    ctypes.memmove(buf, (128).to_bytes(4, "little"), 4)
    mount = ctypes.c_int()
    while True:
        libc.name_to_handle_at(-100, path, buf, ctypes.byref(mount), 0)
threading.Thread(target=spin, daemon=True).start()
spin()
"""


def compile_target(dest: Path) -> Path:
    source = dest / "first_call.c"
    source.write_text(TARGET_C)
    return compile_c(source, dest / "first_call", "bench.launch_latency")


def as_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def one_launch(argv: list[str], direct: bool) -> float:
    """ms from just before the spawn to the first answered call."""
    start = time.monotonic_ns()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          preexec_fn=as_nobody if direct else None)
    if done.returncode != 0 or "without fhmon" in done.stderr:
        raise RuntimeError(f"{argv[0]} exited {done.returncode}: {done.stderr!r}")
    return (int(done.stdout.split()[0]) - start) / 1e6


@contextlib.contextmanager
def load(launches: list[list[str]], share: Path) -> Iterator[None]:
    """A neighbour target under each fhmon and one spinner per CPU, for the block."""
    procs = [subprocess.Popen([*launch, "--", sys.executable, "-c", NEIGHBOUR_PY, str(share)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True) for launch in launches]
    procs += [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                               start_new_session=True)
              for _ in range(len(os.sched_getaffinity(0)))]
    time.sleep(1.0)  # the neighbours registered and calling
    try:
        yield
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def summary(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    cuts = statistics.quantiles(ordered, n=100, method="inclusive")
    return {"p50": round(statistics.median(ordered), 2), "p90": round(cuts[89], 2),
            "p99": round(cuts[98], 2), "max": round(ordered[-1], 2), "n": len(ordered)}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.launch_latency")
    parser.add_argument("--launches", type=int, default=200)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--build", action="append", default=[], metavar="NAME=FHMON",
                        help="another build's fhmon, served beside this checkout's")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    builds = {"fhmon": FHMON, **dict(b.split("=", 1) for b in args.build)}
    base = Path(tempfile.mkdtemp(prefix="fhmon-bench-launch-"))
    base.chmod(0o755)
    share = base / "share"
    share.mkdir(mode=0o755)
    target = compile_target(base)
    shutil.copy2(launcher.NATIVE_LAUNCHER, base / "fhmon-launch")
    monitors: dict[str, Monitor] = {}
    times: dict[str, list[float]] = {"direct": []}
    load_seen: list[float] = []
    try:
        for name, executable in builds.items():
            monitors[name] = Monitor(base, name, {}, share, executable=executable)
        launch = {name: [str(base / "fhmon-launch"), "launch", "--socket", m.socket,
                         "--share", str(share), "--user", f"{NOBODY}:{NOBODY}",
                         "--fail-open", "--virtiofsd-handles=prefer"]
                  for name, m in monitors.items()}
        for name in monitors:
            times[f"{name} quiet"], times[f"{name} loaded"] = [], []
        done = 0
        while done < args.launches:
            block = min(args.block, args.launches - done)
            for _ in range(block):
                times["direct"].append(one_launch([str(target), str(share), "direct"], True))
                for name, argv in launch.items():
                    times[f"{name} quiet"].append(
                        one_launch([*argv, "--", str(target), str(share)], False))
            with load(list(launch.values()), share):
                for _ in range(block):
                    for name, argv in launch.items():
                        times[f"{name} loaded"].append(
                            one_launch([*argv, "--", str(target), str(share)], False))
                load_seen.append(loadavg()[0])
            done += block
    finally:
        for m in monitors.values():
            m.stop()
        shutil.rmtree(base, ignore_errors=True)
    result: dict[str, Any] = {name: summary(ms) for name, ms in times.items()}
    result["loadavg_loaded"] = [min(load_seen), max(load_seen)]
    width = max(len(name) for name in times)
    print(f"{'':<{width}} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}  "
          f"(ms, {args.launches} each; load {min(load_seen):.1f}-{max(load_seen):.1f})")
    for name in times:
        s = result[name]
        print(f"{name:<{width}} {s['p50']:>8.2f} {s['p90']:>8.2f} {s['p99']:>8.2f} "
              f"{s['max']:>8.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps({**result, "raw": times}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    raise SystemExit(main())
